/**
 * Eric's `POST /transcriptions` on a Whisper model, as transformers.js's ASR pipeline transcribes:
 * the clip is decoded and cut in windows in the thread pool (speechWindows), each window is a work
 * item (a pass: its features and the prompt) that the engine batches with other requests' passes,
 * and with timestamps a window is passed again from where its last complete segment ended
 * (WhisperGeneration's decodeWindows); the windows' tokens are stitched into the text and its
 * segments (WhisperTranscript).
 */
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import { Tokenizer } from "@huggingface/tokenizers"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import { windowingProblems, windowingText } from "../../app-runtime/schemas/Transcriptions.js"
import type { ModelDirectory } from "../../models/ModelDirectory.js"
import {
  decodeWindows,
  type WhisperSettings,
  whisperLanguageCode,
  whisperPrompt,
  whisperSettings
} from "../../models/WhisperGeneration.js"
import { mergeWhisperChunks, type WhisperVocabulary, whisperVocabulary } from "../../models/WhisperTranscript.js"
import { inSpan } from "../../tracing/Tracing.js"
import type { EngineClient } from "../common/EngineClient.js"
import { BadRequest } from "../common/errors.js"
import type { ExecutorConfig } from "../common/ExecutorConfig.js"
import type { MediaLimits } from "../common/media/MediaLimits.js"
import { type MediaSourceOptions, readMedia } from "../common/media/MediaSource.js"
import type { SpeechWindow } from "../common/media/preprocess.js"
import { errorAnswer, RequestSpan, workItemContext } from "../common/Router.js"
import type { ThreadPool } from "../common/ThreadPool.js"
import type { WorkItem } from "../common/wire.js"
import { TranscriptionsRequest, type TranscriptionsResponse } from "./api.js"
import type { SpeechItemMeta } from "./worker.js"

/** What a Whisper model needs to be served, read once when the router starts. */
export interface SpeechModel {
  readonly settings: WhisperSettings
  readonly vocabulary: WhisperVocabulary
  readonly melBins: number
  /** Seconds a window holds: the extractor's chunk_length (30). */
  readonly windowSeconds: number
}

export const speechModelOf = (model: ModelDirectory): SpeechModel => {
  if (model.tokenizer === undefined) throw new Error(`model ${model.path} has no tokenizer.json`)
  const preprocessor = (model.preprocessorConfig ?? {}) as { readonly chunk_length?: number }
  return {
    settings: whisperSettings(model),
    vocabulary: whisperVocabulary(new Tokenizer(model.tokenizer.json, model.tokenizer.rawConfig)),
    melBins: Number(model.rawConfig.num_mel_bins ?? 80),
    windowSeconds: preprocessor.chunk_length ?? 30
  }
}

export const transcriptions = (context: {
  readonly config: ExecutorConfig
  readonly engine: EngineClient
  readonly pool: ThreadPool
  readonly model: ModelDirectory
  readonly speech: SpeechModel
  readonly media: MediaSourceOptions
  readonly limits: MediaLimits
}) => {
  const { engine, pool, model, speech, media, limits } = context
  return Effect.gen(function* () {
    const body = yield* HttpServerRequest.schemaBodyJson(TranscriptionsRequest)
    const prompt = whisperPrompt(speech.settings, {
      timestamps: body.timestamps,
      ...(body.language === undefined ? {} : { language: body.language }),
      ...(body.task === undefined ? {} : { task: body.task })
    })
    if (Either.isLeft(prompt)) return yield* new BadRequest({ message: prompt.left.message })
    // Checked again in the thread that cuts the clip; here, before the audio is fetched.
    const windowing = windowingProblems(
      { chunk_length_s: body.chunkSeconds, stride_length_s: body.strideSeconds },
      speech.windowSeconds
    )
    if (windowing.length > 0) return yield* new BadRequest({ message: windowingText(windowing) })
    const span = yield* RequestSpan
    const itemContext = yield* workItemContext
    const clip = yield* Effect.tryPromise({
      try: () =>
        inSpan("preprocess", { parent: span }, async () => {
          const read = await readMedia(body.url, media)
          return pool.run<{ duration: number; windows: Array<SpeechWindow> }>("speechWindows", {
            bytes: new Uint8Array(read.bytes.buffer, read.bytes.byteOffset, read.bytes.byteLength),
            mimeType: read.mimeType,
            preprocessorConfig: model.preprocessorConfig,
            ...(body.chunkSeconds === undefined ? {} : { chunkSeconds: body.chunkSeconds }),
            ...(body.strideSeconds === undefined ? {} : { strideSeconds: body.strideSeconds }),
            limits
          })
        }),
      catch: (error) => error
    })
    const passes: Array<{ readonly id: string }> = []
    const tokens = yield* Effect.tryPromise({
      try: () =>
        decodeWindows(
          speech.settings,
          prompt.right,
          body.timestamps,
          clip.windows.map((window) => ({ features: window.features, melBins: speech.melBins })),
          async (batch) => {
            const items: Array<WorkItem<SpeechItemMeta>> = batch.map((pass) => ({
              // Passes decode in lockstep: a batch holds prompts of one length.
              key: `speech:${pass.prompt.length}`,
              inputs: {
                input_features: {
                  dtype: "float32",
                  shape: [1, speech.melBins, pass.features.length / speech.melBins],
                  data: pass.features
                }
              },
              meta: { modality: "speech", prompt: pass.prompt } satisfies SpeechItemMeta,
              ...itemContext
            }))
            const submitted = engine.submit<Array<number>>(items)
            passes.push(submitted)
            return await submitted.results
          }
        ),
      catch: (error) => error
    }).pipe(Effect.onInterrupt(() => Effect.sync(() => passes.forEach((submitted) => engine.cancel(submitted.id)))))
    const transcript = mergeWhisperChunks(
      tokens.map((ids, index) => ({ tokens: ids, stride: clip.windows[index]!.stride })),
      speech.vocabulary,
      {
        timePrecision: speech.windowSeconds / speech.settings.sourcePositions,
        returnTimestamps: body.timestamps
      }
    )
    const generated = tokens.reduce((sum, ids) => sum + ids.length - prompt.right.length, 0)
    const answer: TranscriptionsResponse = {
      text: transcript.text,
      language: whisperLanguageCode(body.language ?? "en"),
      task: body.task ?? "transcribe",
      duration: clip.duration,
      ...(transcript.chunks === undefined
        ? {}
        : {
            segments: transcript.chunks.map((chunk) => ({
              start: chunk.timestamp[0] ?? 0,
              end: chunk.timestamp[1],
              text: chunk.text
            }))
          }),
      tokens: generated
    }
    return HttpServerResponse.unsafeJson(answer)
  }).pipe(Effect.catchAll(errorAnswer))
}
