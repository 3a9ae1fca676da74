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
  maxAudioSeconds: Schema.Number.pipe(Schema.positive())
})
export type MediaLimits = typeof MediaLimits.Type

/** The limits an executor was started with. */
export const mediaLimitsOf = (config: MediaLimits): MediaLimits => ({
  maxImagePixels: config.maxImagePixels,
  maxAnimationFrames: config.maxAnimationFrames,
  maxAudioSeconds: config.maxAudioSeconds
})

export const defaultMediaLimits: MediaLimits = {
  maxImagePixels: 64 * 1024 * 1024,
  maxAnimationFrames: 1024,
  maxAudioSeconds: 600
}

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
