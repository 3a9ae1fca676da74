import * as Effect from "effect/Effect"
import { collectDataForwards, dataForwardId } from "../../app-runtime/tasks/DataForward.js"
import type { TaskInvocationWire } from "../../app-runtime/tasks/TaskGraph.js"
import { NodeAgent } from "../../node/NodeAgent.js"
import { type CallObserver, type DispatchError, isDispatchError } from "../DispatchContract.js"
import { DispatchFailed, InvalidTaskGraph, RequestCancelled, TaskUnavailable } from "../errors.js"
import { saidWhere } from "../RemoteError.js"
import { type ExecutorLease, type TaskManager, TaskManagers } from "../task-manager/TaskManagers.js"
import { eitherSignal } from "../executor-calls/EitherSignal.js"
import { PlatformMetrics } from "../metrics/PlatformMetrics.js"
import { ServeConfig } from "../../config/ServeConfig.js"
import type { Payload } from "../../sidecar/SidecarClient.js"
import { EmbeddingCache, ownedPayload } from "../executor-calls/EmbeddingCache.js"
import { startSpan } from "../../tracing/Tracing.js"
import {
  type CallResult,
  type EmbeddingCaching,
  embedFromCache,
  executorCalls,
  producedModalities
} from "../executor-calls/ExecutorCalls.js"
import { RequestScope } from "../RequestScope.js"
import { passThrough, timedChunks } from "./ChunkStreams.js"
import { datumReceivers, receiversOf, wireDataForwards } from "./DataWiring.js"
import { withFailover } from "./Failover.js"
import { type GraphRun, refusedWhileLeasing, spannedRuns } from "./GraphRuns.js"

export { type DataWiring, wireDataForwards } from "./DataWiring.js"

/** How a lease ends: "ok", "failed", "unused" (no call made), "unavailable" (its executor could not take it). */
type LeaseOutcome = Parameters<ExecutorLease["release"]>[0]

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
  /** The internal secret executors take calls with (ServeConfig's `internalSecret`). */
  readonly credential?: string
}

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
 * data the graph forwarded is released from the sidecar. Each run holds what it takes (executor
 * leases, listeners) in one request scope, which gives each back exactly once on every path: answer,
 * stream end, failure of any invocation, cancellation. A run that fails or breaks off goes on as
 * `withFailover` says.
 */
export const makeDispatch = (environment: DispatchEnvironment) =>
  withFailover(spannedRuns(runGraph(environment)), environment.observer)

/**
 * One run of a graph. Every invocation's executor is chosen first: a producer sends what it forwards
 * to the nodes of the executors that consume it (through its sidecar's peers when they are on
 * another node). When one task has none, the leases the others got go back unused.
 */
