import * as Either from "effect/Either"
import * as Schema from "effect/Schema"
import { minWindowStep, windowingProblems, windowingText } from "../app-runtime/schemas/Transcriptions.js"
import { decodeConfig, InvalidModelDirectory, type ModelDirectory } from "./ModelDirectory.js"

/**
 * How Whisper writes a transcript, as transformers.js's WhisperForConditionalGeneration and its
 * ASR pipeline do it (the reference the platform is checked against), without the model runs:
 *
 * - the prompt: <|startoftranscript|>, for a multilingual model the language and the task, and
 *   <|notimestamps|> unless timestamps are asked for;
 * - the rules applied to each step's logits before the greedy pick: suppress_tokens always,
 *   begin_suppress_tokens at the first step, and with timestamps Whisper's pairing of timestamp
 *   tokens (`timestampRules`);
 * - with timestamps, the seek over a window: a pass that ends mid-segment is run again from its
 *   last complete segment (`seekStep`);
 * - long-form audio (`chunk_length_s`): overlapping windows whose tokens are stitched by
 *   WhisperTranscript.
 */

const TokenId = Schema.Int.pipe(Schema.nonNegative())

/** generation_config.json of a Whisper model: the fields transcription reads. */
const WhisperGenerationFields = Schema.Struct({
  decoder_start_token_id: TokenId,
  eos_token_id: Schema.Union(TokenId, Schema.NonEmptyArray(TokenId)),
  no_timestamps_token_id: TokenId,
  is_multilingual: Schema.optionalWith(Schema.Boolean, { default: () => false }),
  lang_to_id: Schema.optionalWith(Schema.Record({ key: Schema.String, value: TokenId }), { default: () => ({}) }),
  task_to_id: Schema.optionalWith(Schema.Record({ key: Schema.String, value: TokenId }), { default: () => ({}) }),
  suppress_tokens: Schema.optionalWith(Schema.NullOr(Schema.Array(TokenId)), { default: () => null }),
  begin_suppress_tokens: Schema.optionalWith(Schema.NullOr(Schema.Array(TokenId)), { default: () => null }),
  max_length: Schema.optionalWith(Schema.Int.pipe(Schema.positive()), { default: () => 448 })
})

export interface WhisperSettings {
  readonly startOfTranscript: number
  readonly endOfText: number
  readonly noTimestamps: number
  /** The first timestamp token, <|0.00|>: the one after <|notimestamps|>. */
  readonly timestampBegin: number
  readonly multilingual: boolean
  /** Language code ("en") → its token id. */
  readonly languages: ReadonlyMap<string, number>
  readonly tasks: ReadonlyMap<string, number>
  readonly suppressTokens: ReadonlyArray<number>
  readonly beginSuppressTokens: ReadonlyArray<number>
  /** The longest a window's token sequence gets, prompt included. */
  readonly maxLength: number
  /** Encoder positions (1500): a timestamp step is chunk_length ÷ this many seconds. */
  readonly sourcePositions: number
}

/** Whether a model directory is a Whisper (model_type whisper with its two graphs). */
export const isWhisper = (model: ModelDirectory): boolean =>
  model.config.model_type === "whisper" && model.onnx.has("encoder_model")

export const whisperSettings = (model: ModelDirectory): WhisperSettings => {
  const fields = Either.getOrThrowWith(
    decodeConfig(WhisperGenerationFields, { ...model.generationConfig }),
    (reason) => new InvalidModelDirectory({ path: model.path, reason: `generation_config.json: ${reason}` })
  )
  const targetPositions = Number(model.rawConfig.max_target_positions ?? 448)
  const languageCode = (token: string) => token.replace(/^<\|/, "").replace(/\|>$/, "")
  return {
    startOfTranscript: fields.decoder_start_token_id,
    endOfText: typeof fields.eos_token_id === "number" ? fields.eos_token_id : fields.eos_token_id[0],
    noTimestamps: fields.no_timestamps_token_id,
    timestampBegin: fields.no_timestamps_token_id + 1,
    multilingual: fields.is_multilingual,
    languages: new Map(Object.entries(fields.lang_to_id).map(([token, id]) => [languageCode(token), id])),
    tasks: new Map(Object.entries(fields.task_to_id)),
    suppressTokens: fields.suppress_tokens ?? [],
    beginSuppressTokens: fields.begin_suppress_tokens ?? [],
    maxLength: Math.min(fields.max_length, targetPositions),
    sourcePositions: Number(model.rawConfig.max_source_positions ?? 1500)
  }
}

