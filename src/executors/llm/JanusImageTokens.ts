/**
 * The LLM executor's router on a Janus-Pro model (model_type "multi_modality"), which the platform
 * serves for image generation: `POST /v1/cornserve/image-tokens` renders the prompt with the
 * model's "text_to_image" chat template (as transformers.js's VLChatProcessor does), has the engine
 * choose the image's tokens (JanusRunner.ts, with the model's classifier-free guidance), and sends
 * them as one int64 [1, image tokens] tensor through the sidecar to the generator that decodes
 * them (Geri). Chat completions and prompt embeddings are refused with a 400 that says so.
 */
import { randomInt } from "node:crypto"
import * as HttpRouter from "@effect/platform/HttpRouter"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as Effect from "effect/Effect"
import { janusSpec, janusUserRole } from "../../models/JanusModel.js"
import type { ModelDirectory } from "../../models/ModelDirectory.js"
import { ChatTokenizer } from "../../models/Tokenizer.js"
import { SidecarClient } from "../../sidecar/SidecarClient.js"
import { Tensor } from "../../sidecar/Tensor.js"
import type { EngineClient } from "../common/EngineClient.js"
import type { ExecutorConfig } from "../common/ExecutorConfig.js"
import { BadRequest, ContextLengthExceeded } from "../common/errors.js"
import { errorAnswer, RequestSpan, workItemContext } from "../common/Router.js"
import { inSpan } from "../../tracing/Tracing.js"
import { ImageTokensRequest, type ImageTokensResponse } from "./api.js"
import { contextLength, kvBudget } from "./Limits.js"
import { modelRoutes } from "./ModelRoutes.js"
import type { GenerateMeta, GenerateResult, SamplingParams, TokenPartial } from "./protocol.js"

const imageTemplate = "text_to_image"

export const janusRouter = (config: ExecutorConfig, engine: EngineClient, model: ModelDirectory) =>
  Effect.gen(function* () {
    const spec = yield* Effect.try({ try: () => janusSpec(model), catch: (error) => error as Error })
    const tokenizer = yield* Effect.try({ try: () => new ChatTokenizer(model), catch: (error) => error as Error })
    if (!tokenizer.chatTemplateNames.includes(imageTemplate))
      return yield* Effect.fail(
        new Error(
          `${config.model} is a Janus model without a "${imageTemplate}" chat template (it has ${tokenizer.chatTemplateNames.join(", ") || "none"})`
        )
      )
    const sidecar =
      config.sidecarSocket === undefined
        ? undefined
        : yield* Effect.acquireRelease(
            Effect.tryPromise({
              try: () => SidecarClient.connect(config.sidecarSocket!),
              catch: (error) => error as Error
            }),
            (client) => Effect.promise(() => client.close())
          )
    const maxModelLength = spec.maxPositions ?? contextLength(model)
    yield* Effect.logInfo(
      `${config.model}: Janus image generation, ${spec.imageTokens} tokens an image, guidance scale ${spec.guidanceScale ?? "none"}`
    )

    const { checkModel, models, stats } = modelRoutes(config.model, engine, maxModelLength)

    const imageOnly = Effect.fail(
      new BadRequest({
        message: `${config.model} is a Janus-Pro model, served for image generation only: ask for its image tokens (POST /v1/cornserve/image-tokens, an LLMImageTokensTask) and decode them with an ImageGeneratorTask on the same model`
      })
    ).pipe(Effect.catchAll(errorAnswer))

    /** The prompt's ids as VLChatProcessor makes them: the user's message in the image template, without the tokenizer's special tokens. */
    const promptIds = (prompt: string): Int32Array => {
      if (prompt.includes(spec.imageTag))
        throw new BadRequest({
          message: `the prompt holds the image placeholder ${spec.imageTag}: image generation takes text alone`
        })
      const ids = tokenizer.encodeChat([{ role: janusUserRole, content: prompt }], { template: imageTemplate })
      if (ids.length + spec.imageTokens > maxModelLength)
        throw new ContextLengthExceeded({
          message: `this model's maximum context length is ${maxModelLength} tokens; the prompt takes ${ids.length} and the image ${spec.imageTokens}`
        })
      return Int32Array.from(ids)
    }

    const imageTokens = Effect.gen(function* () {
      const body = yield* HttpServerRequest.schemaBodyJson(ImageTokensRequest)
      yield* checkModel(body.model)
      if (sidecar === undefined)
        return yield* new BadRequest({ message: "this executor has no sidecar to send image tokens through" })
      const inputIds = yield* Effect.try({ try: () => promptIds(body.prompt), catch: (error) => error })
      const guidanceScale = body.guidanceScale ?? spec.guidanceScale
      const sampling: SamplingParams = {
        temperature: body.temperature ?? 0,
        topP: 1,
        seed: body.seed ?? randomInt(2 ** 31),
        maxNewTokens: spec.imageTokens,
        stopTokenIds: [],
        ...(guidanceScale === undefined ? {} : { guidanceScale })
      }
      const meta: GenerateMeta = { op: "generate", prompt: { inputIds, media: [] }, sampling }
      const tokens: Array<number> = []
      const result = yield* engine.runOne<GenerateResult, TokenPartial>(
        { key: meta.op, inputs: {}, meta, ...(yield* workItemContext) },
        (partial) => tokens.push(partial.token)
      )
      if (result.completionTokens !== spec.imageTokens || tokens.length !== spec.imageTokens)
        return yield* Effect.fail(
          new Error(`the engine chose ${tokens.length} image tokens; an image takes ${spec.imageTokens}`)
        )
      const span = yield* RequestSpan
      const receivers = body.receivers ?? [sidecar.nodeId]
      yield* Effect.tryPromise({
        try: () =>
          inSpan("send image tokens", { parent: span }, (sending) =>
            sidecar.send(body.id, new Tensor("int64", [1, tokens.length], BigInt64Array.from(tokens, BigInt)), {
              to: receivers,
              ...(sending.traceparent === undefined ? {} : { traceparent: sending.traceparent })
            })
          ),
        catch: (error) => error
      })
      const answer: ImageTokensResponse = { id: body.id, tokens: tokens.length }
      return HttpServerResponse.unsafeJson(answer)
    }).pipe(Effect.catchAll(errorAnswer))

    return {
      info: {
        modalities: [],
        encoders: [],
        maxModelLength,
        kvCacheBytesPerDevice: kvBudget(config, model).totalBytes,
        sidecarNode: sidecar?.nodeId ?? null,
        imageTokens: spec.imageTokens
      },
      routes: HttpRouter.empty.pipe(
        HttpRouter.post("/v1/chat/completions", imageOnly),
        HttpRouter.get("/v1/models", models),
        HttpRouter.post("/v1/cornserve/prompt-embeddings", imageOnly),
        HttpRouter.post("/v1/cornserve/image-tokens", imageTokens),
        HttpRouter.get("/v1/cornserve/stats", stats)
      )
    }
  })
