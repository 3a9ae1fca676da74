import { randomUUID } from "node:crypto"
import { Effect } from "effect"
import { collectDataForwards, dataForwardId, renameDataForwards } from "../../app-runtime/tasks/DataForward.js"
import type { TaskGraphWire, TaskInvocationWire } from "../../app-runtime/tasks/TaskGraph.js"
import { NodeAgent } from "../../node/NodeAgent.js"
import {
  type AppShare,
  type CallObserver,
  type DispatchError,
  type DispatchOutcome,
  type DispatchRequest,
  isDispatchError
} from "../DispatchContract.js"
import { CallPermits } from "./CallPermits.js"
import { DispatchFailed, InvalidTaskGraph, RequestCancelled, TaskInputRejected, TaskUnavailable } from "../errors.js"
import type { LlmChunk } from "../../executors/llm/api.js"
import { type ExecutorLease, type TaskManager, TaskManagers } from "../task-manager/TaskManagers.js"
import { eitherSignal } from "../executor-calls/EitherSignal.js"
import { PlatformMetrics } from "../metrics/PlatformMetrics.js"
import { ServeConfig } from "../../config/ServeConfig.js"
import type { Payload } from "../../sidecar/SidecarClient.js"
import { EmbeddingCache, ownedPayload } from "../executor-calls/EmbeddingCache.js"
import type { BusyClock } from "../../metrics/BusyClock.js"
import { type Span, startSpan } from "../../tracing/Tracing.js"
import {
  type CallResult,
  type EmbeddingCaching,
  embedFromCache,
  executorCalls,
  producedModalities
} from "../executor-calls/ExecutorCalls.js"

/** For each forwarded datum: which invocation produces it and which consume it. */
export interface DataWiring {
  readonly id: string
  readonly producer: number
  readonly consumers: ReadonlyArray<number>
}

/**
 * Checks that every datum an invocation consumes is produced by an earlier one and every produced
 * datum is consumed, and says who sends what to whom.
 */
export const wireDataForwards = (graph: TaskGraphWire): ReadonlyArray<DataWiring> | string => {
  const wiring = new Map<string, { producer: number; consumers: Array<number> }>()
  for (const [index, invocation] of graph.invocations.entries()) {
    for (const consumed of collectDataForwards(invocation.input)) {
      const id = dataForwardId(consumed)
      const entry = wiring.get(id)
      if (entry === undefined) {
        return `task ${invocation.taskId} consumes data ${id}, which no earlier task in the graph produces`
      }
      entry.consumers.push(index)
    }
    for (const produced of collectDataForwards(invocation.output)) {
      wiring.set(dataForwardId(produced), { producer: index, consumers: [] })
    }
  }
  for (const [id, entry] of wiring) {
    if (entry.consumers.length === 0) {
      const producer = graph.invocations[entry.producer]!
      return `task ${producer.taskId} produces data ${id} that no later task consumes; return it through a task that takes it`
    }
  }
  return [...wiring].map(([id, entry]) => ({ id, ...entry }))
}

/** How long a cancelled graph's leftovers are looked for in the sidecar before they are left to its TTL. */
const releaseWaitMs = 3_000

/** What the dispatcher needs of the platform: the deployed tasks and this node's sidecar. */
export interface DispatchEnvironment {
  readonly task: (taskId: string) => TaskManager | undefined
  /** Takes whatever arrived of these forwarded data out of the sidecar (a cancelled graph's leftovers). */
  readonly release: (dataIds: ReadonlyArray<string>) => void
  /** Whether the node's sidecar runs, or is running again within `timeoutMs` (it is being restarted). */
  readonly sidecarRunning: (timeoutMs: number) => Promise<boolean>
  /** Calls `listener` each time the sidecar goes away; returns the unsubscription. */
  readonly onSidecarLost: (listener: () => void) => () => void
  /** Told of each executor call as it ends, and of each streamed call's chunks (for the metrics). */
  readonly observer?: CallObserver
  /** The cache of encoder outputs, when the platform keeps one. */
  readonly embeddings?: EmbeddingCaching
}

/**
 * Failures before any call was made: a task that was full or had no executor for the lease's whole
 * wait. Running the graph again would only wait or be refused again.
 */
const refusedWhileLeasing = new WeakSet<object>()

/**
 * A sidecar operation of the cache of encoder outputs: when the sidecar fails it (it went away, say),
 * the request is unavailable, as it is when an executor finds the sidecar gone, and may be tried again.
 */
