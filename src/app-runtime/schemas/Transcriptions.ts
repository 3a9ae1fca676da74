import * as Schema from "effect/Schema"

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

/** The shortest window long audio may be cut in, in seconds. */
export const minChunkSeconds = 1
/** The longest: Whisper's encoder reads 30 s. */
export const maxChunkSeconds = 30
/**
 * The least a window starts after the one before, as a share of its length. Windows of `chunk`
 * seconds overlapping by `stride` on each side start `chunk - 2 * stride` apart, so the stride is at
 * most 3/8 of the chunk, and a clip of d seconds is at most 1 + 4·d / chunk windows.
 */
export const minWindowStep = 1 / 4

/** Why a request's windows cannot cut audio: the field at fault, and what is wrong with it. */
export interface WindowingProblem {
  readonly field: "chunk_length_s" | "stride_length_s"
  readonly message: string
}

/**
 * What is wrong with `chunk_length_s` and `stride_length_s` (nothing: an empty list). A stride
 * without a chunk applies to the windows of `maxChunk` seconds a long clip is cut in by default.
 * The app's task and the executor both hold a request to it, so that no request makes windows that
 * do not move on, or more than 1 + 4·d / chunk of them from d seconds of audio.
 */
export const windowingProblems = (
  request: {
    readonly chunk_length_s?: number | null | undefined
    readonly stride_length_s?: number | null | undefined
  },
  maxChunk: number = maxChunkSeconds
): Array<WindowingProblem> => {
  const chunk = request.chunk_length_s ?? undefined
  const stride = request.stride_length_s ?? undefined
  const problems: Array<WindowingProblem> = []
  const chunkFits = chunk === undefined || (chunk >= minChunkSeconds && chunk <= maxChunk)
  if (!chunkFits) {
    problems.push({
      field: "chunk_length_s",
      message: `must be from ${minChunkSeconds} to ${maxChunk} seconds, got ${chunk}`
    })
  }
  if (stride === undefined) return problems
  if (!(stride >= 0 && Number.isFinite(stride))) {
    problems.push({ field: "stride_length_s", message: `must be 0 seconds or more, got ${stride}` })
  } else if (chunkFits) {
    const window = chunk ?? maxChunk
    // Rounded as it is written, so that the longest stride the message names is taken.
    const longest = Number(((window * (1 - minWindowStep)) / 2).toFixed(6))
    if (stride > longest) {
      const named = chunk === undefined ? `the default chunk_length_s of ${window}` : `chunk_length_s ${window}`
      problems.push({
        field: "stride_length_s",
        message:
          `${stride} is too long for ${named}: each window must start at least a quarter of chunk_length_s ` +
          `after the one before (chunk_length_s - 2 × stride_length_s ≥ chunk_length_s / 4), so stride_length_s ` +
          `may be at most ${longest}`
      })
    }
  }
  return problems
}

/** The problems of `windowingProblems` as one line, each after its field. */
export const windowingText = (problems: ReadonlyArray<WindowingProblem>): string =>
  problems.map((problem) => `${problem.field}: ${problem.message}`).join("; ")

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
   * Long audio is cut in windows of this many seconds (from 1 to 30), overlapping by
   * `stride_length_s` on each side (default a sixth of the window, at most 3/8 of it, so that each
   * window starts at least a quarter of a window after the one before), whose texts are stitched
   * (transformers.js's `chunk_length_s`). By default a clip over 30 s is cut in 30 s windows, and a
   * shorter one is one window. A SpeechRecognitionTask refuses other windows (`windowingProblems`).
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