/** What a transcription asks for; a problem with it is the request's fault. */
export interface WhisperRequestOptions {
  /** A language code ("en") or name ("english"); multilingual models only. Default: English. */
  readonly language?: string
  /** "transcribe" (default) or "translate" (into English); multilingual models only. */
  readonly task?: string
  readonly timestamps?: boolean
}

export class WhisperRequestError extends Schema.TaggedError<WhisperRequestError>()("WhisperRequestError", {
  message: Schema.String
}) {}

/** Whisper's language names, for the languages a request may name instead of their codes. */
const languageNames: Readonly<Record<string, string>> = {
  english: "en",
  chinese: "zh",
  german: "de",
  spanish: "es",
  russian: "ru",
  korean: "ko",
  french: "fr",
  japanese: "ja",
  portuguese: "pt",
  turkish: "tr",
  polish: "pl",
  catalan: "ca",
  dutch: "nl",
  arabic: "ar",
  swedish: "sv",
  italian: "it",
  indonesian: "id",
  hindi: "hi",
  finnish: "fi",
  vietnamese: "vi",
  hebrew: "he",
  ukrainian: "uk",
  greek: "el",
  malay: "ms",
  czech: "cs",
  romanian: "ro",
  danish: "da",
  hungarian: "hu",
  tamil: "ta",
  norwegian: "no",
  thai: "th",
  urdu: "ur",
  croatian: "hr",
  bulgarian: "bg",
  lithuanian: "lt",
  latin: "la"
}

/** The code of a language a request names by code or name ("english" → "en"). */
export const whisperLanguageCode = (language: string): string => {
  const asked = language.toLowerCase()
  return languageNames[asked] ?? asked
}

/** The prompt a window is decoded after (transformers.js's `_retrieve_init_tokens`). */
export const whisperPrompt = (
  settings: WhisperSettings,
  options: WhisperRequestOptions
): Either.Either<ReadonlyArray<number>, WhisperRequestError> => {
  const prompt = [settings.startOfTranscript]
  if (settings.multilingual) {
    const code = whisperLanguageCode(options.language ?? "en")
    const language = settings.languages.get(code)
    if (language === undefined) {
      return Either.left(
        new WhisperRequestError({
          message: `language "${options.language}" is not one this model knows (${[...settings.languages.keys()].join(", ")})`
        })
      )
    }
    const task = settings.tasks.get(options.task ?? "transcribe")
    if (task === undefined) {
      return Either.left(
        new WhisperRequestError({
          message: `task "${options.task}" is not one this model knows (${[...settings.tasks.keys()].join(", ")})`
        })
      )
    }
    prompt.push(language, task)
  } else if (options.language !== undefined || options.task !== undefined) {
    return Either.left(
      new WhisperRequestError({
        message: "this model is English-only: it takes neither a language nor a task"
      })
    )
  }
  if (options.timestamps !== true) prompt.push(settings.noTimestamps)
  return Either.right(prompt)
}

/** The log of the sum of exp(logits[from…to)) minus the log-sum-exp of all: a slice's probability mass, as a log. */
const logMass = (logits: Float32Array, from: number, to: number, logTotal: number): number => {
  let max = Number.NEGATIVE_INFINITY
  for (let i = from; i < to; i++) if (logits[i]! > max) max = logits[i]!
  if (max === Number.NEGATIVE_INFINITY) return max
  let sum = 0
  for (let i = from; i < to; i++) sum += Math.exp(logits[i]! - max)
  return max + Math.log(sum) - logTotal
}

/**
 * Whisper's timestamp rules on one step's logits, in place (transformers.js's
 * WhisperTimeStampLogitsProcessor): never <|notimestamps|>; the first token after the prompt is a
 * timestamp; timestamps come in pairs, a lone one only before the end; and when the timestamps
 * together are likelier than the likeliest text token, a timestamp is written.
 *
 * `generated` are the tokens after the prompt's <|startoftranscript|> … task tokens.
 */
