/**
 * Eric's router: `POST /embeddings` (media), `POST /text-embeddings` (a text embedding model's) and
 * `POST /transcriptions` (a Whisper's, see Transcriptions.ts).
 * Media are fetched here and decoded in the thread pool, texts tokenized there; an item whose media
 * is unreadable or corrupt, or a text the model cannot take, fails its own request (MediaError,
 * MediaTooLarge, ContextLengthExceeded, BadRequest) before it reaches the engine, so requests
 * batched with it are not affected.
 */
import * as HttpRouter from "@effect/platform/HttpRouter"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as Effect from "effect/Effect"
import { decodeAudioProcessorConfig } from "../../models/AudioProcessor.js"
import { loadModelDirectory } from "../../models/ModelDirectory.js"
import {
  type Qwen2VLRequestSettings,
  qwen2VLRequestSettings,
  qwen2VLVideoTokenBudget
} from "../../models/Qwen2VLProcessor.js"
import { ultravoxAudioOf } from "../../models/UltravoxProcessor.js"
import { visionProcessorOf } from "../../models/VisionProcessor.js"
import { hasTextEmbeddingGraph, textEmbeddingSpec } from "../../models/TextEmbedding.js"
import { BadRequest, NoSidecar, UnsupportedModality } from "../common/errors.js"
import { errorAnswer, RequestSpan, type RouterKind, workItemContext } from "../common/Router.js"
import { allOrNone } from "../common/ThreadPool.js"
import { inSpan } from "../../tracing/Tracing.js"
import type { WorkItem } from "../common/wire.js"
import { type EmbeddingResult, EmbeddingsRequest } from "./api.js"
import { checkSharedProcessing } from "./SharedTower.js"
import { textEmbeddings } from "./TextEmbeddings.js"
import { speechModelOf, transcriptions } from "./Transcriptions.js"
import { isWhisper } from "../../models/WhisperGeneration.js"
import { checkMediaItemCount, mediaLimitsOf } from "../common/media/MediaLimits.js"
import { mediaSourceOptionsOf, readMedia } from "../common/media/MediaSource.js"
import type { Preprocessed } from "../common/media/preprocess.js"
import { ultravoxAudioJob } from "../common/media/UltravoxAudioJob.js"
import type { EricItemMeta, EricItemResult } from "./worker.js"

/** At most this many frames of a video are embedded, evenly sampled. */
export const maxVideoFrames = 32

