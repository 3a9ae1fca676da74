/**
 * The contract between the app driver, the dispatcher and the metrics: what a request's dispatch is
 * asked with and answers, what the platform is told of requests and calls as they end, and how a
 * dispatch's failure reaches the app's process. Its own module, so that none of the three imports another.
 */
import type { DispatchFailure } from "../app-runtime/driver/protocol.js"
import type { TaskGraphWire } from "../app-runtime/tasks/TaskGraph.js"
import type { Span } from "../tracing/Tracing.js"
import type {
  DispatchFailed,
  InvalidTaskGraph,
  RequestCancelled,
  TaskInputRejected,
  TaskUnavailable
} from "./errors.js"
import type { RequestTiming } from "../metrics/BusyClock.js"

export interface DispatchOutcome {
  readonly outputs: ReadonlyArray<unknown>
  readonly stream?: AsyncIterable<unknown>
}

/** An app's claim on the tasks it shares with others: its weight, and its limit on calls per task. */
export interface AppShare {
  readonly app: string
  /** Its share of a shared task's executors against the other apps' (default 1). */
  readonly weight: number
  /** Calls it may have in flight to one task; more wait at the dispatcher. */
  readonly maxCallsPerTask?: number
}

/** What a request's dispatches carry besides the graph. */
export interface DispatchRequest {
  /** Counts the request's time inside executors. */
  readonly timing?: RequestTiming
  /** The request's span in the app: the dispatches' spans are its children. */
  readonly span?: Span
  readonly share?: AppShare
}

/** Runs a recorded graph for the app (the task dispatcher). */
export type GraphDispatcher = (
  graph: TaskGraphWire,
  requestId: string,
  signal: AbortSignal,
  request?: DispatchRequest
) => Promise<DispatchOutcome>

/** Told where each request's time went once it ends (for the metrics). */
export interface RequestObserver {
  /**
   * `seconds` from the request's hand-over to the app until its answer ended, of which
   * `dispatchSeconds` inside task dispatches and `executorSeconds` inside executor calls.
   */
  ended(appId: string, seconds: number, dispatchSeconds: number, executorSeconds: number): void
}

export type DispatchError = TaskInputRejected | TaskUnavailable | DispatchFailed | InvalidTaskGraph | RequestCancelled

const dispatchErrorTags = new Set<string>([
  "TaskInputRejected",
  "TaskUnavailable",
  "DispatchFailed",
  "InvalidTaskGraph",
  "RequestCancelled"
] satisfies ReadonlyArray<DispatchError["_tag"]>)

export const isDispatchError = (error: unknown): error is DispatchError =>
  typeof (error as { readonly _tag?: unknown } | null)?._tag === "string" &&
  dispatchErrorTags.has((error as { readonly _tag: string })._tag)

/** A dispatch's failure as the app's worker learns it; anything unexpected is the platform's failure. */
export const dispatchFailureOf = (error: unknown): DispatchFailure =>
  isDispatchError(error)
    ? { code: error._tag, message: error.message }
    : { code: "DispatchFailed", message: error instanceof Error ? error.message : String(error) }

/** What the dispatcher reports of executor calls. */
export interface CallObserver {
  /** A call ended: `seconds` from its start to its answer (to its last chunk for a stream). */
  readonly call: (taskId: string, operation: string, outcome: "ok" | "error", seconds: number) => void
  /** A streamed call's first chunk came `seconds` after the call began. */
  readonly firstChunk: (taskId: string, seconds: number) => void
  /** A streamed call's next chunk came `seconds` after the one before it. */
  readonly nextChunk: (taskId: string, seconds: number) => void
  /** An executor of the task was leased `seconds` after it was asked for (waiting for a healthy one). */
  readonly leaseWait: (taskId: string, seconds: number) => void
  /** A graph is run again as a whole, for `reason`. */
  readonly retried: (reason: "unavailable") => void
  /** An LLM stream of the task broke off and is carried on by a fresh run. */
  readonly failover: (taskId: string) => void
}
