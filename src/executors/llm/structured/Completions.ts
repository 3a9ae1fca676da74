import { type GrammarNode, type LiteralTrie, mayCloseAt } from "./GrammarNodes.js"
import { stringCompletion } from "./JsonString.js"
import {
  afterValue,
  arrayAfterValue,
  char,
  colon,
  key,
  nextKey,
  nextSpace,
  open,
  value,
  valueSpace
} from "./MachinePhases.js"

/**
 * The shortest bytes that finish a frame of the JSON machine (JsonMachine.ts), and the shortest
 * value of each grammar node: what a budget that is running out writes, the bytes of the
 * cheapest way to a complete value from where the frame is.
 */

/** What a completion reads of a frame. */
export interface CompletingFrame {
  readonly kind: "value" | "object" | "array" | "string" | "number" | "literal" | "complete"
  readonly node: GrammarNode | undefined
  readonly phase: number
  readonly index: number
  readonly position: number
  readonly candidates: ReadonlyArray<number>
  readonly canEnd: boolean
  readonly literal: LiteralTrie | undefined
  readonly completion: ReadonlyArray<number>
}

/** The machine's frames a node's shortest value starts from. */
export interface StartFrames {
  objectFrame(node: Extract<GrammarNode, { kind: "object" }>, phase: number, index: number): CompletingFrame
  arrayFrame(node: Extract<GrammarNode, { kind: "array" }>, phase: number, count: number): CompletingFrame
}

export class Completions {
  private readonly minValues = new Map<GrammarNode, ReadonlyArray<number>>()

  constructor(private readonly frames: StartFrames) {}

  /** The shortest value of a node, as bytes. */
  minValue(node: GrammarNode): ReadonlyArray<number> {
    const known = this.minValues.get(node)
    if (known !== undefined) return known
    let bytes: ReadonlyArray<number>
    switch (node.kind) {
      case "object":
        bytes = [char("{"), ...this.frames.objectFrame(node, open, 0).completion]
        break
      case "array":
        bytes = [char("["), ...this.frames.arrayFrame(node, open, 0).completion]
        break
      case "string":
        bytes = [char('"'), char('"')]
        break
      case "number":
        bytes = [char("0")]
        break
      case "literal":
        bytes = literalCompletion(node.trie)
        break
      case "union": {
        const shortest = node.options.reduce((a, b) => (b.minLength < a.minLength ? b : a))
        bytes = this.minValue(shortest)
      }
    }
    this.minValues.set(node, bytes)
    return bytes
  }

  completion(frame: CompletingFrame): ReadonlyArray<number> {
    switch (frame.kind) {
      case "value":
        return this.minValue(frame.node!)
      case "object":
        return this.objectCompletion(frame, frame.node as Extract<GrammarNode, { kind: "object" }>)
      case "array": {
        const node = frame.node as Extract<GrammarNode, { kind: "array" }>
        if (frame.phase === open && node.minItems === 0) return [char("]")]
        const count = frame.phase === open ? 0 : frame.index
        const item = this.minValue(node.items)
        const bytes: Array<number> = []
        let made = count
        if (frame.phase !== arrayAfterValue) {
          bytes.push(...item)
          made++
        }
        for (; made < node.minItems; made++) bytes.push(char(","), ...item)
        bytes.push(char("]"))
        return bytes
      }
      case "string":
        return [...stringCompletion[frame.position]!, char('"')]
      case "number":
        return frame.canEnd ? [] : [char("0")]
      case "literal":
        return literalCompletion(frame.literal!)
      case "complete":
        return []
    }
  }

  private objectCompletion(
    frame: CompletingFrame,
    node: Extract<GrammarNode, { kind: "object" }>
  ): ReadonlyArray<number> {
    if (node.extra !== undefined) {
      const item = this.minValue(node.extra)
      const close = char("}")
      switch (frame.phase) {
        case colon:
          return [char(":"), ...item, close]
        case valueSpace:
        case value:
          return [...item, close]
        case nextSpace:
        case nextKey:
          return [char('"'), char('"'), char(":"), ...item, close]
        default:
          return [close]
      }
    }
    const { properties, layout } = node
    const close = char("}")
    /** The key of property `j` from its byte `from`, its shortest value, and the shortest way on to `}`. */
    const entry = (j: number, from: number): Array<number> => {
      const bytes: Array<number> = []
      for (let at = j, skip = from; ; skip = 0) {
        append(bytes, properties[at]!.key.subarray(skip))
        bytes.push(char(":"))
        append(bytes, this.minValue(properties[at]!.value))
        if (mayCloseAt(layout, at + 1)) break
        bytes.push(char(","))
        at = layout.cheapest[at + 1]!
      }
      bytes.push(close)
      return bytes
    }
    /** After a value, with properties from `i` left. */
    const after = (i: number): Array<number> =>
      mayCloseAt(layout, i) ? [close] : [char(","), ...entry(layout.cheapest[i]!, 0)]
    switch (frame.phase) {
      case open:
        return mayCloseAt(layout, 0) ? [close] : entry(layout.cheapest[0]!, 0)
      case key: {
        const from = frame.position
        const cost = (k: number) =>
          properties[k]!.key.length - from + properties[k]!.value.minLength + layout.tail[k + 1]!
        return entry(
          frame.candidates.reduce((best, j) => (cost(j) < cost(best) ? j : best)),
          from
        )
      }
      case colon:
        return [char(":"), ...this.minValue(properties[frame.index]!.value), ...after(frame.index + 1)]
      case valueSpace:
      case value:
        return [...this.minValue(properties[frame.index]!.value), ...after(frame.index + 1)]
      case afterValue:
        return after(frame.index)
      default:
        return entry(layout.cheapest[frame.index]!, 0)
    }
  }
}

/** Appends `bytes` to `out` one by one: a spread into push would take them all as arguments. */
export const append = (out: Array<number>, bytes: ArrayLike<number>): void => {
  for (let i = 0; i < bytes.length; i++) out.push(bytes[i]!)
}

const literalCompletion = (trie: LiteralTrie): Array<number> => {
  const bytes: Array<number> = []
  for (let node = trie; !node.terminal; node = node.children.get(node.minNext)!) bytes.push(node.minNext)
  return bytes
}
