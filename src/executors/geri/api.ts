import * as Schema from "effect/Schema"
import { DataId } from "../common/DataId.js"

/**
 * Geri's HTTP API, shared by the executor and the task dispatcher.
 *
 * `POST /generate` takes prompt embeddings from the sidecar (every chunk of each id named, in
 * order, concatenated) and generates: an image model answers `{ image: <PNG, base64>, ... }`; an
 * audio model streams NDJSON lines `{ chunk, audio: <PCM16 LE, base64>, sampleRate }` ending with
 * `{ done: true, ... }`, or with `stream: false` answers one WAV file. A failure after the stream
 * started ends it with one `{ error: { code, message } }` line.
 */
export const GenerateRequest = Schema.Struct({
  embeddings: Schema.Union(DataId, Schema.NonEmptyArray(DataId)),
  /** Leading prompt positions to ignore (a fixed system prompt, say). */
  skipTokens: Schema.optionalWith(Schema.Int.pipe(Schema.nonNegative()), { default: () => 0 }),
  /** Image size; the model's own when left out. */
  height: Schema.optional(Schema.Int.pipe(Schema.between(8, 4096))),
  width: Schema.optional(Schema.Int.pipe(Schema.between(8, 4096))),
  /**
   * The noise a generator with a `noise` input starts from: the same seed gives the same output.
   * Left out, every request draws its own. A generator without that input is deterministic.
   */
  seed: Schema.optional(Schema.Int),
  /** Audio: how many chunks to stream (the model's default number of its own chunks when left out). */
  chunks: Schema.optional(Schema.Int.pipe(Schema.between(1, 10_000))),
  /** Audio: samples per streamed chunk (the model's own chunk size when left out). */
  chunkSize: Schema.optional(Schema.Int.pipe(Schema.between(1, 1_048_576))),
  stream: Schema.optionalWith(Schema.Boolean, { default: () => true })
})
export type GenerateRequest = typeof GenerateRequest.Type

export const ImageAnswer = Schema.Struct({
  image: Schema.String,
  width: Schema.Int,
  height: Schema.Int,
  mimeType: Schema.Literal("image/png")
})
export type ImageAnswer = typeof ImageAnswer.Type

export const AudioChunkLine = Schema.Struct({ chunk: Schema.Int, audio: Schema.String, sampleRate: Schema.Int })
export type AudioChunkLine = typeof AudioChunkLine.Type
export const AudioDoneLine = Schema.Struct({ done: Schema.Literal(true), chunks: Schema.Int, sampleRate: Schema.Int })
export type AudioDoneLine = typeof AudioDoneLine.Type

/**
 * `POST /speech` on a text-to-speech model (SpeechT5): the text, spoken in a voice the model ships
 * or with a speaker embedding given by URL, streamed as the `/generate` audio lines are (or one WAV
 * file with `stream: false`).
 */
export const SynthesisRequest = Schema.Struct({
  text: Schema.String.pipe(Schema.minLength(1), Schema.maxLength(4096)),
  /** A voice in the model's voices/ folder; its first voice when neither this nor `speakerEmbedding` is given. */
  voice: Schema.optional(Schema.String.pipe(Schema.maxLength(100))),
  /** An http(s) or `data:` URL of the speaker embedding's little-endian float32 values. */
  speakerEmbedding: Schema.optional(Schema.String),
  /** Spectrogram frames in the first streamed chunk (smaller: sooner audio). */
  firstChunkFrames: Schema.optional(Schema.Int.pipe(Schema.between(1, 4096))),
  /** Frames in the second chunk; the next ones double up to maxChunkFrames (larger: less vocoding done twice). */
  chunkFrames: Schema.optional(Schema.Int.pipe(Schema.between(1, 65536))),
  maxChunkFrames: Schema.optional(Schema.Int.pipe(Schema.between(1, 65536))),
  stream: Schema.optionalWith(Schema.Boolean, { default: () => true })
})
export type SynthesisRequest = typeof SynthesisRequest.Type

/**
 * `POST /codes` on a neural audio codec (Mimi): its codes, one row per codebook (the semantic ones
 * first), each a code per frame, decoded to audio streamed as the `/generate` audio lines are (or
 * one WAV file with `stream: false`).
 */
export const CodesRequest = Schema.Struct({
  codes: Schema.Array(Schema.Array(Schema.Int).pipe(Schema.minItems(1))).pipe(Schema.minItems(1)),
  /** Frames in the first chunk (smaller: sooner audio); 5 when left out. */
  firstChunkFrames: Schema.optional(Schema.Int.pipe(Schema.between(1, 4096))),
  /** Frames in the second chunk (40); the next ones double up to maxChunkFrames (200) (larger: less context decoded twice). */
  chunkFrames: Schema.optional(Schema.Int.pipe(Schema.between(1, 4096))),
  maxChunkFrames: Schema.optional(Schema.Int.pipe(Schema.between(1, 4096))),
  /** Frames before each chunk decoded with it and thrown away (the model's reach, at most 25, when left out). */
  contextFrames: Schema.optional(Schema.Int.pipe(Schema.between(0, 4096))),
  /** Frames before this one are context only (a stream decoded piece by piece sends them before its piece); 0 when left out. */
  startFrame: Schema.optional(Schema.Int.pipe(Schema.between(0, 7499))),
  stream: Schema.optionalWith(Schema.Boolean, { default: () => true })
})
export type CodesRequest = typeof CodesRequest.Type
