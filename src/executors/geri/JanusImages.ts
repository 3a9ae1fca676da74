/**
 * Geri's router on a Janus-Pro model: `POST /generate` takes the image tokens the LLM executor sent
 * through the sidecar (one int64 [1, image tokens] tensor under the request's `embeddings` id) in
 * place of prompt embeddings, and hands them to the worker (JanusDecoder.ts), which answers a PNG of
 * the model's size, or of the size asked for. Requests of one size are decoded in one batch.
 */
import { randomInt } from "node:crypto"
import * as HttpRouter from "@effect/platform/HttpRouter"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as Effect from "effect/Effect"
import { janusSpec } from "../../models/JanusModel.js"
import type { ModelDirectory } from "../../models/ModelDirectory.js"
import { RecvTimeout } from "../../sidecar/errors.js"
import { SidecarClient } from "../../sidecar/SidecarClient.js"
import { Tensor } from "../../sidecar/Tensor.js"
import type { EngineClient } from "../common/EngineClient.js"
import type { ExecutorConfig } from "../common/ExecutorConfig.js"
import { BadRequest, EmbeddingMissing } from "../common/errors.js"
import { errorAnswer, RequestSpan, workItemContext } from "../common/Router.js"
import { inSpan } from "../../tracing/Tracing.js"
import { GenerateRequest, type ImageAnswer } from "./api.js"
import type { GeriImageResult, GeriItemMeta } from "./worker.js"

export const janusImageRoutes = (config: ExecutorConfig, engine: EngineClient, model: ModelDirectory) =>
  Effect.gen(function* () {
    const spec = yield* Effect.try({ try: () => janusSpec(model), catch: (error) => error as Error })
    if (config.sidecarSocket === undefined)
      return yield* Effect.fail(new Error("Geri takes a Janus image's tokens from a sidecar: give it --sidecar-socket"))
    const sidecar = yield* Effect.acquireRelease(
      Effect.tryPromise({
        try: () => SidecarClient.connect(config.sidecarSocket!),
        catch: (error) => error as Error
      }),
      (client) => Effect.promise(() => client.close())
    )

    /** The image's tokens under `id`, checked against the model, copied out of the sidecar and released there. */
    const takeTokens = async (id: string): Promise<BigInt64Array> => {
      let payload: Awaited<ReturnType<typeof sidecar.recv>>
      try {
        payload = await sidecar.recv(id, 0, { timeoutMs: config.embeddingWaitMs })
      } catch (error) {
        if (error instanceof RecvTimeout)
          throw new EmbeddingMissing({
            message: `image tokens ${id} did not arrive within ${config.embeddingWaitMs} ms`
          })
        throw error
      }
      try {
        if (
          !(payload instanceof Tensor) ||
          payload.dtype !== "int64" ||
          payload.shape.length !== 2 ||
          payload.shape[0] !== 1 ||
          payload.shape[1] !== spec.imageTokens
        )
          throw new BadRequest({
            message: `${id} is not an image's tokens: this model decodes an int64 [1, ${spec.imageTokens}] tensor`
          })
        const tokens = (payload.data as BigInt64Array).slice()
        const foreign = tokens.find((token) => token < 0n || token >= BigInt(spec.codebookSize))
        if (foreign !== undefined)
          throw new BadRequest({ message: `image token ${foreign} is not in the codebook (${spec.codebookSize})` })
        return tokens
      } finally {
        await sidecar.markDone(id)
      }
    }

    const generate = Effect.gen(function* () {
      const body = yield* HttpServerRequest.schemaBodyJson(GenerateRequest)
      const ids = typeof body.embeddings === "string" ? [body.embeddings] : body.embeddings
      if (ids.length !== 1 || body.skipTokens !== 0)
        return yield* new BadRequest({
          message: "a Janus image decodes from one forwarded datum of image tokens, whole"
        })
      const span = yield* RequestSpan
      const tokens = yield* Effect.tryPromise({
        try: () => inSpan("receive image tokens", { parent: span }, () => takeTokens(ids[0]!)),
        catch: (error) => error
      })
      const meta: GeriItemMeta = {
        width: body.width ?? spec.imageSide,
        height: body.height ?? spec.imageSide,
        chunks: 0,
        seed: body.seed ?? randomInt(2 ** 31)
      }
      const result = yield* engine.runOne<GeriImageResult>({
        key: `${meta.width}x${meta.height}`,
        inputs: { generated_tokens: { dtype: "int64", shape: [1, tokens.length], data: tokens } },
        meta,
        ...(yield* workItemContext)
      })
      const answer: ImageAnswer = {
        image: Buffer.from(result.png).toString("base64"),
        width: result.width,
        height: result.height,
        mimeType: "image/png"
      }
      return HttpServerResponse.unsafeJson(answer)
    }).pipe(Effect.catchAll(errorAnswer))

    return {
      info: {
        modality: "image",
        generator: { modality: "image", height: spec.imageSide, width: spec.imageSide, imageTokens: spec.imageTokens },
        sidecarNode: sidecar.nodeId
      },
      routes: HttpRouter.empty.pipe(HttpRouter.post("/generate", generate))
    }
  })
