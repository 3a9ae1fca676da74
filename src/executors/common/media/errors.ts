import * as Schema from "effect/Schema"

/**
 * Why a request's media could not be used. Schema classes, so that a failure in a preprocessing
 * thread reaches the router as the same class.
 */

/** Unreadable, refused (a private address, a file outside the media root) or undecodable. */
export class MediaError extends Schema.TaggedError<MediaError>()("MediaError", { message: Schema.String }) {}

/** Over the executor's byte limit, or an image over its pixel limit. */
export class MediaTooLarge extends Schema.TaggedError<MediaTooLarge>()("MediaTooLarge", { message: Schema.String }) {}

/** What preprocessing media can fail with, as it crosses from a thread to the router. */
export const MediaFailure = Schema.Union(MediaError, MediaTooLarge)
export type MediaFailure = typeof MediaFailure.Type
