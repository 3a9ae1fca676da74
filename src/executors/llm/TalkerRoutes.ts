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
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Schema from "effect/Schema"
import type { ModelDirectory } from "../../models/ModelDirectory.js"
import { talkerSpec } from "../../models/TalkerModel.js"
import { SidecarClient } from "../../sidecar/SidecarClient.js"
import type { EngineClient } from "../common/EngineClient.js"
import type { ExecutorConfig } from "../common/ExecutorConfig.js"
import { BadRequest, ContextLengthExceeded } from "../common/errors.js"
import { ndjsonAnswer } from "../common/NdjsonAnswer.js"
import { receiveChunks, receiveRows } from "../common/SidecarRows.js"
import { errorAnswer, workItemContext } from "../common/Router.js"
import type { WorkItem } from "../common/wire.js"
import { TalkRequest, type TalkLine, TranscriptChunk } from "./api.js"
import { contextLength, kvBudget } from "./Limits.js"
import { modelRoutes } from "./ModelRoutes.js"
import type { GenerateMeta, GenerateResult, TokenPartial } from "./protocol.js"

const decodeTranscript = Schema.decodeUnknownEither(Schema.parseJson(TranscriptChunk))

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
    yield* Effect.logInfo(
      `${config.model}: a talker, ${spec.codebooks} codebooks of ${spec.codebookSize} codes at ${spec.frameRate} frames a second`
    )

    const { checkModel, models, stats } = modelRoutes(config.model, engine, maxModelLength)

    const talkOnly = Effect.fail(
      new BadRequest({
        message: `${config.model} is a talker: it writes codec frames from a thinker's hidden states (POST /v1/cornserve/talk, a TalkerTask), not text`
      })
    ).pipe(Effect.catchAll(errorAnswer))

    const talk = Effect.gen(function* () {
      const body = yield* HttpServerRequest.schemaBodyJson(TalkRequest)
      yield* checkModel(body.model)
      // Trailing: the first chunk is the prompt; the worker reads the rest as they come (TrailingRows.ts).
      const { rows: states } = yield* Effect.tryPromise({
        try: () =>
          receiveRows(
            sidecar,
            body.embeddings,
            config.embeddingWaitMs,
            "hidden states",
            spec.thinkerHiddenSize,
            body.trailing === true ? 1 : undefined
          ),
        catch: (error) => error
      })
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
        },
        ...(body.trailing === true ? { trailing: { id: body.embeddings, firstChunk: 1 } } : {})
      }
      const item: WorkItem<GenerateMeta> = { key: meta.op, inputs: {}, meta, ...(yield* workItemContext) }
      const transcript = body.transcript
      return ndjsonAnswer<GenerateResult, TokenPartial>(engine, item, (send) => {
        let frames = 0
        // The thinker's text, passed on as it comes; the last line waits for its end.
        const said =
          transcript === undefined
            ? Promise.resolve([])
            : receiveChunks(sidecar, transcript, config.embeddingWaitMs, "transcript", (payload, chunk) => {
                const piece = typeof payload === "string" ? decodeTranscript(payload) : undefined
                if (piece === undefined || Either.isLeft(piece))
                  throw new BadRequest({
                    message: `transcript ${transcript} chunk ${chunk} is not a transcript's piece`
                  })
                const line: TalkLine =
                  "text" in piece.right
                    ? { text: piece.right.text }
                    : {
                        textDone: {
                          finishReason: piece.right.finish_reason,
                          completionTokens: piece.right.completion_tokens
                        }
                      }
                send(line)
              })
        said.catch(() => undefined)
        return {
          partial: (value) => {
            if (value.frame === undefined) return
            frames++
            send({ frame: value.frame } satisfies TalkLine)
          },
          done: async (result): Promise<TalkLine> => {
            await said
            return {
              done: true,
              frames,
              finishReason: result.finishReason === "stop" ? "stop" : "length",
              frameRate: spec.frameRate
            }
          }
        }
      })
    }).pipe(Effect.catchAll(errorAnswer))

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
        HttpRouter.get("/v1/models", models),
        HttpRouter.post("/v1/cornserve/prompt-embeddings", talkOnly),
        HttpRouter.post("/v1/cornserve/kv-prefill", talkOnly),
        HttpRouter.post("/v1/cornserve/talk", talk),
        HttpRouter.get("/v1/cornserve/stats", stats)
      )
    }
  })
