/**
 * One call's request to an executor and how its answer is read: the context a call runs in, its
 * body encoded with the executor's API schema (the executors' own api.ts) and posted with the
 * call's credential, trace and share; an answer decoded with its schema, a failed one turned into
 * the caller's error; an invocation's recorded input, output and config read with its task's
 * schema. Each operation's call (ExecutorCalls.ts) is built on these.
 */
import * as Either from "effect/Either"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import { ErrorBody } from "../../executors/common/errors.js"
import { type Share, shareHeaders } from "../../executors/common/FairShare.js"
import type { Modality } from "../../executors/llm/api.js"
import type { Payload } from "../../sidecar/SidecarClient.js"
import { DispatchFailed, InvalidTaskGraph, TaskUnavailable } from "../errors.js"
import { type ExecutorCallError, fromExecutor, remoteError } from "../RemoteError.js"
import type { EmbeddingCache } from "./EmbeddingCache.js"
import { credentialHeaders, type ExecutorAnswer, postJson } from "./ExecutorHttp.js"

export interface CallContext {
  /**
   * The internal secret (ServeConfig's `internalSecret`), which executors take calls with: a call
   * without it is refused (401).
   */
  readonly credential?: string
  /**
   * The nodes whose executors consume the data the call forwards, a node once for each consumer
   * there (the sidecar frees a datum once each has marked it done).
   */
  readonly receivers: ReadonlyArray<string>
  /** One datum's receivers, where the call's data differ in their consumers (see `receivers`). */
  readonly receiversOf?: (id: string) => ReadonlyArray<string>
  /** The modality of each forwarded datum an encoder produces, by id. */
  readonly modalities: ReadonlyMap<string, Modality>
  readonly signal: AbortSignal
  /** For a chat call that goes on where a failed one stopped: the tokens its client has already seen. */
  readonly continuation?: ReadonlyArray<number>
  /** The call's span, as the executor's parent (W3C trace context). */
  readonly traceparent?: string
  /** Encoder calls: the cache of encoder outputs, when the platform keeps one. */
  readonly embeddings?: EmbeddingCaching
  /** The app the call is for and its weight: an executor's queue is fair between apps. */
  readonly share?: Share
}

/** What an encoder call needs to use the cache of encoder outputs. */
export interface EmbeddingCaching {
  readonly cache: EmbeddingCache
  /** This node: an item to be cached is sent here by the encoder, then forwarded. */
  readonly node: string
  /** Every chunk of a transfer, taken out of this node's sidecar into memory of its own. */
  readonly take: (id: string) => Promise<ReadonlyArray<Payload>>
  /** Sends chunks as one transfer to the nodes, as the encoder would have. */
  readonly forward: (id: string, chunks: ReadonlyArray<Payload>, to: ReadonlyArray<string>) => Promise<void>
  /** Takes whatever arrived of these transfers out of this node's sidecar (a call that failed or was cancelled). */
  readonly discard: (ids: ReadonlyArray<string>) => void
  /** Each cacheable item's lookup, for the metrics. */
  readonly observe: (taskId: string, outcome: "hit" | "miss") => void
}

export interface CallResult {
  readonly output: unknown
  /** The streamed chunks of a streaming invocation. */
  readonly stream?: AsyncIterable<unknown>
  /**
   * A call that answered its output early and goes on (a thinker streaming the rest of its
   * answer to another task through the sidecar): settles when the executor's work ends, rejects
   * with its failure, which fails the request.
   */
  readonly goesOn?: Promise<void>
}

const decodeErrorBody = Schema.decodeUnknownEither(Schema.parseJson(ErrorBody))

/** A failed answer's error: its body's code when it has one, else what its status says. */
const failedAnswer = async (response: ExecutorAnswer): Promise<ExecutorCallError> => {
  const text = await response.text()
  const body = decodeErrorBody(text)
  if (Either.isRight(body)) return remoteError(body.right.error, fromExecutor)
  const message = `the executor answered HTTP ${response.status}: ${text.slice(0, 200)}`
  return response.status === 503 ? new TaskUnavailable({ message }) : new DispatchFailed({ message })
}

/** A value read with a schema; one that does not match fails with `failure` of what is wrong. */
const decodeOrFail =
  (failure: (wrong: string) => DispatchFailed | InvalidTaskGraph) =>
  <A, I>(schema: Schema.Schema<A, I>) =>
  (value: unknown): A =>
    Either.getOrThrowWith(Schema.decodeUnknownEither(schema)(value), (error) =>
      failure(ParseResult.TreeFormatter.formatErrorSync(error))
    )

/** An answer that does not match its executor's API is the executor's fault. */
export const decodeAnswer = decodeOrFail(
  (wrong) => new DispatchFailed({ message: `the executor's answer does not match its API: ${wrong}` })
)

/** An invocation's recorded input, output or config, read with the schema its task wrote it with. */
export const decodeInvocation = decodeOrFail(
  (wrong) => new InvalidTaskGraph({ message: `a task invocation does not match its task: ${wrong}` })
)

/**
 * Posts a call's body, encoded with the executor's API schema, with the call's credential, trace and
 * share; answers the response when it is ok. An executor that does not answer is unavailable (and
 * unreachable); a failed answer is the caller's error (see `failedAnswer`).
 */
export const post = async <A, I>(
  url: string,
  schema: Schema.Schema<A, I>,
  body: A,
  { signal, traceparent, share, credential }: CallContext
): Promise<ExecutorAnswer> => {
  let response: ExecutorAnswer
  try {
    response = await postJson(url, JSON.stringify(Schema.encodeSync(schema)(body)), signal, {
      ...(credential === undefined ? {} : credentialHeaders(credential)),
      ...(traceparent === undefined ? {} : { traceparent }),
      ...(share === undefined ? {} : { [shareHeaders.app]: share.app, [shareHeaders.weight]: String(share.weight) })
    })
  } catch (error) {
    if (signal.aborted) throw error
    throw new TaskUnavailable({
      message: `the executor at ${url} did not answer: ${(error as Error).message}`,
      unreachable: true
    })
  }
  if (response.ok) return response
  throw await failedAnswer(response)
}

/** A forwarded datum as an invocation records it: the id the sidecar knows it by. */
export const ForwardedId = Schema.transform(Schema.Struct({ $dataForward: Schema.String }), Schema.String, {
  strict: true,
  decode: (forward) => forward.$dataForward,
  encode: (id) => ({ $dataForward: id })
})