const viaSidecar = async <A>(operation: () => Promise<A>): Promise<A> => {
  try {
    return await operation()
  } catch (error) {
    throw new TaskUnavailable({
      message: `the node's sidecar could not keep or forward an encoder output: ${error instanceof Error ? error.message : String(error)}`,
      unreachable: true
    })
  }
}

/** How long an encoder output to be cached may take to be in this node's sidecar once the encoder answered. */
const cacheTakeWaitMs = 10_000

/** How long a graph that forwards data waits for a sidecar being restarted before it is refused. */
const sidecarWaitMs = 3_000

/**
 * Executes an app's recorded task graph: every task must be deployed and ready and every
 * forwarded datum wired from its producer to its consumers; then every invocation goes to an
 * executor of its task at once (data dependencies are kept by the consumers waiting on the
 * sidecar). A streaming last invocation's chunks pass through as they come. When one invocation
 * fails, the others are cancelled; when the request is cancelled, so is every invocation, and the
 * data the graph forwarded is released from the sidecar. A graph that fails as unavailable before
 * anything of it reached the app (an LLM's node was lost, the sidecar went away) is run once more as
 * a whole, under fresh data ids. Every executor lease it takes is released on every path: answer,
 * stream end, failure of any invocation, cancellation.
 *
 * An LLM stream that breaks off (its executor died, its node was lost) goes on: the graph runs again
 * under fresh data ids (its encoders embed the media again), on another executor of the task or on
 * the restarted one, told the tokens the app has already been given; the app sees one stream. With
 * greedy decoding the whole text is the text of a run without the failure.
 */
export const makeDispatch = (environment: DispatchEnvironment) => {
  const dispatchGraph = dispatchGraphWith(environment)
  const observer = environment.observer

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
        await new Promise((resolve) => setTimeout(resolve, failoverPauseMs))
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
    let identity: { readonly id: string; readonly created: number } | undefined
    let stream = first
    for (let failovers = 0; ; failovers++) {
      try {
        for await (const chunk of stream) {
          const { cornserve_token_ids: tokens, ...rest } = chunk as LlmChunk
          if (tokens !== undefined) said.push(...tokens)
          identity ??= { id: rest.id, created: rest.created }
          // The continuation's chunks keep the first executor's completion id.
          yield { ...rest, id: identity.id, created: identity.created }
        }
        return
      } catch (error) {
        if (signal.aborted || failovers >= maxFailovers || !breaksOff(error)) throw error
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
        return await dispatchGraph(graph, requestId, signal, context, tried)
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
            await new Promise((resolve) => setTimeout(resolve, failoverPauseMs))
          }
        }
      }
    })()
    const last = graph.invocations[graph.invocations.length - 1]
    if (outcome.stream === undefined || last?.operation !== "chat") return outcome
    return { ...outcome, stream: failingOver(graph, outcome.stream, requestId, signal, context, tried) }
  }
}

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

/** What a request's graph runs carry besides the graph: where their time is counted and traced. */
interface RequestContext {
  /** Counts the time the request spends inside executors. */
  readonly inside: BusyClock | undefined
  /** The request's span in the app: each run of the graph is a child. */
  readonly span: Span | undefined
  /** Its app's claim on shared tasks: sent to the executors (fair queuing), and its limit per task. */
  readonly share: AppShare | undefined
  /** Why this run is a second one. */
  readonly retry?: "unavailable"
}

/**
 * Runs of a graph, each one span (`dispatch`) from its first lease to its last call's end or
 * stream's end; a run of an app with a limit on its calls per task first takes its permits, and
 * gives them back at the same end.
 */
