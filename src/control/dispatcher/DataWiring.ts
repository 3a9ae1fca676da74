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
 * The nodes datum `id` goes to: the node of each of its consumers' executors, once for each
 * consumer (each reads it and marks it done, and the sidecar frees it once all of them have).
 */
export const datumReceivers = (
  wiring: ReadonlyArray<DataWiring>,
  id: string,
  nodeOf: (index: number) => string | undefined
): ReadonlyArray<string> =>
  (wiring.find((datum) => datum.id === id)?.consumers ?? []).flatMap((consumer) => {
    const node = nodeOf(consumer)
    return node === undefined ? [] : [node]
  })

/**
 * The nodes invocation `index` sends what it produces to: the node of each of its consumers'
 * executors, once for each consumer (see datumReceivers), or its own (`own`) when it forwards
 * nothing. Where its data differ in their consumers, each node is named as often as it has
 * consumers of one datum at most: a call that sends several data gives each its own receivers
 * where its executor takes them (an encoder's items).
 */
export const receiversOf = (
  wiring: ReadonlyArray<DataWiring>,
  index: number,
  nodeOf: (index: number) => string | undefined,
  own: string | undefined
): ReadonlyArray<string> => {
  const readers = new Map<string, number>()
  for (const datum of wiring) {
    if (datum.producer !== index) continue
    const perNode = new Map<string, number>()
    for (const consumer of datum.consumers) {
      const node = nodeOf(consumer)
      if (node !== undefined) perNode.set(node, (perNode.get(node) ?? 0) + 1)
    }
    for (const [node, count] of perNode) readers.set(node, Math.max(readers.get(node) ?? 0, count))
  }
  if (readers.size > 0) return [...readers].flatMap(([node, count]) => new Array<string>(count).fill(node))
  return own === undefined ? [] : [own]
}
