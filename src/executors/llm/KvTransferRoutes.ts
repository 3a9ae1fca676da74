/**
 * A prompt's KV cache between two LLM executors of one model, through the sidecar: prefill and
 * decode apart. `POST /v1/cornserve/kv-prefill` renders a chat's messages as a chat completion
 * would, runs all of them but the last token (PrefixTransfer.ts) and sends their keys and values
 * under the request's id; a chat completion on the decode executor that names that id
 * (`cornserve_kv`) starts its cache from them, so that it runs only the last token and then
 * decodes.
 */
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as Effect from "effect/Effect"
import { RecvTimeout } from "../../sidecar/errors.js"
import type { SidecarClient } from "../../sidecar/SidecarClient.js"
import { Tensor } from "../../sidecar/Tensor.js"
import { inSpan } from "../../tracing/Tracing.js"
import { BadRequest, ContextLengthExceeded, EmbeddingMissing, NoSidecar } from "../common/errors.js"
import { errorAnswer, RequestSpan, workItemContext } from "../common/Router.js"
import { KvPrefillRequest, type KvPrefillResponse } from "./api.js"
import { mediaParts } from "./Prompt.js"
import type { PromptEmbeddingsContext } from "./PromptEmbeddingsRoute.js"
import type { Generation } from "./Generation.js"
import type { KvImport, KvResult, LlmRequestMeta, PromptInput } from "./protocol.js"

/** What the routes share with the router: its engine, sidecar, and how it checks and builds prompts. */
export interface KvTransferContext
  extends Pick<PromptEmbeddingsContext, "engine" | "maxModelLength" | "checkModel" | "checkMedia" | "buildPrompt"> {
  readonly sidecar: SidecarClient | undefined
  /** How long a decode executor waits for a cache that has not arrived. */
  readonly waitMs: number
}

const attempt = <A>(run: (signal: AbortSignal) => Promise<A>) =>
  Effect.tryPromise({ try: run, catch: (error) => error })

export const kvPrefillRoute = ({
  engine,
  sidecar,
  maxModelLength,
  checkModel,
  checkMedia,
  buildPrompt
}: KvTransferContext) =>
  Effect.gen(function* () {
    const body = yield* HttpServerRequest.schemaBodyJson(KvPrefillRequest)
    yield* checkModel(body.model)
    // As a chat completion: the prompt leaves a position for the answer.
    yield* checkMedia(mediaParts(body.messages), body.cornserve_embeddings, maxModelLength - 1)
    if (sidecar === undefined) return yield* new NoSidecar()
    const forward = body.forward_embeddings ?? []
    if (forward.length > 0 && forward.length !== (body.cornserve_embeddings ?? []).length)
      return yield* new BadRequest({
        message: `forward_embeddings names ${forward.length} ids for ${(body.cornserve_embeddings ?? []).length} cornserve_embeddings`
      })
    const receivers = body.receivers ?? [sidecar.nodeId]
    const span = yield* RequestSpan
    const prompt = yield* attempt((signal) =>
      inSpan("prompt", { parent: span }, () =>
        buildPrompt(
          {
            messages: body.messages,
            addGenerationPrompt: true,
            ...(body.tools === undefined || body.tools === null ? {} : { tools: body.tools }),
            trusted: body.cornserve_parse_special_tokens === true
          },
          body.cornserve_embeddings,
          maxModelLength - 1,
          undefined,
          signal
        )
      )
    )
    // As a chat completion's: the answer needs a position after the prompt.
    if (prompt.inputIds.length >= maxModelLength)
      return yield* new ContextLengthExceeded({
        message: `this model's maximum context length is ${maxModelLength} tokens; the messages take ${prompt.inputIds.length}`
      })
    // The embeddings go on first: the decode executor builds its prompt from them while this one prefills.
    yield* attempt(() => forwardEmbeddings(sidecar, prompt, forward, receivers))
    const meta: LlmRequestMeta = { op: "kv-export", prompt, id: body.id, receivers }
    const result = yield* engine.runOne<KvResult>({ key: meta.op, inputs: {}, meta, ...(yield* workItemContext) })
    const answer: KvPrefillResponse = {
      id: body.id,
      shape: result.shape!,
      dtype: result.dtype ?? "float32",
      prompt_tokens: prompt.inputIds.length,
      cached_tokens: result.cached ?? 0
    }
    return HttpServerResponse.unsafeJson(answer)
  }).pipe(Effect.catchAll(errorAnswer))

/**
 * Sends each media item's embedding of `prompt` (taken from the sidecar: the encoders') on under
 * the next of `ids`, as an encoder sends it: its grid first, where it has one, then its rows.
 */