export const routerKind: RouterKind = {
  preprocessModule: new URL("./preprocess.js", import.meta.url).href,
  preprocessesEveryRequest: true,
  make: ({ config, engine, pool: maybePool }) =>
    Effect.gen(function* () {
      const pool = maybePool!
      const model = yield* Effect.tryPromise({
        try: () => loadModelDirectory(config.modelDir),
        catch: (error) => error as Error
      })
      const vision = yield* Effect.try({
        try: () => (model.onnx.has("vision_encoder") ? visionProcessorOf(model) : undefined),
        catch: (error) => error as Error
      })
      const imageConfig = vision?.kind === "fixed" ? vision.config : undefined
      const ultravox = ultravoxAudioOf(model)
      const audioConfig =
        ultravox === undefined && model.onnx.has("audio_encoder")
          ? decodeAudioProcessorConfig(model.preprocessorConfig)
          : undefined
      const text = hasTextEmbeddingGraph(model)
        ? yield* Effect.tryPromise({ try: () => textEmbeddingSpec(model), catch: (error) => error as Error })
        : undefined
      const speech = isWhisper(model)
        ? yield* Effect.try({ try: () => speechModelOf(model), catch: (error) => error as Error })
        : undefined
      // Idefics3, Gemma 3 and LLaVA-OneVision embed images only: a video would be its frames as images, which
      // their prompts do not spell (transformers.js pools no LLaVA-OneVision frames). Qwen3-VL too: its videos need timestamps (its processor's videoRefusal says why).
      const modalities = [
        ...(vision === undefined
          ? []
          : vision.kind === "idefics3" ||
              vision.kind === "gemma3" ||
              vision.kind === "llavaOnevision" ||
              (vision.kind === "qwen2vl" && vision.processor.videoRefusal !== undefined)
            ? ["image"]
            : ["image", "video"]),
        ...(audioConfig || ultravox ? ["audio"] : []),
        ...(text === undefined ? [] : ["text"]),
        ...(speech === undefined ? [] : ["speech"])
      ]
      const adapters = config.adapters ?? []
      if (adapters.length > 0) {
        yield* Effect.tryPromise({
          try: () =>
            checkSharedProcessing(
              { id: config.model, dir: config.modelDir },
              adapters.map((id, index) => ({ id, dir: config.adapterDirs![index]! }))
            ),
          catch: (error) => error as Error
        })
      }
      const embedsFor = [config.model, ...adapters]
      const videoRefusal = vision?.kind === "qwen2vl" ? vision.processor.videoRefusal : undefined
      const sidecarNode =
        config.sidecarSocket === undefined
          ? undefined
          : yield* Effect.tryPromise({
              try: async () => {
                const { SidecarClient } = await import("../../sidecar/SidecarClient.js")
                const client = await SidecarClient.connect(config.sidecarSocket!)
                const node = client.nodeId
                await client.close()
                return node
              },
              catch: (error) => error as Error
            })
      const mediaOptions = mediaSourceOptionsOf(config)
      const limits = mediaLimitsOf(config)

      /** An item's inputs, made in the thread pool; `signal` ends its job (its request ended, or another item failed). */
      const preprocess = (
        item: EmbeddingsRequest["items"][number],
        settings: Qwen2VLRequestSettings | undefined,
        signal: AbortSignal
      ): Promise<Preprocessed> =>
        readMedia(item.url, mediaOptions).then((media) => {
          const run = (task: string, input: unknown) => pool.run<Preprocessed>(task, input, { signal })
          const bytes = new Uint8Array(media.bytes.buffer, media.bytes.byteOffset, media.bytes.byteLength)
          if (vision?.kind === "qwen2vl" && item.modality !== "audio") {
            return item.modality === "image"
              ? run("qwen2VLImage", {
                  bytes,
                  processor: vision.processor,
                  limits,
                  ...(settings === undefined ? {} : { bounds: settings.bounds })
                })
              : run("qwen2VLVideo", {
                  bytes,
                  processor: vision.processor,
                  maxTokens: qwen2VLVideoTokenBudget(model.decoder?.maxPositions),
                  limits,
                  ...settings
                })
          }
          switch (item.modality) {
            case "image":
              return vision?.kind === "idefics3"
                ? run("idefics3Image", { bytes, config: vision.processor.image, limits })
                : vision?.kind === "gemma3" || vision?.kind === "llavaOnevision"
                  ? run("fixedSizeImage", { bytes, config: vision.processor, limits })
                  : run("image", { bytes, config: imageConfig, limits })
            case "video":
              return run("video", {
                bytes,
                config: imageConfig,
                maxFrames: maxVideoFrames,
                limits
              })
            case "audio":
              if (ultravox !== undefined) {
                return ultravoxAudioJob(pool, {
                  bytes,
                  mimeType: media.mimeType,
                  preprocessorConfig: model.preprocessorConfig,
                  ultravox,
                  limits,
                  signal
                })
              }
              return run("audio", {
                bytes,
                mimeType: media.mimeType,
                config: audioConfig,
                limits
              })
          }
        })

      const embeddings = Effect.gen(function* () {
        const body = yield* HttpServerRequest.schemaBodyJson(EmbeddingsRequest)
        yield* checkMediaItemCount(body.items.length, config.maxMediaItems)
        const unsupported = body.items.find((item) => !modalities.includes(item.modality))
        if (unsupported !== undefined) {
          return yield* new UnsupportedModality({
            message: `model ${config.model} takes ${modalities.join(", ")}; item ${unsupported.id} is ${unsupported.modality}${videoRefusal !== undefined && unsupported.modality === "video" ? `: ${videoRefusal}` : ""}`
          })
        }
        const otherModel = body.items.find((item) => item.model !== undefined && !embedsFor.includes(item.model))
        if (otherModel !== undefined) {
          return yield* new BadRequest({
            message: `this encoder embeds for ${embedsFor.join(", ")}; item ${otherModel.id} asks for ${otherModel.model}`
          })
        }
        let settings: Qwen2VLRequestSettings | undefined
        if (body.processor !== undefined) {
          if (vision?.kind !== "qwen2vl") {
            return yield* new BadRequest({
              message: `model ${config.model} takes no processor settings (mm_processor_kwargs): only Qwen2-VL models do`
            })
          }
          const checked = qwen2VLRequestSettings(vision.processor, body.processor)
          if (typeof checked === "string") return yield* new BadRequest({ message: checked })
          settings = checked
        }
        const inline = body.return === "inline"
        if (!inline && sidecarNode === undefined) return yield* new NoSidecar()
        const span = yield* RequestSpan
        const itemContext = yield* workItemContext
        // The signal aborts when the request ends (its caller hung up): its jobs and their decoders stop.
        const preprocessed = yield* Effect.tryPromise({
          try: (signal) =>
            inSpan("preprocess", { parent: span, attributes: { "cornserve.items": body.items.length } }, () =>
              allOrNone(body.items, signal, (item, itemSignal) => preprocess(item, settings, itemSignal))
            ),
          catch: (error) => error
        })
        const items: Array<WorkItem<EricItemMeta>> = body.items.map((item, index) => ({
          // Ultravox clips batch only with clips of as many frames: their features stack by length.
          key:
            item.modality !== "audio"
              ? // A shared tower's batches mix its models: the tower runs once, each model's projector on its own.
                "vision"
              : ultravox === undefined
                ? "audio"
                : `audio:${preprocessed[index]!.inputs.audio_values!.shape[2]}`,
          inputs: preprocessed[index]!.inputs,
          meta: {
            id: item.id,
            modality: item.modality,
            receivers: item.receivers ?? body.receivers ?? (sidecarNode === undefined ? [] : [sidecarNode]),
            inline,
            ...(adapters.length === 0 ? {} : { model: item.model ?? config.model }),
            ...(preprocessed[index]!.grid === undefined ? {} : { grid: preprocessed[index]!.grid }),
            ...(preprocessed[index]!.thw === undefined ? {} : { thw: preprocessed[index]!.thw })
          } satisfies EricItemMeta,
          ...itemContext
        }))
        const results = yield* engine.run<EricItemResult>(items)
        const answer: Array<EmbeddingResult> = body.items.map((item, index) => {
          const result = results[index]!
          return {
            id: item.id,
            modality: item.modality,
            dtype: "float32",
            shape: [result.shape[0], result.shape[1]],
            ...(result.embedding === undefined ? {} : { embedding: Array.from(result.embedding) })
          }
        })
        return HttpServerResponse.unsafeJson({ items: answer })
      }).pipe(Effect.catchAll(errorAnswer))

      const routes = HttpRouter.empty.pipe(HttpRouter.post("/embeddings", embeddings))
      return {
        info: {
          modalities,
          models: embedsFor,
          maxVideoFrames,
          sidecarNode: sidecarNode ?? null,
          ...(text === undefined
            ? {}
            : {
                text: {
                  maxTokens: text.maxTokens,
                  hiddenSize: text.hiddenSize,
                  pooling: text.pooling ?? null,
                  normalize: text.normalize ?? null,
                  poolingSource: text.poolingSource,
                  matryoshka: text.matryoshka ?? null
                }
              })
        },
        routes: routes.pipe(
          HttpRouter.post(
            "/transcriptions",
            speech === undefined
              ? errorAnswer(
                  new UnsupportedModality({
                    message: `model ${config.model} is not a speech recognizer: it has no onnx/encoder_model.onnx with a Whisper config`
                  })
                )
              : transcriptions({ config, engine, pool, model, speech, media: mediaOptions, limits })
          ),
          HttpRouter.post(
            "/text-embeddings",
            text === undefined
              ? errorAnswer(
                  new UnsupportedModality({
                    message: `model ${config.model} embeds ${modalities.join(", ")}, not text: it has no onnx/model.onnx`
                  })
                )
              : textEmbeddings({ config, engine, pool, spec: text })
          )
        )
      }
    })
}