export const timestampRules = (settings: WhisperSettings, logits: Float32Array, generated: ReadonlyArray<number>) => {
  const begin = settings.timestampBegin
  logits[settings.noTimestamps] = Number.NEGATIVE_INFINITY
  if (generated.length === 0) {
    logits.fill(Number.NEGATIVE_INFINITY, 0, begin)
    return
  }
  const last = generated[generated.length - 1]! >= begin
  const penultimate = generated.length < 2 || generated[generated.length - 2]! >= begin
  if (last) {
    if (penultimate) logits.fill(Number.NEGATIVE_INFINITY, begin)
    else logits.fill(Number.NEGATIVE_INFINITY, 0, settings.endOfText)
  }
  const logTotal = logMass(logits, 0, logits.length, 0)
  const timestampMass = logMass(logits, begin, logits.length, logTotal)
  let bestText = Number.NEGATIVE_INFINITY
  for (let i = 0; i < begin; i++) if (logits[i]! > bestText) bestText = logits[i]!
  if (timestampMass > bestText - logTotal) logits.fill(Number.NEGATIVE_INFINITY, 0, begin)
}

/**
 * All of one step's rules, in transformers.js's order, on the logits of a sequence whose prompt is
 * `promptLength` long and that has `generated` tokens after it.
 */
export const whisperStepRules = (
  settings: WhisperSettings,
  logits: Float32Array,
  prompt: ReadonlyArray<number>,
  generated: ReadonlyArray<number>
): void => {
  for (const id of settings.suppressTokens) logits[id] = Number.NEGATIVE_INFINITY
  if (generated.length === 0) for (const id of settings.beginSuppressTokens) logits[id] = Number.NEGATIVE_INFINITY
  if (prompt[prompt.length - 1] !== settings.noTimestamps) {
    // The timestamp processor counts from the prompt less a trailing <|notimestamps|>; with
    // timestamps the prompt has none, so `generated` is what it sees.
    timestampRules(settings, logits, generated)
  }
}

/** The index of the largest value (the first of equal ones), as a greedy pick. */
export const argmax = (values: Float32Array, from = 0, to = values.length): number => {
  let best = from
  for (let i = from + 1; i < to; i++) if (values[i]! > values[best]!) best = i
  return best - from
}

/** Feature frames a window covers, and the encoder's frames a timestamp step spans. */
export const inputStride = 2

/**
 * What one pass over a window gives a timestamped transcription (transformers.js's
 * `_generate_with_seek` step): the tokens it keeps, their timestamps moved by the window's offset,
 * and how many feature frames the seek advances. `generated` has no trailing end token.
 */
export const seekStep = (
  settings: WhisperSettings,
  generated: ReadonlyArray<number>,
  seek: number,
  seekEnd: number
): { readonly tokens: ReadonlyArray<number>; readonly advance: number } => {
  const begin = settings.timestampBegin
  const isTimestamp = generated.map((token) => token >= begin)
  const n = generated.length
  const singleTimestampEnding = n >= 2 && isTimestamp[n - 1]! && !isTimestamp[n - 2]!
  let lastPair = -1
  for (let i = 0; i + 1 < n; i++) if (isTimestamp[i] && isTimestamp[i + 1]) lastPair = i + 1
  let advance = seekEnd - seek
  let keep = n
  if (lastPair >= 0 && !singleTimestampEnding) {
    advance = (generated[lastPair - 1]! - begin) * inputStride
    keep = lastPair
  }
  const offset = Math.floor(seek / inputStride)
  const lastTimestamp = begin + settings.sourcePositions
  const tokens = generated
    .slice(0, keep)
    .map((token) => (token >= begin ? Math.min(token + offset, lastTimestamp) : token))
  return { tokens, advance }
}

/** One window of a long clip, as the ASR pipeline cuts it: its samples, and its strides in samples. */
export interface AudioWindow {
  readonly from: number
  readonly to: number
  readonly strideLeft: number
  readonly strideRight: number
}

/**
 * The windows of a clip of `length` samples (transformers.js's chunking with `chunk_length_s` and
 * `stride_length_s`, default a sixth of the chunk): windows of `chunk` seconds overlapping by
 * twice the stride; one window when `chunkSeconds` is 0. Windows that would not move on a quarter
 * of their length are refused (`windowingProblems`), so a clip of d seconds is at most
 * 1 + 4·d / chunk windows.
 */
export const audioWindows = (
  length: number,
  samplingRate: number,
  chunkSeconds: number,
  strideSeconds?: number
): ReadonlyArray<AudioWindow> => {
  if (chunkSeconds === 0) return [{ from: 0, to: length, strideLeft: 0, strideRight: 0 }]
  const stride = strideSeconds ?? chunkSeconds / 6
  const problems = windowingProblems({ chunk_length_s: chunkSeconds, stride_length_s: stride })
  if (problems.length > 0) throw new WhisperRequestError({ message: windowingText(problems) })
  const window = samplingRate * chunkSeconds
  const strideSamples = samplingRate * stride
  const jump = window - 2 * strideSamples
  const windows: Array<AudioWindow> = []
  for (let offset = 0; ; offset += jump) {
    const end = offset + window
    const to = Math.min(end, length)
    const last = end >= length
    windows.push({
      from: offset,
      to,
      strideLeft: offset === 0 ? 0 : strideSamples,
      strideRight: last ? 0 : strideSamples
    })
    if (last) return windows
  }
}

