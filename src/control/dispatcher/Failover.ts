import { randomUUID } from "node:crypto"
import { renameDataForwards } from "../../app-runtime/tasks/DataForward.js"
import type { TaskGraphWire } from "../../app-runtime/tasks/TaskGraph.js"
import type { LlmChunk } from "../../executors/llm/api.js"
import type { CallObserver, DispatchOutcome, DispatchRequest } from "../DispatchContract.js"
import { DispatchFailed, TaskUnavailable } from "../errors.js"
import { type GraphRun, type RequestContext, refusedWhileLeasing } from "./GraphRuns.js"

/** How many times one LLM stream is carried on elsewhere before its failure is the client's. */
const maxFailovers = 3
/** How long a broken-off stream waits for an executor of its task (a restart, say) before it fails. */
const failoverWaitMs = 30_000
const failoverPauseMs = 250

/** A stream failure another executor could recover from: not the input's fault, not a cancellation. */
const breaksOff = (error: unknown): boolean => {
  const tag = (error as { readonly _tag?: unknown } | null)?._tag
  return tag === "TaskUnavailable" || tag === "DispatchFailed"
}

const pause = () => new Promise((resolve) => setTimeout(resolve, failoverPauseMs))

/** The graph under fresh data ids, and the way back from them to the graph's own. */
const freshIds = (graph: TaskGraphWire) => {
  const fresh = new Map<string, string>()
  const original = new Map<string, string>()
  const renamed = renameDataForwards(graph, (id) => {
    let next = fresh.get(id)
    if (next === undefined) {
      next = randomUUID().replaceAll("-", "")
      fresh.set(id, next)
      original.set(next, id)
    }
    return next
  }) as TaskGraphWire
  return { renamed, original: (id: string) => original.get(id) ?? id }
}

/**
 * A request's dispatch, made of runs of its graph, each under data ids of its own (never the
 * app's): a graph that fails as unavailable before anything
 * of it reached the app (an LLM's node was lost, the sidecar went away) is run once more as a whole,
 * under fresh data ids.
 *
 * An LLM stream that breaks off (its executor died, its node was lost) goes on: the graph runs again
 * under fresh data ids (its encoders embed the media again), on another executor of the task or on
 * the restarted one, told the tokens the app has already been given; the app sees one stream. With
 * greedy decoding the whole text is the text of a run without the failure.
 */
export const withFailover = (dispatchGraph: GraphRun, observer: CallObserver | undefined) => {
  /** The LLM stream of a fresh run of the graph, going on after `tokens`; waits for an executor for a bounded time. */
  const resume = async (
    graph: TaskGraphWire,
    requestId: string,
    signal: AbortSignal,
    context: RequestContext,
    tokens: ReadonlyArray<number>,
    /** The executors of the run whose stream broke off: each try avoids those of the one before. */
    tried: Map<number, string>
  ): Promise<AsyncIterable<unknown>> => {
    const deadline = Date.now() + failoverWaitMs
    for (;;) {
      try {
        const outcome = await dispatchGraph(freshIds(graph).renamed, requestId, signal, context, tried, tokens)
        if (outcome.stream === undefined) throw new DispatchFailed({ message: "the resumed LLM call did not stream" })
        return outcome.stream
      } catch (error) {
        // The executor that failed may still be in rotation for a moment, or being restarted.
        if (!(error instanceof TaskUnavailable) || signal.aborted || Date.now() > deadline) throw error
        await pause()
      }
    }
  }

  /** The chunks of an LLM stream, carried on elsewhere when it breaks off; the app sees one stream. */
  async function* failingOver(
    graph: TaskGraphWire,
    first: AsyncIterable<unknown>,
    requestId: string,
    signal: AbortSignal,
    context: RequestContext,
    tried: Map<number, string>
  ): AsyncIterable<unknown> {
    const taskId = graph.invocations[graph.invocations.length - 1]!.taskId
    const said: Array<number> = []
    /**
     * A stream the executor says no token ids for (several choices, tool calls, an answer held to a
     * schema) cannot be carried on where it broke off.
     */
    let resumable = true
    let identity: { readonly id: string; readonly created: number } | undefined
    let stream = first
    for (let failovers = 0; ; failovers++) {
      try {
        for await (const chunk of stream) {
          const { cornserve_token_ids: tokens, ...rest } = chunk as LlmChunk
          if (tokens !== undefined) said.push(...tokens)
          if (tokens === undefined) resumable = false
          identity ??= { id: rest.id, created: rest.created }
          // The continuation's chunks keep the first executor's completion id.
          yield { ...rest, id: identity.id, created: identity.created }
        }
        return
      } catch (error) {
        if (signal.aborted || !resumable || failovers >= maxFailovers || !breaksOff(error)) throw error
        observer?.failover(taskId)
        stream = await resume(graph, requestId, signal, context, said, tried)
      }
    }
  }

  return async (
    graph: TaskGraphWire,
    requestId: string,
    signal: AbortSignal,
    request: DispatchRequest = {}
  ): Promise<DispatchOutcome> => {
    const context: RequestContext = { inside: request.timing?.executors, span: request.span, share: request.share }
    // The executors the first try leased: its second avoids them where their task has others (one
    // on a node just lost may still look healthy when its call was cut short by another's failure).
    const tried = new Map<number, string>()
    const outcome = await (async () => {
      try {
        // Every run goes under data ids of the platform's own: the ids an app names (it is hostile
        // code, and may name another app's) never reach a sidecar; its outputs come back under them.
        const { renamed, original } = freshIds(graph)
        const first = await dispatchGraph(renamed, requestId, signal, context, tried)
        return { ...first, outputs: first.outputs.map((output) => renameDataForwards(output, original)) }
      } catch (error) {
        if (!(error instanceof TaskUnavailable) || signal.aborted || refusedWhileLeasing.has(error)) throw error
        // Nothing of this graph reached the app: it runs once more, every invocation on an executor
        // that is there now, and under fresh data ids, since the first try's may have been sent
        // already (to a node that is gone, say).
        // A graph that found something gone (an executor, its node, a sidecar) is tried until one is
        // there again, for a bounded time; one an executor refused for room, once.
        const deadline = Date.now() + failoverWaitMs
        for (;;) {
          const { renamed, original } = freshIds(graph)
          observer?.retried("unavailable")
          try {
            const again = await dispatchGraph(renamed, requestId, signal, { ...context, retry: "unavailable" }, tried)
            return { ...again, outputs: again.outputs.map((output) => renameDataForwards(output, original)) }
          } catch (retryError) {
            const goneAgain =
              retryError instanceof TaskUnavailable &&
              retryError.unreachable === true &&
              !refusedWhileLeasing.has(retryError)
            if (!goneAgain || signal.aborted || Date.now() > deadline) throw retryError
            await pause()
          }
        }
      }
    })()
    const last = graph.invocations[graph.invocations.length - 1]
    if (outcome.stream === undefined || last?.operation !== "chat") return outcome
    return { ...outcome, stream: failingOver(graph, outcome.stream, requestId, signal, context, tried) }
  }
}
