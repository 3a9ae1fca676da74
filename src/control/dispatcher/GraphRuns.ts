import type { TaskGraphWire } from "../../app-runtime/tasks/TaskGraph.js"
import type { BusyClock } from "../../metrics/BusyClock.js"
import { type Span, startSpan } from "../../tracing/Tracing.js"
import type { AppShare, DispatchOutcome } from "../DispatchContract.js"
import { RequestCancelled } from "../errors.js"
import { CallPermits } from "./CallPermits.js"
import { passThrough } from "./ChunkStreams.js"

/** What a request's graph runs carry besides the graph: where their time is counted and traced. */
export interface RequestContext {
  /** Counts the time the request spends inside executors. */
  readonly inside: BusyClock | undefined
  /** The request's span in the app: each run of the graph is a child. */
  readonly span: Span | undefined
  /** Its app's claim on shared tasks: sent to the executors (fair queuing), and its limit per task. */
  readonly share: AppShare | undefined
  /** Why this run is a second one. */
  readonly retry?: "unavailable"
}

/** One run of a request's graph: every invocation sent to an executor of its task. */
export type GraphRun = (
  graph: TaskGraphWire,
  requestId: string,
  signal: AbortSignal,
  context: RequestContext,
  /** Invocation index → the executor a previous try leased for it (avoided now, and set to this try's). */
  tried: Map<number, string>,
  /** Tokens of the last (chat) invocation its client has seen already, when it goes on from a failure. */
  continuation?: ReadonlyArray<number>
) => Promise<DispatchOutcome>

/**
 * Failures before any call was made: a task that was full or had no executor for the lease's whole
 * wait. Running the graph again would only wait or be refused again.
 */
export const refusedWhileLeasing = new WeakSet<object>()

/**
 * Runs of a graph, each one span (`dispatch`) from its first lease to its last call's end or
 * stream's end; a run of an app with a limit on its calls per task first takes its permits, and
 * gives them back at the same end.
 */
export const spannedRuns = (run: GraphRun): GraphRun => {
  const permits = new CallPermits()
  return async (graph, requestId, signal, context, tried, continuation) => {
    const span = startSpan("dispatch", { parent: context.span })
    if (span.recording) {
      span.attribute("cornserve.tasks", graph.invocations.map((invocation) => invocation.taskId).join(","))
      if (context.retry !== undefined) span.attribute("cornserve.dispatch.retry", context.retry)
      if (continuation !== undefined) span.attribute("cornserve.dispatch.continuation_tokens", continuation.length)
    }
    const limit = context.share?.maxCallsPerTask
    let releasePermits = () => {}
    if (limit !== undefined) {
      const waiting = startSpan("wait for the app's calls per task", { parent: span })
      try {
        releasePermits = await permits.acquire(
          context.share!.app,
          graph.invocations.map((invocation) => invocation.taskId),
          limit,
          signal
        )
        waiting.end()
      } catch (error) {
        waiting.end(error)
        span.end(error)
        throw signal.aborted ? new RequestCancelled({ requestId }) : error
      }
    }
    if (!span.recording && limit === undefined)
      return run(graph, requestId, signal, { ...context, span }, tried, continuation)
    const finish = (error?: unknown) => {
      releasePermits()
      span.end(error)
    }
    try {
      const outcome = await run(graph, requestId, signal, { ...context, span }, tried, continuation)
      if (outcome.stream === undefined) {
        finish()
        return outcome
      }
      return {
        ...outcome,
        stream: passThrough(
          outcome.stream,
          () => finish(),
          (error) => {
            finish(error)
            throw error
          }
        )
      }
    } catch (error) {
      finish(error)
      throw error
    }
  }
}
