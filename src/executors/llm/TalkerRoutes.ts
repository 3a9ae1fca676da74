/**
 * The LLM executor's router on a talker (model_type "cornserve_talker"): `POST /v1/cornserve/talk`
 * reads a thinker's hidden states from the sidecar (float32 [rows, thinker hidden], the
 * LLMEmbeddingTask's "hidden_states"), has the engine write codec frames from them
 * (TalkerRunner.ts) and streams each frame as an NDJSON line as soon as it is chosen, then a done
 * line; a failure midway is an error line. Chat completions and prompt embeddings are refused
 * with a 400 that says so.
 */
import { randomInt } from "node:crypto"
import * as HttpRouter from "@effect/platform/HttpRouter"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as Effect from "effect/Effect"
import * as Stream from "effect/Stream"
import type { ModelDirectory } from "../../models/ModelDirectory.js"
import { talkerSpec } from "../../models/TalkerModel.js"
import { RecvTimeout } from "../../sidecar/errors.js"
import { type Payload, SidecarClient } from "../../sidecar/SidecarClient.js"
import { Tensor } from "../../sidecar/Tensor.js"
import type { EngineClient } from "../common/EngineClient.js"
import type { ExecutorConfig } from "../common/ExecutorConfig.js"
import { BadRequest, ContextLengthExceeded, EmbeddingMissing, ModelNotFound } from "../common/errors.js"
import { answeredFailure, errorAnswer, errorBody, workItemContext } from "../common/Router.js"
import type { WorkItem } from "../common/wire.js"
import { type LlmStats, type ModelList, TalkRequest, type TalkLine } from "./api.js"
import { contextLength, kvBudget } from "./Limits.js"
import type { GenerateMeta, GenerateResult, LlmRequestMeta, TokenPartial } from "./protocol.js"

const ndjson = (line: TalkLine) => Buffer.from(`${JSON.stringify(line)}\n`)

