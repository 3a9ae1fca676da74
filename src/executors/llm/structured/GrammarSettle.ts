import { schemaBounds, schemaTooLarge } from "./SchemaBounds.js"
import { type GrammarNode, type LiteralTrie, type ObjectLayout, UnsupportedSchema } from "./GrammarNodes.js"

/**
 * The last step of compiling a grammar (JsonGrammar.ts): the draft nodes the compiler made settled
 * into grammar nodes. References are resolved, unions flattened, each node's shortest value found
 * and what admits no finite value dropped, and each object's layout of its properties computed.
 */

/** Mutable while compiling; read through GrammarNode afterwards. */
export type Draft =
  | {
      kind: "object"
      id: number
      properties: Array<{ name: string; key: Uint8Array; value: Draft; required: boolean }>
      extra: Draft | undefined
      layout: ObjectLayout
      minLength: number
    }
  | { kind: "array"; id: number; items: Draft; minItems: number; maxItems: number; minLength: number }
  | { kind: "string"; id: number; minLength: number }
  | { kind: "number"; id: number; integer: boolean; minLength: number }
  | { kind: "literal"; id: number; trie: LiteralTrie; minLength: number }
  | { kind: "union"; id: number; options: Array<Draft>; minLength: number }
  | { kind: "ref"; id: number; target: Draft | undefined; path: string; minLength: number }

/** Resolves references, drops what admits no finite value, and fills in lengths and layouts. */
export const settleGrammar = (root: Draft, nodes: ReadonlyArray<Draft>): GrammarNode => {
  const resolved = new Map<Draft, Draft>()
  /** What a reference (or a chain of them) stands for; each reference is followed once. */
  const resolve = (node: Draft): Draft => {
    const chain: Array<Draft> = []
    let at = node
    while (at.kind === "ref") {
      const known = resolved.get(at)
      if (known !== undefined) {
        at = known
        break
      }
      if (chain.includes(at) || at.target === undefined) {
        throw new UnsupportedSchema({ keyword: "$ref", path: at.path, reason: "$ref refers to itself" })
      }
      chain.push(at)
      at = at.target
    }
    for (const ref of chain) resolved.set(ref, at)
    return at
  }
  for (const node of nodes) {
    if (node.kind === "object") {
      for (const property of node.properties) property.value = resolve(property.value)
      if (node.extra !== undefined) node.extra = resolve(node.extra)
    } else if (node.kind === "array") node.items = resolve(node.items)
  }
  let steps = 0
  /** A union's options, the options of unions among them in their place, each once. */
  const flatten = (union: Extract<Draft, { kind: "union" }>): Array<Draft> => {
    const out: Array<Draft> = []
    const seen = new Set<Draft>([union])
    const pending: Array<{ readonly options: ReadonlyArray<Draft>; at: number }> = [{ options: union.options, at: 0 }]
    while (pending.length > 0) {
      const top = pending[pending.length - 1]!
      if (top.at === top.options.length) {
        pending.pop()
        continue
      }
      if (++steps > schemaBounds.alternatives) {
        throw schemaTooLarge("alternatives", "steps of gathering the options of nested anyOf")
      }
      const option = resolve(top.options[top.at++]!)
      if (seen.has(option)) continue
      seen.add(option)
      if (option.kind === "union") pending.push({ options: option.options, at: 0 })
      else out.push(option)
    }
    return out
  }
  for (const node of nodes) if (node.kind === "union") node.options = flatten(node)
  const top = resolve(root)
  const live = nodes.filter((node) => node.kind !== "ref")
  shortestValues(live)
  if (!Number.isFinite(top.minLength)) {
    throw new UnsupportedSchema({
      keyword: "$ref",
      path: "#",
      reason: "the schema admits no finite value (its recursion never ends)"
    })
  }
  for (const node of live) {
    if (node.kind === "union") node.options = node.options.filter((o) => Number.isFinite(o.minLength))
    if (node.kind === "array" && !Number.isFinite(node.items.minLength)) node.maxItems = 0
    if (node.kind === "object") {
      node.properties = node.properties.filter((p) => p.required || Number.isFinite(p.value.minLength))
      if (node.extra !== undefined && !Number.isFinite(node.extra.minLength)) node.extra = undefined
      node.layout = layout(node)
    }
  }
  return top as GrammarNode
}

/** What a node's shortest value needs first: none (its length is known), all of `needs`, or any one of them. */
const needsOf = (node: Draft): { readonly all: boolean; readonly needs: ReadonlyArray<Draft> } | undefined => {
  switch (node.kind) {
    case "object":
      return node.extra !== undefined
        ? undefined
        : { all: true, needs: node.properties.filter((p) => p.required).map((p) => p.value) }
    case "array":
      return node.minItems === 0 ? undefined : { all: true, needs: [node.items] }
    case "union":
      return { all: false, needs: node.options }
    default:
      return undefined
  }
}

