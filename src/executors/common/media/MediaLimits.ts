import { Effect, Schema } from "effect"
import { MediaError } from "./errors.js"

/**
 * How much decoding one media item may cost an executor. Each is checked from the item's header,
 * before its pixels or samples are decoded, and refused (413) beyond; each is a flag of
 * `cornserve internal executor`.
 */
export const MediaLimits = Schema.Struct({
  /** Pixels of one image, or of all the frames of an animated image together. */
  maxImagePixels: Schema.Int.pipe(Schema.positive()),
  /** Frames an animated image may have; a few of them are sampled, but reaching a frame decodes those before it. */
  maxAnimationFrames: Schema.Int.pipe(Schema.positive()),
  /** Seconds of one audio clip, which resampling to the model's rate turns into samples. */
  maxAudioSeconds: Schema.Number.pipe(Schema.positive()),
  // The two below are optional in an executor's config: without them it takes the defaults.
  /** Seconds of one video container (mp4, webm, mov), read from its header. */
  maxVideoSeconds: Schema.optional(Schema.Number.pipe(Schema.positive())),
  /** Frames of one video container, counted from its packets: decoding the last sampled frame decodes those before it. */
  maxVideoFrames: Schema.optional(Schema.Int.pipe(Schema.positive()))
})
/** The limits as decoding reads them: every one set. */
export type MediaLimits = {
  readonly [K in keyof typeof MediaLimits.Type]-?: Exclude<(typeof MediaLimits.Type)[K], undefined>
}

export const defaultMediaLimits: MediaLimits = {
  maxImagePixels: 64 * 1024 * 1024,
  maxAnimationFrames: 1024,
  maxAudioSeconds: 600,
  maxVideoSeconds: 600,
  maxVideoFrames: 4096
}

/** The limits an executor was started with; those it was not given are the defaults. */
export const mediaLimitsOf = (config: typeof MediaLimits.Type): MediaLimits => ({
  maxImagePixels: config.maxImagePixels,
  maxAnimationFrames: config.maxAnimationFrames,
  maxAudioSeconds: config.maxAudioSeconds,
  maxVideoSeconds: config.maxVideoSeconds ?? defaultMediaLimits.maxVideoSeconds,
  maxVideoFrames: config.maxVideoFrames ?? defaultMediaLimits.maxVideoFrames
})

/** Media items one request may carry; each is fetched and decoded, so they are counted before any is. */
export const defaultMaxMediaItems = 16

export const checkMediaItemCount = (count: number, maxMediaItems: number): Effect.Effect<void, MediaError> =>
  count > maxMediaItems
    ? Effect.fail(
        new MediaError({
          message: `the request has ${count} media items; this executor takes at most ${maxMediaItems} in one request`
        })
      )
    : Effect.void