export const talkerRouter = (config: ExecutorConfig, engine: EngineClient, model: ModelDirectory) =>
  Effect.gen(function* () {
    const spec = yield* Effect.try({ try: () => talkerSpec(model), catch: (error) => error as Error })
    if (config.sidecarSocket === undefined)
      return yield* Effect.fail(
        new Error("a talker takes its thinker's hidden states from a sidecar: give it --sidecar-socket")
      )
    const sidecar = yield* Effect.acquireRelease(
      Effect.tryPromise({ try: () => SidecarClient.connect(config.sidecarSocket!), catch: (error) => error as Error }),
      (client) => Effect.promise(() => client.close())
    )
    const maxModelLength = spec.maxPositions ?? contextLength(model)
    const created = Math.floor(Date.now() / 1000)
    yield* Effect.logInfo(
      `${config.model}: a talker, ${spec.codebooks} codebooks of ${spec.codebookSize} codes at ${spec.frameRate} frames a second`
    )

    const checkModel = (name: string | undefined) =>
      name === undefined || name === config.model
        ? Effect.void
        : Effect.fail(new ModelNotFound({ message: `this executor serves "${config.model}", not "${name}"` }))

    const talkOnly = Effect.fail(
      new BadRequest({
        message: `${config.model} is a talker: it writes codec frames from a thinker's hidden states (POST /v1/cornserve/talk, a TalkerTask), not text`
      })
    ).pipe(Effect.catchAll(errorAnswer))

    /** Every chunk of the hidden states, in order, as [rows, thinker hidden]; the chunks are then released. */
    const hiddenStates = async (id: string): Promise<Float32Array> => {
      const parts: Array<Float32Array> = []
      for (let chunk = 0; ; chunk++) {
        let payload: Payload | undefined
        try {
          payload = await sidecar.recv(id, chunk, { timeoutMs: config.embeddingWaitMs })
        } catch (error) {
          if (chunk === 0 && error instanceof RecvTimeout)
            throw new EmbeddingMissing({
              message: `hidden states ${id} did not arrive within ${config.embeddingWaitMs} ms`
            })
          throw error
        }
        if (payload === undefined) break
        const fits =
          payload instanceof Tensor &&
          payload.dtype === "float32" &&
          payload.shape.length === 2 &&
          payload.shape[1] === spec.thinkerHiddenSize
        // Copied before the chunk is released: its memory is the sidecar's.
        if (fits) parts.push(((payload as Tensor).data as Float32Array).slice())
        await sidecar.markDone(id, chunk)
        if (!fits)
          throw new BadRequest({
            message: `hidden states ${id} chunk ${chunk} is not a float32 [rows, ${spec.thinkerHiddenSize}] tensor: this talker reads a thinker ${spec.thinkerHiddenSize} wide`
          })
      }
      const data = new Float32Array(parts.reduce((sum, part) => sum + part.length, 0))
      let at = 0
      for (const part of parts) {
        data.set(part, at)
        at += part.length
      }
      return data
    }

    const talk = Effect.gen(function* () {
      const body = yield* HttpServerRequest.schemaBodyJson(TalkRequest)
      yield* checkModel(body.model)
      const states = yield* Effect.tryPromise({ try: () => hiddenStates(body.embeddings), catch: (error) => error })
      const rows = states.length / spec.thinkerHiddenSize
      if (rows === 0) return yield* new BadRequest({ message: `hidden states ${body.embeddings} are empty` })
      const maxFrames = body.maxFrames ?? spec.defaultMaxFrames
      if (rows + maxFrames > maxModelLength)
        return yield* new ContextLengthExceeded({
          message: `this talker's maximum context is ${maxModelLength} positions; the hidden states take ${rows} and maxFrames ${maxFrames}`
        })
      const meta: GenerateMeta = {
        op: "generate",
        prompt: {
          inputIds: new Int32Array(rows),
          media: [{ start: 0, rows, input: { kind: "embedding", data: states, shape: [rows, spec.thinkerHiddenSize] } }]
        },
        sampling: {
          temperature: body.temperature ?? 0,
          topP: body.topP ?? 1,
          seed: body.seed ?? randomInt(2 ** 31),
          maxNewTokens: maxFrames,
          stopTokenIds: []
        }
      }
      const item: WorkItem<GenerateMeta> = { key: meta.op, inputs: {}, meta, ...(yield* workItemContext) }
      const lines = Stream.async<Uint8Array>((emit) => {
        let frames = 0
        const submitted = engine.submit<GenerateResult, TokenPartial>([item], (_, partial) => {
          if (partial.frame === undefined) return
          frames++
          void emit.single(ndjson({ frame: partial.frame }))
        })
        submitted.results.then(
          ([result]) => {
            const finishReason = result!.finishReason === "stop" ? "stop" : "length"
            void emit.single(ndjson({ done: true, frames, finishReason, frameRate: spec.frameRate }))
            void emit.end()
          },
          (failure: unknown) => {
            void emit.single(ndjson(errorBody(Effect.runSync(answeredFailure(failure)))))
            void emit.end()
          }
        )
        return Effect.sync(() => engine.cancel(submitted.id))
      })
      return HttpServerResponse.stream(lines, { contentType: "application/x-ndjson" })
    }).pipe(Effect.catchAll(errorAnswer))

    const stats = Effect.gen(function* () {
      const result = yield* engine.runOne<LlmStats>({
        key: "stats",
        inputs: {},
        meta: { op: "stats" } satisfies LlmRequestMeta
      })
      return HttpServerResponse.unsafeJson(result)
    }).pipe(Effect.catchAll(errorAnswer))

    const models: ModelList = {
      object: "list",
      data: [{ id: config.model, object: "model", created, owned_by: "cornserve", max_model_len: maxModelLength }]
    }

    return {
      info: {
        modalities: [],
        encoders: [],
        maxModelLength,
        kvCacheBytesPerDevice: kvBudget(config, model).totalBytes,
        sidecarNode: sidecar.nodeId,
        talker: { codebooks: spec.codebooks, codebookSize: spec.codebookSize, frameRate: spec.frameRate }
      },
      routes: HttpRouter.empty.pipe(
        HttpRouter.post("/v1/chat/completions", talkOnly),
        HttpRouter.get(
          "/v1/models",
          Effect.sync(() => HttpServerResponse.unsafeJson(models))
        ),
        HttpRouter.post("/v1/cornserve/prompt-embeddings", talkOnly),
        HttpRouter.post("/v1/cornserve/kv-prefill", talkOnly),
        HttpRouter.post("/v1/cornserve/talk", talk),
        HttpRouter.get("/v1/cornserve/stats", stats)
      )
    }
  })