const dispatchGraphWith = (environment: DispatchEnvironment) => {
  const dispatchGraph = dispatchGraphUntraced(environment)
  const permits = new CallPermits()
  return async (
    graph: TaskGraphWire,
    requestId: string,
    signal: AbortSignal,
    context: RequestContext,
    tried: Map<number, string>,
    continuation?: ReadonlyArray<number>
  ): Promise<DispatchOutcome> => {
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
      return dispatchGraph(graph, requestId, signal, { ...context, span }, tried, continuation)
    const finish = (error?: unknown) => {
      releasePermits()
      span.end(error)
    }
    try {
      const outcome = await dispatchGraph(graph, requestId, signal, { ...context, span }, tried, continuation)
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

const dispatchGraphUntraced =
  (environment: DispatchEnvironment) =>
  async (
    graph: TaskGraphWire,
    requestId: string,
    signal: AbortSignal,
    { inside, span, share }: RequestContext,
    /** Invocation index → the executor a previous try leased for it (avoided now, and set to this try's). */
    tried: Map<number, string>,
    /** Tokens of the last (chat) invocation its client has seen already, when it goes on from a failure. */
    continuation?: ReadonlyArray<number>
  ): Promise<DispatchOutcome> => {
    const observer = environment.observer
    const managers = graph.invocations.map((invocation) => {
      const task = environment.task(invocation.taskId)
      if (task === undefined) throw new TaskUnavailable({ message: `task ${invocation.taskId} is not deployed` })
      if (task.state !== "ready") throw new TaskUnavailable({ message: `task ${invocation.taskId} is ${task.state}` })
      return task
    })
    const wiring = wireDataForwards(graph)
    if (typeof wiring === "string") throw new InvalidTaskGraph({ message: wiring })
    const forwardsData = wiring.length > 0
    if (forwardsData && !(await environment.sidecarRunning(sidecarWaitMs)))
      throw new TaskUnavailable({ message: `the node's sidecar is not running again after ${sidecarWaitMs} ms` })
    const release = () =>
      environment.release(
        graph.invocations.flatMap((invocation) => collectDataForwards(invocation.output).map(dataForwardId))
      )
    const modalities = producedModalities(graph.invocations)
    const controller = new AbortController()
    let firstFailure: DispatchError | undefined
    const fail = (error: unknown, taskId: string): DispatchError => {
      if (firstFailure === undefined && !signal.aborted) {
        firstFailure = isDispatchError(error)
          ? withTask(error, taskId)
          : new DispatchFailed({ message: `task ${taskId}: ${error instanceof Error ? error.message : String(error)}` })
      }
      controller.abort()
      return firstFailure ?? new RequestCancelled({ requestId })
    }
    // Every lease the graph takes, released on every way out: a call's end, a stream's end, the
    // graph's failure, the request's cancellation (release is idempotent, so the first one counts).
    const held: Array<ExecutorLease> = []
    let closed = false
    const releaseHeld = () => {
      closed = true
      for (const lease of held) lease.release("failed")
    }
    const onCancel = () => {
      controller.abort()
      releaseHeld()
      release()
    }
    signal.addEventListener("abort", onCancel, { once: true })
    // Until every invocation has answered, the graph's forwarded data may sit in the sidecar: a
    // sidecar that goes away takes them with it, and the request can only be tried again.
    const stopWatchingSidecar = forwardsData
      ? environment.onSidecarLost(() => {
          if (firstFailure === undefined && !signal.aborted)
            firstFailure = new TaskUnavailable({
              message: "the node's sidecar went away with the data this request forwarded",
              unreachable: true
            })
          controller.abort()
        })
      : () => undefined
    // Every invocation's executor is chosen first: a producer sends what it forwards to the nodes of
    // the executors that consume it (through its sidecar's peers when they are on another node).
    // When one task has none, the leases the others got go back unused.
    const asked = performance.now()
    // Encoder invocations whose every item is in the cache need no executor: they are served from it.
    const caching = environment.embeddings
    const served = graph.invocations.map((invocation) =>
      caching === undefined ? undefined : embedFromCache(invocation, caching)
    )
    const leasing = managers.map((manager, index) => {
      if (served[index] !== undefined) return Promise.resolve(undefined)
      const taskId = graph.invocations[index]!.taskId
      // The wait for room on the task: its queue at the dispatcher.
      const leaseSpan = startSpan(`lease ${taskId}`, { parent: span, attributes: { "cornserve.task": taskId } })
      return manager.lease({ signal: controller.signal, exclude: tried.get(index) }).then(
        (lease) => {
          tried.set(index, lease.executorId)
          observer?.leaseWait(taskId, (performance.now() - asked) / 1000)
          leaseSpan.attribute("cornserve.executor", lease.executorId)
          leaseSpan.end()
          if (closed) lease.release("unused")
          else held.push(lease)
          return lease
        },
        (error: unknown) => {
          leaseSpan.end(error)
          throw error
        }
      )
    })
    let leases: Array<ExecutorLease | undefined>
    try {
      leases = await Promise.all(leasing)
    } catch (error) {
      controller.abort()
      releaseHeld()
      await Promise.allSettled(leasing)
      if (typeof error === "object" && error !== null) refusedWhileLeasing.add(error)
      stopWatchingSidecar()
      signal.removeEventListener("abort", onCancel)
      throw error
    }
    if (closed) {
      // Cancelled while the executors were being chosen.
      stopWatchingSidecar()
      throw new RequestCancelled({ requestId })
    }
    const receiversOf = (index: number): ReadonlyArray<string> => {
      const nodes = new Set<string>()
      for (const datum of wiring) {
        if (datum.producer !== index) continue
        for (const consumer of datum.consumers) {
          const node = leases[consumer]?.node
          if (node !== undefined) nodes.add(node)
        }
      }
      if (nodes.size > 0) return [...nodes]
      const own = leases[index]?.node ?? caching?.node
      return own === undefined ? [] : [own]
    }

    // An executor that cannot take its call is not tried again here: the graph is, as a whole and
    // under fresh data ids (see makeDispatch). Every call forwards or consumes data, and a second try
    // under the same ids would find chunks already sent, or sent to a node that is gone.
    const run = async (invocation: TaskInvocationWire, index: number): Promise<CallResult> => {
      const fromCache = served[index]
      if (fromCache !== undefined) {
        const cacheSpan = startSpan(`${invocation.operation} ${invocation.taskId} (cached)`, {
          parent: span,
          attributes: { "cornserve.task": invocation.taskId, "cornserve.cache": "hit" }
        })
        try {
          const result = await fromCache({ receivers: receiversOf(index), modalities, signal: controller.signal })
          cacheSpan.end()
          return result
        } catch (error) {
          cacheSpan.end(error)
          throw fail(error, invocation.taskId)
        }
      }
      const lease = leases[index]!
      const call = executorCalls[invocation.operation]
      if (call === undefined) {
        lease.release("unused")
        throw new InvalidTaskGraph({ message: `no executor call for operation ${invocation.operation}` })
      }
      const receivers = receiversOf(index)
      // A call ends with the request, and at once when its executor's node is lost.
      const callSignal = eitherSignal(controller.signal, lease.signal)
      const began = performance.now()
      inside?.enter(began)
      const callSpan = startSpan(`${invocation.operation} ${invocation.taskId}`, {
        parent: span,
        kind: "client",
        startTime: began,
        attributes: {
          "cornserve.task": invocation.taskId,
          "cornserve.operation": invocation.operation,
          "cornserve.executor": lease.executorId,
          "cornserve.node": lease.node,
          "server.address": lease.url
        }
      })
      let ended = false
      const observe = (outcome: "ok" | "error", failure?: unknown) => {
        if (ended) return
        ended = true
        const now = performance.now()
        inside?.leave(now)
        observer?.call(invocation.taskId, invocation.operation, outcome, (now - began) / 1000)
        callSpan.end(outcome === "ok" ? undefined : (failure ?? "failed"))
      }
      try {
        const result = await call(lease.url, invocation, {
          receivers,
          modalities,
          signal: callSignal.signal,
          ...(callSpan.traceparent === undefined ? {} : { traceparent: callSpan.traceparent }),
          ...(caching === undefined ? {} : { embeddings: caching }),
          ...(share === undefined ? {} : { share: { app: share.app, weight: share.weight } }),
          ...(continuation !== undefined && index === graph.invocations.length - 1 ? { continuation } : {})
        })
        if (result.stream === undefined) {
          callSignal.dispose()
          lease.release("ok")
          observe("ok")
          return result
        }
        let streamFailed = false
        return {
          output: result.output,
          stream: passThrough(
            observer === undefined ? result.stream : timedChunks(result.stream, invocation.taskId, began, observer),
            () => {
              callSignal.dispose()
              lease.release("ok")
              if (!streamFailed) observe("ok")
            },
            (error) => {
              streamFailed = true
              observe("error", error)
              lease.release("failed")
              throw fail(lostNode(lease, error), invocation.taskId)
            }
          )
        }
      } catch (caught) {
        callSignal.dispose()
        observe("error", caught)
        const error = lostNode(lease, caught)
        const unavailable = error instanceof TaskUnavailable && !controller.signal.aborted
        lease.release(unavailable ? "unavailable" : "failed")
        throw fail(error, invocation.taskId)
      }
    }

    try {
      const results = await Promise.all(graph.invocations.map((invocation, index) => run(invocation, index))).finally(
        stopWatchingSidecar
      )
      const last = results[results.length - 1]!
      if (last.stream === undefined) {
        signal.removeEventListener("abort", onCancel)
        return { outputs: results.map((result) => result.output) }
      }
      return {
        outputs: results.map((result) => result.output),
        stream: passThrough(
          last.stream,
          () => signal.removeEventListener("abort", onCancel),
          (error) => {
            signal.removeEventListener("abort", onCancel)
            throw firstFailure ?? error
          }
        )
      }
    } catch (error) {
      signal.removeEventListener("abort", onCancel)
      // The calls still running end with the controller; a streamed answer nobody will read ends here.
      controller.abort()
      releaseHeld()
      if (!signal.aborted) release()
      throw firstFailure ?? fail(error, "?")
    }
  }

/** A call cut short because its executor's node was lost is the task's unavailability, retryable. */
const lostNode = (lease: ExecutorLease, error: unknown): unknown =>
  lease.signal.aborted
    ? new TaskUnavailable({
        message: `executor ${lease.executorId} was lost with its node ${lease.node}`,
        unreachable: true
      })
    : error

/** The error with the task it happened in named in its message, for the client to see which failed. */
const withTask = (error: DispatchError, taskId: string): DispatchError => {
  switch (error._tag) {
    case "TaskInputRejected":
      return new TaskInputRejected({ message: `task ${taskId}: ${error.message}` })
    case "TaskUnavailable":
      return new TaskUnavailable({
        message: `task ${taskId}: ${error.message}`,
        ...(error.unreachable === true ? { unreachable: true } : {})
      })
    case "DispatchFailed":
      return new DispatchFailed({ message: `task ${taskId}: ${error.message}` })
    case "InvalidTaskGraph":
    case "RequestCancelled":
      return error
  }
}

export class Dispatcher extends Effect.Service<Dispatcher>()("cornserve/Dispatcher", {
  effect: Effect.gen(function* () {
    const taskManagers = yield* TaskManagers
    const agent = yield* NodeAgent
    const config = yield* ServeConfig
    const { metrics } = yield* PlatformMetrics
    /** Takes whatever arrived of these data out of this node's sidecar. */
    const release = (dataIds: ReadonlyArray<string>) => {
      if (dataIds.length === 0) return
      // Best effort: data of a sidecar that went away went with it, and its successor's TTL reclaims the rest.
      void agent
        .sidecarClient()
        .then((client) => Promise.all(dataIds.map((id) => client.drop(id, releaseWaitMs))))
        .catch(() => undefined)
    }
    // On one node only: on a cluster, keeping and forwarding an output would take it through the
    // control plane's node, an extra hop between nodes that may not even reach it.
    const embeddings: EmbeddingCaching | undefined =
      config.embeddingCacheBytes === 0 || config.role !== "all"
        ? undefined
        : {
            cache: new EmbeddingCache(config.embeddingCacheBytes, (stats) => metrics.embeddingCacheSize(stats)),
            node: agent.nodeId,
            take: (id) =>
              viaSidecar(async () => {
                const client = await agent.sidecarClient()
                const chunks: Array<Payload> = []
                for (;;) {
                  const chunk = await client.recv(id, chunks.length, { timeoutMs: cacheTakeWaitMs })
                  if (chunk === undefined) break
                  chunks.push(ownedPayload(chunk))
                }
                await client.markDone(id)
                return chunks
              }),
            forward: (id, chunks, to) =>
              viaSidecar(async () => {
                const client = await agent.sidecarClient()
                for (const [index, chunk] of chunks.entries())
                  await client.send(id, chunk, { to, chunk: index, numChunks: chunks.length })
              }),
            observe: (taskId, outcome) => metrics.embeddingCacheLookup(taskId, outcome),
            discard: (ids) => release(ids)
          }
    const dispatch = makeDispatch({
      observer: metrics.callObserver,
      ...(embeddings === undefined ? {} : { embeddings }),
      task: taskManagers.get,
      release,
      sidecarRunning: agent.sidecarRunning,
      onSidecarLost: agent.onSidecarLost
    })
    return { dispatch }
  }),
  dependencies: [TaskManagers.Default, NodeAgent.Default, PlatformMetrics.Default]
}) {}

/** The chunks of `source`, telling `observer` when the first came after `began` and the gaps between the others. */
async function* timedChunks<A>(
  source: AsyncIterable<A>,
  taskId: string,
  began: number,
  observer: CallObserver
): AsyncIterable<A> {
  let last: number | undefined
  for await (const chunk of source) {
    const now = performance.now()
    if (last === undefined) observer.firstChunk(taskId, (now - began) / 1000)
    else observer.nextChunk(taskId, (now - last) / 1000)
    last = now
    yield chunk
  }
}

/** The chunks of `source`, calling `onEnd` when it is done and `onError` (which rethrows) when it fails. */
async function* passThrough<A>(
  source: AsyncIterable<A>,
  onEnd: () => void,
  onError: (error: unknown) => never
): AsyncIterable<A> {
  try {
    for await (const chunk of source) yield chunk
  } catch (error) {
    onError(error)
  } finally {
    onEnd()
  }
}