const runGraph =
  (environment: DispatchEnvironment): GraphRun =>
  async (graph, requestId, signal, { inside, span, share }, tried, continuation) => {
    const observer = environment.observer
    const managers = graph.invocations.map((invocation) => {
      const task = environment.task(invocation.taskId)
      if (task === undefined) throw new TaskUnavailable({ message: `task ${invocation.taskId} is not deployed` })
      // A released task takes calls too: its lease starts its executors again.
      if (task.state === "deploying" || task.state === "tearing-down")
        throw new TaskUnavailable({ message: `task ${invocation.taskId} is ${task.state}` })
      return task
    })
    const wiring = wireDataForwards(graph)
    if (typeof wiring === "string") throw new InvalidTaskGraph({ message: wiring })
    const forwardsData = wiring.length > 0
    if (forwardsData && !(await environment.sidecarRunning(sidecarWaitMs)))
      throw new TaskUnavailable({ message: `the node's sidecar is not running again after ${sidecarWaitMs} ms` })
    const releaseData = () =>
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
    // What the run holds (its leases, its calls' signals, its watch of the request and of the
    // sidecar), each given back once: at its own end (a call's answer, a stream's end) or when the
    // run closes: its answer or stream's end, its failure, the request's cancellation. A lease still
    // held then has failed; one granted after it is unused.
    const scope = new RequestScope()
    scope.onAbort(signal, () => {
      controller.abort()
      scope.close()
      releaseData()
    })
    // Until every invocation has answered, the graph's forwarded data may sit in the sidecar: a
    // sidecar that goes away takes them with it, and the request can only be tried again.
    const stopWatchingSidecar = forwardsData
      ? scope.defer(
          environment.onSidecarLost(() => {
            if (firstFailure === undefined && !signal.aborted)
              firstFailure = new TaskUnavailable({
                message: "the node's sidecar went away with the data this request forwarded",
                unreachable: true
              })
            controller.abort()
          })
        )
      : () => undefined
    const asked = performance.now()
    /** Calls that answered and go on (CallResult's `goesOn`). */
    let going = 0
    let over = false
    // Encoder invocations whose every item is in the cache need no executor: they are served from it.
    const caching = environment.embeddings
    const served = graph.invocations.map((invocation) =>
      caching === undefined ? undefined : embedFromCache(invocation, caching)
    )
    const releases: Array<(outcome: LeaseOutcome) => void> = []
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
          if (scope.closed) lease.release("unused")
          else releases[index] = scope.hold<LeaseOutcome>((outcome) => lease.release(outcome), "failed")
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
      scope.close()
      await Promise.allSettled(leasing)
      if (typeof error === "object" && error !== null) refusedWhileLeasing.add(error)
      throw error
    }
    // Cancelled while the executors were being chosen.
    if (scope.closed) throw new RequestCancelled({ requestId })
    const nodeOf = (index: number) => leases[index]?.node
    const receivers = (index: number) => receiversOf(wiring, index, nodeOf, leases[index]?.node ?? caching?.node)

    // An executor that cannot take its call is not tried again here: the graph is, as a whole and
    // under fresh data ids (see withFailover). Every call forwards or consumes data, and a second try
    // under the same ids would find chunks already sent, or sent to a node that is gone.
    const run = async (invocation: TaskInvocationWire, index: number): Promise<CallResult> => {
      const fromCache = served[index]
      if (fromCache !== undefined) {
        const cacheSpan = startSpan(`${invocation.operation} ${invocation.taskId} (cached)`, {
          parent: span,
          attributes: { "cornserve.task": invocation.taskId, "cornserve.cache": "hit" }
        })
        try {
          const result = await fromCache({
            receivers: receivers(index),
            receiversOf: (id) => datumReceivers(wiring, id, nodeOf),
            modalities,
            signal: controller.signal
          })
          cacheSpan.end()
          return result
        } catch (error) {
          cacheSpan.end(error)
          throw fail(error, invocation.taskId)
        }
      }
      const lease = leases[index]!
      const release = releases[index]!
      const call = executorCalls[invocation.operation]
      if (call === undefined) {
        release("unused")
        throw new InvalidTaskGraph({ message: `no executor call for operation ${invocation.operation}` })
      }
      // A call ends with the request, and at once when its executor's node is lost.
      const callSignal = eitherSignal(controller.signal, lease.signal)
      const stopListening = scope.defer(callSignal.dispose)
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
          receivers: receivers(index),
          receiversOf: (id) => datumReceivers(wiring, id, nodeOf),
          modalities,
          signal: callSignal.signal,
          ...(environment.credential === undefined ? {} : { credential: environment.credential }),
          ...(callSpan.traceparent === undefined ? {} : { traceparent: callSpan.traceparent }),
          ...(caching === undefined ? {} : { embeddings: caching }),
          ...(share === undefined ? {} : { share: { app: share.app, weight: share.weight } }),
          ...(continuation !== undefined && index === graph.invocations.length - 1 ? { continuation } : {})
        })
        if (result.goesOn !== undefined) {
          // Answered, and still at work for the invocations after it: its lease is held, and its
          // failure fails the request, until its work ends (or the run does, which cancels it).
          going++
          const ended = () => {
            going--
            stopListening()
            release("ok")
            observe("ok")
          }
          result.goesOn.then(ended, (error: unknown) => {
            // Cut short by the run's end: nobody was left to work for.
            if (over) return ended()
            going--
            observe("error", error)
            release("failed")
            fail(lostNode(lease, error), invocation.taskId)
          })
          return { output: result.output }
        }
        if (result.stream === undefined) {
          stopListening()
          release("ok")
          observe("ok")
          return result
        }
        let streamFailed = false
        return {
          output: result.output,
          stream: passThrough(
            observer === undefined ? result.stream : timedChunks(result.stream, invocation.taskId, began, observer),
            () => {
              stopListening()
              release("ok")
              if (!streamFailed) observe("ok")
            },
            (error) => {
              streamFailed = true
              observe("error", error)
              release("failed")
              throw fail(lostNode(lease, error), invocation.taskId)
            }
          )
        }
      } catch (caught) {
        stopListening()
        observe("error", caught)
        const error = lostNode(lease, caught)
        const unavailable = error instanceof TaskUnavailable && !controller.signal.aborted
        release(unavailable ? "unavailable" : "failed")
        throw fail(error, invocation.taskId)
      }
    }

    try {
      const results = await Promise.all(graph.invocations.map((invocation, index) => run(invocation, index))).finally(
        stopWatchingSidecar
      )
      const outputs = results.map((result) => result.output)
      const last = results[results.length - 1]!
      // Calls still at work when the run is over have nobody left to work for.
      const close = () => {
        over = true
        if (going > 0) controller.abort()
        scope.close()
      }
      if (last.stream === undefined) {
        close()
        return { outputs }
      }
      return {
        outputs,
        stream: passThrough(last.stream, close, (error) => {
          scope.close()
          throw firstFailure ?? error
        })
      }
    } catch (error) {
      // The calls still running end with the controller; a streamed answer nobody will read ends here.
      controller.abort()
      scope.close()
      if (!signal.aborted) releaseData()
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
const withTask = (error: DispatchError, taskId: string): DispatchError =>
  error._tag === "InvalidTaskGraph" || error._tag === "RequestCancelled" ? error : saidWhere(error, `task ${taskId}`)

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
      credential: config.internalSecret,
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
