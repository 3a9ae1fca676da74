import { collectDataForwards, dataForwardId } from "../../app-runtime/tasks/DataForward.js"
import type { TaskGraphWire } from "../../app-runtime/tasks/TaskGraph.js"

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
 * The nodes invocation `index` sends what it produces to: those of its consumers' executors, or its
 * own (`own`) when it forwards nothing.
 */
export const receiversOf = (
  wiring: ReadonlyArray<DataWiring>,
  index: number,
  nodeOf: (index: number) => string | undefined,
  own: string | undefined
): ReadonlyArray<string> => {
  const nodes = new Set<string>()
  for (const datum of wiring) {
    if (datum.producer !== index) continue
    for (const consumer of datum.consumers) {
      const node = nodeOf(consumer)
      if (node !== undefined) nodes.add(node)
    }
  }
  if (nodes.size > 0) return [...nodes]
  return own === undefined ? [] : [own]
}
