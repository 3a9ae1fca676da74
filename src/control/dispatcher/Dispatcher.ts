import { Effect } from "effect"
import { collectDataForwards, dataForwardId } from "../../app-runtime/tasks/DataForward.js"
import type { TaskGraphWire, TaskInvocationWire } from "../../app-runtime/tasks/TaskGraph.js"
import { NodeAgent } from "../../node/NodeAgent.js"
import type { DispatchOutcome } from "../app-manager/AppDriver.js"
import { ExecutorUnavailable } from "../task-manager/TaskManagers.js"
import { ExecutorCallFailed, executorCalls, idempotentOperations } from "./ExecutorCalls.js"
import { TaskManagers } from "../task-manager/TaskManagers.js"

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

/** Why a graph failed, with the status the app's client should see (4xx: its input; 503: capacity). */
export class GraphFailed extends Error {
  override readonly name = "GraphFailed"
  constructor(
    message: string,
    readonly status: number
  ) {
    super(message)
  }
}

const statusOf = (error: unknown): number => {
  if (error instanceof ExecutorCallFailed || error instanceof ExecutorUnavailable) return error.status
  return 502
}

/** How long a cancelled graph's leftovers are looked for in the sidecar before they are left to its TTL. */
const releaseWaitMs = 3_000

/**
 * Executes an app's recorded task graph: every task must be deployed and ready and every
 * forwarded datum wired from its producer to its consumers; then every invocation goes to an
 * executor of its task at once (data dependencies are kept by the consumers waiting on the
 * sidecar). A streaming last invocation's chunks pass through as they come. When one invocation
 * fails, the others are cancelled; when the request is cancelled, so is every invocation, and the
 * data the graph forwarded is released from the sidecar.
 */
export class Dispatcher extends Effect.Service<Dispatcher>()("cornserve/Dispatcher", {
  effect: Effect.gen(function* () {
    const taskManagers = yield* TaskManagers
    const agent = yield* NodeAgent

    const release = (graph: TaskGraphWire) => {
      const produced = graph.invocations.flatMap((invocation) =>
        collectDataForwards(invocation.output).map(dataForwardId)
      )
      if (produced.length === 0) return
      void agent.sidecarClient().then((client) =>
        Promise.all(
          produced.map((id) =>
            client.recv(id, 0, { timeoutMs: releaseWaitMs }).then(
              () => client.markDone(id),
              () => undefined
            )
          )
        )
      )
    }

    const dispatch = async (graph: TaskGraphWire, requestId: string, signal: AbortSignal): Promise<DispatchOutcome> => {
      const managers = graph.invocations.map((invocation) => {
        const task = taskManagers.get(invocation.taskId)
        if (task === undefined) throw new GraphFailed(`task ${invocation.taskId} is not deployed`, 503)
        if (task.state !== "ready") throw new GraphFailed(`task ${invocation.taskId} is ${task.state}`, 503)
        return task
      })
      const wiring = wireDataForwards(graph)
      if (typeof wiring === "string") throw new GraphFailed(wiring, 500)
      const modalities = new Map<string, string>()
      graph.invocations.forEach((invocation) => {
        if (invocation.operation !== "embed") return
        for (const produced of collectDataForwards(invocation.output)) {
          modalities.set(dataForwardId(produced), (invocation.config as { modality: string }).modality)
        }
      })

      const controller = new AbortController()
      let firstFailure: GraphFailed | undefined
      const fail = (error: unknown, taskId: string) => {
        if (firstFailure === undefined && !signal.aborted) {
          firstFailure =
            error instanceof GraphFailed
              ? error
              : new GraphFailed(`task ${taskId}: ${(error as Error).message}`, statusOf(error))
        }
        controller.abort()
        return firstFailure ?? new GraphFailed(`request ${requestId} was cancelled`, 499)
      }
      const onCancel = () => {
        controller.abort()
        release(graph)
      }
      signal.addEventListener("abort", onCancel, { once: true })
      const context = { receivers: [agent.nodeId], modalities, signal: controller.signal }

      const run = async (invocation: TaskInvocationWire, index: number) => {
        const call = executorCalls[invocation.operation]
        if (call === undefined) throw new GraphFailed(`no executor call for operation ${invocation.operation}`, 500)
        const idempotent = idempotentOperations.has(invocation.operation)
        let lease = await managers[index]!.lease({ signal: controller.signal })
        for (let attempt = 0; ; attempt++) {
          try {
            const result = await call(lease.url, invocation, context)
            if (result.stream === undefined) {
              lease.release("ok")
              return result
            }
            const held = lease
            return {
              output: result.output,
              stream: passThrough(
                result.stream,
                () => held.release("ok"),
                (error) => {
                  held.release("failed")
                  throw fail(error, invocation.taskId)
                }
              )
            }
          } catch (error) {
            const unavailable =
              (error instanceof ExecutorCallFailed && error.status === 503) ||
              (error instanceof TypeError && !controller.signal.aborted)
            lease.release(unavailable ? "unavailable" : "failed")
            if (!unavailable || !idempotent || attempt > 0) throw fail(error, invocation.taskId)
            lease = await managers[index]!.lease({ exclude: lease.executorId, signal: controller.signal })
          }
        }
      }

      try {
        const results = await Promise.all(graph.invocations.map((invocation, index) => run(invocation, index)))
        const last = results[results.length - 1]!
        return last.stream === undefined
          ? { outputs: results.map((result) => result.output) }
          : {
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
        if (!signal.aborted) release(graph)
        throw firstFailure ?? fail(error, "?")
      }
    }

    return { dispatch }
  }),
  dependencies: [TaskManagers.Default, NodeAgent.Default]
}) {}

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
