import * as Either from "effect/Either"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import { Packr } from "msgpackr"
import type { DType, TensorData } from "../../sidecar/Tensor.js"
import { EngineUnavailable, ExecutorError, ExecutorFailed, InternalError } from "./errors.js"
import type { Share } from "./FairShare.js"

/**
 * The one codec for every message between an executor's router, engine and workers. `moreTypes`
 * keeps typed arrays intact (the default codec corrupts them).
 */
const packr = new Packr({ moreTypes: true, useRecords: false })

export const encode = (message: unknown): Buffer => packr.pack(message)
export const decode = <T>(bytes: Uint8Array): T => packr.unpack(bytes) as T

/**
 * Sends messages on a ZeroMQ socket in order. A socket takes one send at a time: after a run of
 * sends that completed at once it defers the next, and a send issued meanwhile throws EBUSY, which
 * under load (hundreds of tokens or chunks a second) would drop messages. Messages sent while the
 * previous frame is still going out (or in one tick, as a batch's tokens are) travel as one frame,
 * so a decode step of many requests costs each process one wakeup, not one per token.
 */
export const orderedSender = <M>(socket: { send(frame: Buffer): Promise<void> }): ((message: M) => Promise<void>) => {
  let previous: Promise<void> = Promise.resolve()
  let open: { readonly messages: Array<M>; readonly sent: Promise<void> } | undefined
  return (message) => {
    if (open !== undefined) {
      open.messages.push(message)
      return open.sent
    }
    const messages = [message]
    const sent = previous.then(() => {
      open = undefined
      return socket.send(encode(messages))
    })
    open = { messages, sent }
    previous = sent.catch(() => undefined)
    return sent
  }
}

/** The messages an `orderedSender` sent on a socket, one by one, in order. */
export async function* messagesOf<M>(socket: AsyncIterable<ReadonlyArray<Buffer>>): AsyncGenerator<M> {
  for await (const [frame] of socket) yield* decode<ReadonlyArray<M>>(frame!)
}

/** A tensor inside a message (router → engine): it is stacked with others along its first axis. */
export interface WireTensor {
  readonly dtype: DType
  readonly shape: ReadonlyArray<number>
  readonly data: TensorData
}

/** One unit of work of a request: its inputs, the key that decides what it can be batched with. */
export interface WorkItem<Meta = unknown> {
  readonly key: string
  readonly inputs: Readonly<Record<string, WireTensor>>
  readonly meta: Meta
  /** The traceparent of the router's span of its request: the engine's and workers' spans of it are children. */
  readonly trace?: string
  /** The app that sent its request, and its weight: the engine's queue is fair between apps. */
  readonly share?: Share
}

/** What a router puts on each work item of a request besides its work: its trace and its share. */
export type WorkItemContext = Pick<WorkItem, "trace" | "share">

/** Router → engine. */
export type ToEngine<Meta = unknown> =
  | { readonly t: "request"; readonly id: string; readonly items: ReadonlyArray<WorkItem<Meta>> }
  | { readonly t: "cancel"; readonly id: string }
  /** A worker exited (the router, their parent, saw it): the engine fails what it holds. */
  | { readonly t: "worker-lost"; readonly reason: string }

/** Engine → router. */
export type FromEngine =
  | { readonly t: "ready"; readonly workers: number }
  | { readonly t: "result"; readonly id: string; readonly results: ReadonlyArray<unknown> }
  | { readonly t: "partial"; readonly id: string; readonly item: number; readonly value: unknown }
  | { readonly t: "failed"; readonly id: string; readonly error: typeof ExecutorError.Encoded }
  | { readonly t: "unhealthy"; readonly reason: string }

const encodeError = Schema.encodeSync(ExecutorError)
const decodeError = Schema.decodeUnknownEither(ExecutorError)

/** Engine → router: request `id` failed with `error`, which travels encoded. */
export const failedMessage = (id: string, error: ExecutorError): FromEngine => ({
  t: "failed",
  id,
  error: encodeError(error)
})

/**
 * The error a `failed` message carries, decoded; one that does not decode is a fault of the
 * executor's own processes (they disagree on the wire), never the client's.
 */
export const failureOf = (encoded: unknown): ExecutorError =>
  Either.getOrElse(
    decodeError(encoded),
    (issue) =>
      new InternalError({
        message: `an engine's failure does not decode: ${ParseResult.TreeFormatter.formatErrorSync(issue)}`
      })
  )

/** Where one input of a batch lies in the batch buffer: rows of every item, back to back. */
export interface BatchInput {
  readonly dtype: DType
  /** The whole stacked tensor's shape; its first axis is the sum of the items' rows. */
  readonly shape: ReadonlyArray<number>
  readonly offset: number
  /** Set when the batch did not fit its slot: the bytes travel in the message instead. */
  readonly inline?: TensorData
}

/** One item of a batch, as a worker gets it; `Meta` is what its kind's engine put on it. */
export interface BatchItem<Meta = unknown> {
  readonly requestId: string
  readonly index: number
  readonly meta: Meta
  /** Its rows along the first axis of every input, [start, end). */
  readonly rows: readonly [number, number]
  /** Its request's trace parent (see WorkItem); a worker's span of the item is its child. */
  readonly trace?: string
}

/** Engine → worker: the batch (all of it, through shared memory) and the items this worker runs. */
export interface BatchMessage {
  readonly t: "batch"
  readonly batch: number
  readonly inputs: Readonly<Record<string, BatchInput>>
  readonly items: ReadonlyArray<BatchItem>
  /** This worker's share of the items, [from, to). */
  readonly shard: readonly [number, number]
}

export type ToWorker =
  | BatchMessage
  /** A request in a running batch was cancelled: a model that checks (a long stream) stops its items. */
  | { readonly t: "cancel"; readonly requestId: string }
  | { readonly t: "stop" }

/** Worker → engine. */
export type FromWorker =
  | { readonly t: "ready"; readonly rank: number }
  | { readonly t: "done"; readonly batch: number; readonly rank: number; readonly results: ReadonlyArray<unknown> }
  | { readonly t: "partial"; readonly batch: number; readonly item: number; readonly value: unknown }
  | {
      readonly t: "failed"
      readonly batch: number
      readonly rank: number
      readonly error: typeof ExecutorError.Encoded
    }

/**
 * Worker → engine: worker `rank` failed its shard of batch `batch`. Unavailable when the output could
 * not reach a receiving node (the work can be done again elsewhere); else its model run failed.
 */
export const workerFailedMessage = (
  batch: number,
  rank: number,
  message: string,
  receiverGone: boolean
): FromWorker => {
  const failure = `worker ${rank} failed: ${message}`
  return {
    t: "failed",
    batch,
    rank,
    error: encodeError(
      receiverGone ? new EngineUnavailable({ message: failure }) : new ExecutorFailed({ message: failure })
    )
  }
}
