import { Schema } from "effect"

/**
 * OpenAI's transcriptions (`POST /v1/audio/transcriptions`): the request an app takes and the
 * answer it gives. The gateway reads OpenAI's multipart upload into a `TranscriptionRequest` whose
 * `file` is the audio as a `data:` URL, and writes the app's `Transcription` in the
 * `response_format` asked for. An app whose request is `TranscriptionRequest` and whose `serve`
 * answers a `SpeechRecognitionTask`'s output is a transcriptions app.
 */

const optionalNullable = <S extends Schema.Schema.Any>(schema: S) => Schema.optional(Schema.NullOr(schema))

export const TranscriptionFormat = Schema.Literal("json", "text", "verbose_json", "srt", "vtt")
export type TranscriptionFormat = typeof TranscriptionFormat.Type

export const TranscriptionRequest = Schema.Struct({
  /** The audio: a `data:` URL (an uploaded file becomes one) or an http(s) URL; wav, mp3, ogg, flac, m4a, webm. */
  file: Schema.String,
  /** The model asked for; an app answers with the model its task serves. */
  model: optionalNullable(Schema.String),
  /** The spoken language, as a code ("en") or name ("english"); default English. Multilingual models only. */
  language: optionalNullable(Schema.String),
  /** How the gateway writes the answer; the app's answer is the same whatever it is. */
  response_format: optionalNullable(TranscriptionFormat),
  /** Only 0 (greedy decoding, OpenAI's default) is implemented; another value is refused. */
  temperature: optionalNullable(Schema.Number),
  /** `segment` gives the answer's segments (timestamps); `word` is not implemented. */
  timestamp_granularities: optionalNullable(Schema.Array(Schema.Literal("segment", "word"))),
  /**
   * Long audio is cut in windows of this many seconds (at most 30), overlapping by
   * `stride_length_s` on each side (default a sixth of the window), whose texts are stitched
   * (transformers.js's `chunk_length_s`). By default a clip over 30 s is cut in 30 s windows, and a
   * shorter one is one window.
   */
  chunk_length_s: optionalNullable(Schema.Number),
  stride_length_s: optionalNullable(Schema.Number),
  /** "translate" gives English text from speech in another language; multilingual models only. */
  task: optionalNullable(Schema.Literal("transcribe", "translate"))
}).annotations({ identifier: "TranscriptionRequest" })
export type TranscriptionRequest = typeof TranscriptionRequest.Type

/** A stretch of the transcript between two timestamps, in seconds; `end` is null where the model wrote none. */
export const TranscriptionSegment = Schema.Struct({
  id: Schema.Int,
  start: Schema.Number,
  end: Schema.NullOr(Schema.Number),
  text: Schema.String
}).annotations({ identifier: "TranscriptionSegment" })
export type TranscriptionSegment = typeof TranscriptionSegment.Type

/** OpenAI's `verbose_json` transcription; `json` is its `text` alone. */
export const Transcription = Schema.Struct({
  task: Schema.Literal("transcribe", "translate"),
  language: Schema.String,
  /** The audio's length in seconds. */
  duration: Schema.Number,
  text: Schema.String,
  /** With `timestamp_granularities: ["segment"]` (or `verbose_json`, `srt`, `vtt`). */
  segments: Schema.optional(Schema.Array(TranscriptionSegment))
}).annotations({ identifier: "Transcription" })
export type Transcription = typeof Transcription.Type
