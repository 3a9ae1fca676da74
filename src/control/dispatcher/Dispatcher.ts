import { Effect } from "effect"
import { collectDataForwards, dataForwardId } from "../../app-runtime/tasks/DataForward.js"
import type { TaskGraphWire } from "../../app-runtime/tasks/TaskGraph.js"
import { AppNotReady, DispatchFailed, TaskNotFound } from "../errors.js"
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

/**
 * Executes an app's recorded task graph: every task must be deployed and ready, every forwarded
 * datum wired from its producer to its consumers; then each invocation goes to its task manager.
 */
export class Dispatcher extends Effect.Service<Dispatcher>()("cornserve/Dispatcher", {
  effect: Effect.gen(function* () {
    const taskManagers = yield* TaskManagers

    const dispatch = Effect.fn("Dispatcher.dispatch")(function* (graph: TaskGraphWire, requestId: string) {
      for (const invocation of graph.invocations) {
        const task = taskManagers.get(invocation.taskId)
        if (task === undefined) return yield* new TaskNotFound({ taskId: invocation.taskId })
        if (task.state !== "ready") {
          return yield* new AppNotReady({ appId: requestId, state: `waiting for task ${task.spec.id} (${task.state})` })
        }
      }
      const wiring = wireDataForwards(graph)
      if (typeof wiring === "string") return yield* new DispatchFailed({ message: wiring })
      return yield* new DispatchFailed({
        message: `request ${requestId}: no executor is running for ${graph.invocations.map((invocation) => invocation.kind).join(", ")}`
      })
    })

    return { dispatch }
  }),
  dependencies: [TaskManagers.Default]
}) {}
