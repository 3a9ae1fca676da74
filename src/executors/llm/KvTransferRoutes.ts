/**
 * A prompt's KV cache between two LLM executors of one model, through the sidecar: prefill and
 * decode apart. `POST /v1/cornserve/kv-prefill` renders a chat's messages as a chat completion
 * would, runs its whole blocks but the last token (PrefixTransfer.ts) and sends their keys and
 * values under the request's id; a chat completion on the decode executor that names that id
 * (`cornserve_kv`) takes them into its prefix cache first, so that it prefills only the rest of
 * the prompt and then decodes, as after any prefix cache hit.
 */
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as Effect from "effect/Effect"
import { RecvTimeout } from "../../sidecar/errors.js"
import type { SidecarClient } from "../../sidecar/SidecarClient.js"
import { Tensor } from "../../sidecar/Tensor.js"
import { inSpan } from "../../tracing/Tracing.js"
import { BadRequest, EmbeddingMissing, NoSidecar } from "../common/errors.js"
import { errorAnswer, RequestSpan, workItemContext } from "../common/Router.js"
import { KvPrefillRequest, type KvPrefillResponse } from "./api.js"
import { mediaParts } from "./Prompt.js"
import type { PromptEmbeddingsContext } from "./PromptEmbeddingsRoute.js"
import type { KvResult, LlmRequestMeta, PromptInput } from "./protocol.js"

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
            trusted: body.cornserve_parse_special_tokens === true
          },
          body.cornserve_embeddings,
          maxModelLength - 1,
          undefined,
          signal
        )
      )
    )
    // The embeddings go on first: the decode executor builds its prompt from them while this one prefills.
    yield* attempt(() => forwardEmbeddings(sidecar, prompt, forward, receivers))
    const meta: LlmRequestMeta = { op: "kv-export", prompt, id: body.id, receivers }
    const result = yield* engine.runOne<KvResult>({ key: meta.op, inputs: {}, meta, ...(yield* workItemContext) })
    const answer: KvPrefillResponse = {
      id: body.id,
      shape: result.shape!,
      dtype: result.dtype ?? "float32",
      prompt_tokens: prompt.inputIds.length
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
 * Takes the KV cache sent under `id` for `prompt` into every lane's prefix cache (see
 * `cornserve_kv`); answers how many of the prompt's positions it holds. The router waits for the
 * chunks and checks what they are; each lane's worker reads them out of the sidecar itself, and
 * the cache is freed in the sidecar once they have, whatever becomes of it.
 */
export const importKv = ({ engine, sidecar, waitMs }: KvTransferContext, prompt: PromptInput, id: string) =>
  Effect.gen(function* () {
    if (sidecar === undefined) return yield* new NoSidecar()
    const context = yield* workItemContext
    return yield* Effect.gen(function* () {
      const received = yield* attempt(() => arrivedCache(sidecar, id, waitMs))
      if (received === undefined)
        return yield* new BadRequest({
          message: `${id} is not a KV cache: a float32 or float16 tensor [heads, positions, headDim] a chunk, one chunk a cache tensor`
        })
      // No whole block was sent (a prompt shorter than one and a token): the prompt is prefilled here whole.
      if (received.shape[2] === 0) return 0
      const meta: LlmRequestMeta = { op: "kv-import", prompt, id, ...received }
      // Not cut short: the workers read the chunks in place until they answer.
      const result = yield* Effect.uninterruptible(
        engine.runOne<KvResult>({ key: meta.op, inputs: {}, meta, ...context })
      )
      return result.positions ?? 0
    }).pipe(Effect.ensuring(Effect.promise(() => sidecar.markDone(id).catch(() => undefined))))
  })

/**
 * The shape and dtype of the cache sent under `id`, once all of it has arrived (its chunks are
 * read in place, not copied): a cache tensor a chunk, [heads, positions, headDim], all alike;
 * undefined when the transfer is not such a cache.
 */
const arrivedCache = async (sidecar: SidecarClient, id: string, waitMs: number) => {
  let dims: ReadonlyArray<number> | undefined
  let dtype: "float32" | "float16" | undefined
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
    if (!(payload instanceof Tensor)) return undefined
    const kind = payload.dtype
    const alike =
      (kind === "float32" || kind === "float16") &&
      payload.shape.length === 3 &&
      (dims === undefined || (kind === dtype && payload.shape.join() === dims.join()))
    if (!alike) return undefined
    dims = payload.shape
    dtype = kind
  }
  if (dims === undefined || dtype === undefined) return undefined
  return { shape: [chunks, dims[0]!, dims[1]!, dims[2]!] as const, dtype }
}