/**
 * The most windows one request may cut its clip in: those of the longest clip the executor takes
 * (`maxAudioSeconds`) cut in whole windows (`windowSeconds`, Whisper's 30) as close together as
 * they may be. Every window's features are a whole window's, so this bounds the features one
 * request holds by those of a request with the default window length: shorter windows take shorter
 * clips, never more memory.
 */
export const maxSpeechWindows = (maxAudioSeconds: number, windowSeconds: number): number =>
  1 + Math.max(0, Math.ceil((maxAudioSeconds - windowSeconds) / (windowSeconds * minWindowStep)))

/** One decoding pass to run: a window's features [mel bins × frames] and the prompt it follows. */
export interface WhisperPass {
  readonly features: Float32Array
  readonly prompt: ReadonlyArray<number>
}

/** Runs passes (batched as the runner likes) and answers each one's generated tokens, a final end token included. */
export type RunWhisperPasses = (passes: ReadonlyArray<WhisperPass>) => Promise<ReadonlyArray<ReadonlyArray<number>>>

/** A window's tokens as the ASR pipeline hands them to the merge: the prompt, the tokens, the end. */
export interface WindowTokens {
  readonly tokens: ReadonlyArray<number>
  /** Seconds: [window length, left stride, right stride]. */
  readonly stride: readonly [number, number, number]
}

/** Features [bins × frames] moved `seek` frames to the left, zeros after: a pass from the middle of a window. */
const shiftedFeatures = (features: Float32Array, bins: number, seek: number): Float32Array => {
  if (seek === 0) return features
  const frames = features.length / bins
  const out = new Float32Array(features.length)
  for (let bin = 0; bin < bins; bin++) {
    out.set(features.subarray(bin * frames + seek, (bin + 1) * frames), bin * frames)
  }
  return out
}

const withoutEnd = (settings: WhisperSettings, tokens: ReadonlyArray<number>) =>
  tokens.length > 0 && tokens[tokens.length - 1] === settings.endOfText ? tokens.slice(0, -1) : tokens

/**
 * Every window's tokens for one clip's windows (each given as its features, padded to the
 * encoder's frames, and its length in samples). Without timestamps a window is one pass; with
 * them, a window is passed again from where its last complete segment ended until its frames are
 * used (transformers.js's seek loop), and its tokens are the passes' joined. All windows' passes
 * run together, so a long clip's windows share batches.
 */
export const decodeWindows = async (
  settings: WhisperSettings,
  prompt: ReadonlyArray<number>,
  timestamps: boolean,
  windows: ReadonlyArray<{ readonly features: Float32Array; readonly melBins: number }>,
  run: RunWhisperPasses
): Promise<Array<ReadonlyArray<number>>> => {
  if (!timestamps) {
    const outputs = await run(windows.map((window) => ({ features: window.features, prompt })))
    return outputs.map((tokens) => [...prompt, ...tokens])
  }
  const states = windows.map(() => ({ seek: 0, tokens: [] as Array<number>, done: false }))
  for (;;) {
    const active = states.flatMap((state, index) => (state.done ? [] : [index]))
    if (active.length === 0) break
    const outputs = await run(
      active.map((index) => ({
        features: shiftedFeatures(windows[index]!.features, windows[index]!.melBins, states[index]!.seek),
        prompt
      }))
    )
    active.forEach((index, position) => {
      const state = states[index]!
      const total = windows[index]!.features.length / windows[index]!.melBins
      // A pass covers at most the encoder's frames, which are all of a window's.
      const seekEnd = total
      const generated = withoutEnd(settings, outputs[position]!)
      if (generated.length === 0) {
        state.done = true
        return
      }
      const step = seekStep(settings, generated, state.seek, seekEnd)
      state.tokens.push(...step.tokens)
      // A pass that would not move the seek (a pair of zero timestamps) ends the window, where the reference would loop forever.
      state.seek += step.advance > 0 ? step.advance : seekEnd - state.seek
      if (state.seek >= total) state.done = true
    })
  }
  return states.map((state) => [...prompt, ...state.tokens, settings.endOfText])
}
