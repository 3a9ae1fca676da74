import * as Effect from "effect/Effect"
import * as Schema from "effect/Schema"
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

/**
 * What the ffmpeg and ffprobe children that decode media may take (MediaProcess.ts), whatever the
 * input: a header can lie about a stream's frame size, and its decoding allocates what the stream
 * itself says.
 */
export const mediaProcessBounds = {
  /**
   * Children at once per preprocessing thread (a router has `--preprocess-threads` of them); the
   * others wait their turn.
   */
  perThread: 1,
  /**
   * Address space of one child. Measured with the packaged ffmpeg (4.x) decoding two sampled frames
   * to RGB with two decoder threads: 1080p needs under 192 MiB, 4K UHD under 384 MiB, 8K UHD
   * (7680×4320) under 768 MiB; 8192×8192 frames need 1.2 GiB and are refused. ffprobe needs under
   * 96 MiB.
   */
  addressSpaceBytes: 1024 * 1024 * 1024,
  /** Decoder threads of one child: ffmpeg's default, one per core, holds a frame per thread. */
  decoderThreads: 2
} as const

/**
 * About what decoding a video's frames of `width`×`height` to RGB takes a child, from the
 * measurements above rounded up: 96 MiB of its own and 20 bytes a pixel (8K UHD: 729 MiB). A video
 * whose header declares more than a child may take is refused before it is decoded.
 */
export const videoDecodeBytes = (width: number, height: number): number => 96 * 1024 * 1024 + 20 * width * height

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