/** The length of a node's shortest value, from those of the nodes it needs. */
const lengthOf = (node: Draft): number => {
  switch (node.kind) {
    case "object": {
      if (node.extra !== undefined) return 2
      let required = 0
      let length = 2
      for (const p of node.properties) {
        if (!p.required) continue
        required++
        length += p.key.length + 1 + p.value.minLength
      }
      return length + Math.max(0, required - 1)
    }
    case "array":
      return node.minItems === 0 ? 2 : 2 + node.minItems * (node.items.minLength + 1) - 1
    case "string":
      return 2
    case "number":
      return 1
    case "literal":
      return node.trie.minRemaining
    case "union":
    case "ref":
      return Infinity
  }
}

/**
 * Sets each node's `minLength`, Knuth's generalization of Dijkstra's algorithm over the schema's
 * graph (recursion through $ref makes it one): the shortest values are settled shortest first, a
 * node needing all its parts once they all are, a union at its first settled option. A node
 * never settled admits no finite value. Refuses a schema whose shortest values are longer, or
 * nest deeper, than SchemaBounds.ts takes.
 */
const shortestValues = (nodes: ReadonlyArray<Draft>): void => {
  const dependents = new Map<Draft, Array<Draft>>()
  const waiting = new Map<Draft, number>()
  const depth = new Map<Draft, number>()
  const queue = new SettleQueue()
  for (const node of nodes) {
    const needs = needsOf(node)
    if (needs === undefined || (needs.all && needs.needs.length === 0)) {
      queue.push(node, lengthOf(node), 1)
      continue
    }
    if (needs.all) waiting.set(node, needs.needs.length)
    for (const need of needs.needs) {
      const list = dependents.get(need)
      if (list === undefined) dependents.set(need, [node])
      else list.push(node)
    }
  }
  for (let next = queue.pop(); next !== undefined; next = queue.pop()) {
    const { node, length, nesting } = next
    if (depth.has(node)) continue
    if (length > schemaBounds.shortestValue) {
      throw schemaTooLarge("shortestValue", "bytes in its shortest value (or in that of one of its parts)")
    }
    if (nesting > schemaBounds.shortestValueDepth) {
      throw schemaTooLarge("shortestValueDepth", "values within values in its shortest value")
    }
    node.minLength = length
    depth.set(node, nesting)
    for (const dependent of dependents.get(node) ?? []) {
      if (depth.has(dependent)) continue
      if (dependent.kind === "union") {
        queue.push(dependent, length, nesting)
        continue
      }
      const left = waiting.get(dependent)! - 1
      waiting.set(dependent, left)
      if (left > 0) continue
      let deepest = 0
      for (const need of needsOf(dependent)!.needs) deepest = Math.max(deepest, depth.get(need)!)
      queue.push(dependent, lengthOf(dependent), deepest + 1)
    }
  }
}

/** A binary heap of nodes by the length they would settle at. */
class SettleQueue {
  private readonly items: Array<{ readonly node: Draft; readonly length: number; readonly nesting: number }> = []

  push(node: Draft, length: number, nesting: number): void {
    const items = this.items
    items.push({ node, length, nesting })
    for (let at = items.length - 1; at > 0; ) {
      const parent = (at - 1) >> 1
      if (items[parent]!.length <= items[at]!.length) break
      ;[items[parent], items[at]] = [items[at]!, items[parent]!]
      at = parent
    }
  }

  pop(): { readonly node: Draft; readonly length: number; readonly nesting: number } | undefined {
    const items = this.items
    const first = items[0]
    const last = items.pop()
    if (first === undefined || last === undefined || items.length === 0) return first
    items[0] = last
    for (let at = 0; ; ) {
      const left = 2 * at + 1
      const right = left + 1
      let least = at
      if (left < items.length && items[left]!.length < items[least]!.length) least = left
      if (right < items.length && items[right]!.length < items[least]!.length) least = right
      if (least === at) break
      ;[items[least], items[at]] = [items[at]!, items[least]!]
      at = least
    }
    return first
  }
}

/** An object's layout in one pass from its last property back. */
const layout = (node: Extract<Draft, { kind: "object" }>): ObjectLayout => {
  const properties = node.properties
  const count = properties.length
  const nextRequired = new Array<number>(count + 1).fill(count)
  const cheapest = new Array<number>(count + 1).fill(-1)
  const tail = new Array<number>(count + 1).fill(1)
  const nextKey = new Array<number>(count + 1).fill(Infinity)
  for (let i = count - 1; i >= 0; i--) {
    const p = properties[i]!
    nextRequired[i] = p.required ? i : nextRequired[i + 1]!
    // The candidates at i: i itself, and if it may be left out, those at i + 1 (earlier wins a tie).
    const cost = p.key.length + 1 + p.value.minLength + tail[i + 1]!
    if (p.required || cost <= nextKey[i + 1]!) {
      nextKey[i] = cost
      cheapest[i] = i
    } else {
      nextKey[i] = nextKey[i + 1]!
      cheapest[i] = cheapest[i + 1]!
    }
    tail[i] = nextRequired[i]! < count ? 1 + nextKey[i]! : 1
  }
  const open = nextRequired[0]! < count ? nextKey[0]! : 1
  return { nextRequired, cheapest, tail, nextKey, open }
}