const forwardEmbeddings = async (
  sidecar: SidecarClient,
  prompt: PromptInput,
  ids: ReadonlyArray<string>,
  to: ReadonlyArray<string>
) => {
  for (const [index, id] of ids.entries()) {
    const input = prompt.media[index]!.input
    if (input.kind !== "embedding") throw new Error(`media item ${index} was not taken from the sidecar`)
    const chunks = [
      ...(input.grid === undefined ? [] : [new Tensor("int32", [input.grid.length], Int32Array.from(input.grid))]),
      new Tensor("float32", [...input.shape], input.data)
    ]
    for (const [chunk, tensor] of chunks.entries())
      await sidecar.send(id, tensor, { to, chunk, numChunks: chunks.length })
  }
}

/**
 * The KV cache sent under `id` for `prompt` (`cornserve_kv`), once it has arrived whole and every
 * lane's model has found that it fits: what the request's generate items carry (GenerateMeta's
 * `kv`), for the worker that runs each to take in place as it joins. Undefined when it holds no
 * positions (a one-token prompt: prefilled here whole). A cache refused is freed at once; one
 * taken, by `releaseKv` once every request that takes it has joined.
 */
export const receiveKv = ({ engine, sidecar, waitMs }: KvTransferContext, prompt: PromptInput, id: string) =>
  Effect.gen(function* () {
    if (sidecar === undefined) return yield* new NoSidecar()
    const context = yield* workItemContext
    const free = Effect.promise(() => sidecar.markDone(id).catch(() => undefined))
    return yield* Effect.gen(function* () {
      const received = yield* attempt(() => arrivedCache(sidecar, id, waitMs))
      if (received === undefined)
        return yield* new BadRequest({
          message: `${id} is not a KV cache: a float32 or float16 tensor [heads, positions, headDim] a chunk, one chunk a cache tensor, then its token ids, int32 [positions]`
        })
      const { shape, dtype, ids } = received
      // A cache of no positions (a one-token prompt), or of a prompt rendered otherwise (the prefill
      // executor was not given the same messages and tools): the prompt is prefilled here whole.
      if (shape[2] === 0 || !startsWith(prompt, ids)) {
        yield* free
        return undefined
      }
      const meta: LlmRequestMeta = { op: "kv-import", prompt, shape, dtype }
      yield* engine.runOne<KvResult>({ key: meta.op, inputs: {}, meta, ...context })
      const kv: KvImport = { id, shape, dtype }
      return kv
    }).pipe(Effect.onError(() => free))
  })

/**
 * Frees a cache `receiveKv` took once each of `generations` has joined (its first token, or its
 * end), or at once when `cancelled` aborts: a cancelled request's answer, whatever its cache held,
 * goes nowhere, and an imported cache never enters the prefix cache.
 */
export const releaseKv = (
  { sidecar }: KvTransferContext,
  kv: KvImport | undefined,
  generations: ReadonlyArray<Generation>,
  cancelled: AbortSignal
) => {
  if (kv === undefined || sidecar === undefined) return
  let freed = false
  const free = () => {
    if (freed) return
    freed = true
    void sidecar.markDone(kv.id).catch(() => undefined)
  }
  cancelled.addEventListener("abort", free, { once: true })
  // A request has joined by its first token; one that failed or ended settles `started` too.
  void Promise.all(generations.map((generation) => generation.started)).then(free)
}

/**
 * The shape and dtype of the cache sent under `id`, once all of it has arrived (its chunks are
 * read in place, not copied): a cache tensor a chunk, [heads, positions, headDim], all alike, then
 * the token ids they are the keys and values of, int32 [positions]; undefined when the transfer is
 * not such a cache.
 */
const arrivedCache = async (sidecar: SidecarClient, id: string, waitMs: number) => {
  let dims: ReadonlyArray<number> | undefined
  let dtype: "float32" | "float16" | undefined
  let ids: Int32Array | undefined
  let chunks = 0
  for (; ; chunks++) {
    let payload: Awaited<ReturnType<SidecarClient["recv"]>>
    try {
      payload = await sidecar.recv(id, chunks, { timeoutMs: waitMs })
    } catch (error) {
      if (chunks === 0 && error instanceof RecvTimeout)
        throw new EmbeddingMissing({ message: `the KV cache ${id} did not arrive within ${waitMs} ms` })
      throw error
    }
    if (payload === undefined) break
    if (!(payload instanceof Tensor) || ids !== undefined) return undefined
    const kind = payload.dtype
    if (kind === "int32" && payload.shape.length === 1 && dims !== undefined && payload.shape[0] === dims[1]) {
      ids = payload.data as Int32Array
      continue
    }
    const alike =
      (kind === "float32" || kind === "float16") &&
      payload.shape.length === 3 &&
      (dims === undefined || (kind === dtype && payload.shape.join() === dims.join()))
    if (!alike) return undefined
    dims = payload.shape
    dtype = kind
  }
  if (dims === undefined || dtype === undefined || ids === undefined) return undefined
  return { shape: [chunks - 1, dims[0]!, dims[1]!, dims[2]!] as const, dtype, ids }
}

/** Whether `ids` are the first tokens of `prompt`. */
const startsWith = (prompt: PromptInput, ids: Int32Array): boolean =>
  ids.length < prompt.inputIds.length && ids.every((token, index) => token === prompt.inputIds[index])
