import {
  type Grammar,
  type GrammarNode,
  keyCandidates,
  type LiteralTrie,
  mayCloseAt,
  numberLimits
} from "./GrammarNodes.js"
import { append, Completions } from "./Completions.js"
import { stringClosed, stringCompletion, stringNext, stringPlain, stringRefused } from "./JsonString.js"
import {
  afterValue,
  arrayAfterValue,
  arrayNextSpace,
  arrayNextValue,
  char,
  colon,
  dot,
  exponent,
  exponentDigits,
  exponentSign,
  fractionDigits,
  integerDigits,
  isDigit,
  key,
  minus,
  nextKey,
  nextSpace,
  open,
  value,
  valueSpace,
  zero
} from "./MachinePhases.js"

/**
 * A grammar as a pushdown machine over bytes. A thread is a stack of frames (the value being
 * written on top, the values it sits in below); a state is the set of threads still alive (more
 * than one only where anyOf or enum branches share a prefix). Frames are interned per grammar and
 * remember their moves per byte, so stepping is a table look-up and an allocation.
 *
 * Every frame knows `need`: the fewest bytes that finish it, which is the length of the shortest
 * completion; a thread's need adds the frames below it. Every frame can also write that shortest
 * completion, so a budget can always be met when need bytes fit in it.
 */

/** What a frame does with a byte: become another frame; become `frame` with `child` on top; end; end before it. */
export type Move =
  | { readonly kind: "replace"; readonly frame: Frame }
  | { readonly kind: "push"; readonly frame: Frame; readonly child: Frame }
  | { readonly kind: "pop" }
  | { readonly kind: "pass" }

const pop: Move = { kind: "pop" }
const pass: Move = { kind: "pass" }
const none: ReadonlyArray<Move> = []

export type FrameKind = "value" | "object" | "array" | "string" | "number" | "literal" | "complete"

export class Frame {
  private moveTable: Array<ReadonlyArray<Move> | undefined> | undefined
  private completionBytes: ReadonlyArray<number> | undefined

  constructor(
    readonly machine: Machine,
    readonly kind: FrameKind,
    /** Equal for equal frames of equal grammars: the key of mask caches. */
    readonly sig: string,
    /** The fewest bytes that finish this frame. */
    readonly need: number,
    /** The frame may end here: the next byte then belongs to the frame below. */
    readonly canEnd: boolean,
    readonly node: GrammarNode | undefined,
    readonly phase: number,
    /** Objects: the property (its key or value under way, or the next one); arrays: items so far; numbers: digits. */
    readonly index: number,
    /** Objects in a key: bytes of it written; strings: the substate. */
    readonly position: number,
    /** Objects in a key: the properties whose key starts with what was written. */
    readonly candidates: ReadonlyArray<number>,
    readonly literal: LiteralTrie | undefined
  ) {}

  movesOn(byte: number): ReadonlyArray<Move> {
    if (this.moveTable === undefined) this.moveTable = new Array(256)
    const table = this.moveTable
    let moves = table[byte]
    if (moves === undefined) {
      moves = this.machine.moves(this, byte)
      table[byte] = moves
    }
    return moves
  }

  /** The shortest bytes that finish this frame. */
  get completion(): ReadonlyArray<number> {
    this.completionBytes ??= this.machine.completion(this)
    return this.completionBytes
  }
}

export class Thread {
  readonly need: number
  private signature: string | undefined

  constructor(
    readonly frame: Frame,
    readonly below: Thread | undefined
  ) {
    this.need = frame.need + (below === undefined ? 0 : below.need)
  }

  get sig(): string {
    this.signature ??= this.below === undefined ? this.frame.sig : `${this.frame.sig} ${this.below.sig}`
    return this.signature
  }

  /** A whole value is written: the sequence may end. */
  get accepting(): boolean {
    return this.frame.kind === "complete" || (this.frame.canEnd && this.below === undefined)
  }

  /** The shortest bytes that finish the value. */
  completion(): Array<number> {
    const bytes: Array<number> = []
    for (let thread: Thread | undefined = this; thread !== undefined; thread = thread.below) {
      append(bytes, thread.frame.completion)
    }
    return bytes
  }
}

/** The threads `thread` becomes after `byte`, added to `out`. */
export const stepThread = (thread: Thread, byte: number, out: Array<Thread>): void => {
  const moves = thread.frame.movesOn(byte)
  for (let i = 0; i < moves.length; i++) {
    const move = moves[i]!
    switch (move.kind) {
      case "replace":
        out.push(new Thread(move.frame, thread.below))
        break
      case "push":
        out.push(new Thread(move.child, new Thread(move.frame, thread.below)))
        break
      case "pop":
        out.push(thread.below ?? thread.frame.machine.done)
        break
      case "pass":
        if (thread.below !== undefined) stepThread(thread.below, byte, out)
        break
    }
  }
}

/** The state after `bytes` (threads with equal stacks kept once); empty when they are refused. */
export const stepState = (threads: ReadonlyArray<Thread>, bytes: Uint8Array): Array<Thread> => {
  let current: Array<Thread> = [...threads]
  for (let i = 0; i < bytes.length && current.length > 0; i++) {
    const next: Array<Thread> = []
    for (const thread of current) stepThread(thread, bytes[i]!, next)
    current = next
  }
  if (current.length <= 1) return current
  const unique = new Map<string, Thread>()
  for (const thread of current) if (!unique.has(thread.sig)) unique.set(thread.sig, thread)
  return [...unique.values()].sort((a, b) => (a.sig < b.sig ? -1 : a.sig > b.sig ? 1 : 0))
}

const machines = new WeakMap<Grammar, Machine>()

/** The grammar's machine, made once. */
export const machineOf = (grammar: Grammar): Machine => {
  let machine = machines.get(grammar)
  if (machine === undefined) {
    machine = new Machine(grammar)
    machines.set(grammar, machine)
  }
  return machine
}

export class Machine {
  private readonly frames = new Map<string, Frame>()
  private readonly completions = new Completions({
    objectFrame: (node, phase, index) => this.objectFrame(node, phase, index),
    arrayFrame: (node, phase, count) => this.arrayFrame(node, phase, count)
  })
  /** The thread of a finished value. */
  readonly done: Thread
  /** The state before the first byte. */
  readonly start: ReadonlyArray<Thread>

  constructor(readonly grammar: Grammar) {
    this.done = new Thread(this.frame("complete", "$", 0, false, undefined, 0, 0, 0, [], undefined), undefined)
    const root = grammar.root
    this.start = [
      new Thread(this.frame("value", `v${root.id}`, root.minLength, false, root, 0, 0, 0, [], undefined), undefined)
    ]
  }

  private frame(
    kind: FrameKind,
    sig: string,
    need: number,
    canEnd: boolean,
    node: GrammarNode | undefined,
    phase: number,
    index: number,
    position: number,
    candidates: ReadonlyArray<number>,
    literal: LiteralTrie | undefined
  ): Frame {
    let frame = this.frames.get(sig)
    if (frame === undefined) {
      frame = new Frame(this, kind, sig, need, canEnd, node, phase, index, position, candidates, literal)
      this.frames.set(sig, frame)
    }
    return frame
  }

  private objectFrame(
    node: Extract<GrammarNode, { kind: "object" }>,
    phase: number,
    index: number,
    position = 0,
    candidates: ReadonlyArray<number> = []
  ): Frame {
    // In a key, the candidates are the keys from `index` on (up to a required one) that start with
    // the bytes written so far: the first of them names those bytes, and so the whole list.
    const sig = `o${node.id}.${phase}.${index}.${position}.${candidates[0] ?? ""}`
    const existing = this.frames.get(sig)
    if (existing !== undefined) return existing
    let need: number
    if (node.extra !== undefined) {
      const m = node.extra.minLength
      need = [1, 0, m + 2, m + 1, m + 1, 1, m + 4, m + 4][phase]!
    } else {
      const { tail, nextKey: nextKeyNeed, open: openNeed } = node.layout
      const rest = (j: number) => node.properties[j]!.value.minLength + tail[j + 1]!
      switch (phase) {
        case open:
          need = openNeed
          break
        case key:
          need = Math.min(...candidates.map((j) => node.properties[j]!.key.length - position + 1 + rest(j)))
          break
        case colon:
          need = 1 + rest(index)
          break
        case valueSpace:
        case value:
          need = rest(index)
          break
        case afterValue:
          need = tail[index]!
          break
        default:
          need = nextKeyNeed[index]!
      }
    }
    return this.frame("object", sig, need, false, node, phase, index, position, candidates, undefined)
  }

  private arrayFrame(node: Extract<GrammarNode, { kind: "array" }>, phase: number, count: number): Frame {
    // Past minItems, the count matters only up to a finite maxItems.
    const items = node.maxItems === Infinity ? Math.min(count, node.minItems) : count
    const sig = `a${node.id}.${phase}.${items}`
    const existing = this.frames.get(sig)
    if (existing !== undefined) return existing
    const m = node.items.minLength
    const after = (c: number) => (c >= node.minItems ? 1 : (node.minItems - c) * (m + 1) + 1)
    const need =
      phase === open
        ? node.minItems === 0
          ? 1
          : m + after(1)
        : phase === arrayAfterValue
          ? after(items)
          : m + after(items + 1)
    return this.frame("array", sig, need, false, node, phase, items, 0, [], undefined)
  }

  private stringFrame(substate: number): Frame {
    return this.frame(
      "string",
      `s${substate}`,
      stringCompletion[substate]!.length + 1,
      false,
      undefined,
      0,
      0,
      substate,
      [],
      undefined
    )
  }

  private numberFrame(integer: boolean, phase: number, digits: number): Frame {
    const open = phase === minus || phase === dot || phase === exponent || phase === exponentSign
    return this.frame(
      "number",
      `n${integer ? "i" : "f"}.${phase}.${digits}`,
      open ? 1 : 0,
      !open,
      undefined,
      phase,
      digits,
      integer ? 1 : 0,
      [],
      undefined
    )
  }

  private literalFrame(trie: LiteralTrie): Frame {
    return this.frame("literal", `l${trie.id}`, trie.minRemaining, trie.terminal, undefined, 0, 0, 0, [], trie)
  }

  /** The first frame of a value of `node` that starts with `byte`; undefined where the byte is the whole value. */
  private valueStart(node: GrammarNode, byte: number, out: Array<Frame | undefined>): void {
    switch (node.kind) {
      case "object":
        if (byte === char("{")) out.push(this.objectFrame(node, open, 0))
        return
      case "array":
        if (byte === char("[")) out.push(this.arrayFrame(node, open, 0))
        return
      case "string":
        if (byte === char('"')) out.push(this.stringFrame(stringPlain))
        return
      case "number":
        if (byte === char("-")) out.push(this.numberFrame(node.integer, minus, 0))
        else if (byte === char("0")) out.push(this.numberFrame(node.integer, zero, 1))
        else if (isDigit(byte)) out.push(this.numberFrame(node.integer, integerDigits, 1))
        return
      case "literal": {
        const child = node.trie.children.get(byte)
        if (child === undefined) return
        out.push(child.terminal && child.children.size === 0 ? undefined : this.literalFrame(child))
        return
      }
      case "union":
        for (const option of node.options) this.valueStart(option, byte, out)
    }
  }

  /** A value of `node` starting with `byte`, in a frame that becomes `after` once the value is written. */
  private valueMoves(node: GrammarNode, byte: number, after: Frame): ReadonlyArray<Move> {
    const starts: Array<Frame | undefined> = []
    this.valueStart(node, byte, starts)
    return starts.map((child) =>
      child === undefined ? { kind: "replace", frame: after } : { kind: "push", frame: after, child }
    )
  }

  moves(frame: Frame, byte: number): ReadonlyArray<Move> {
    switch (frame.kind) {
      case "value": {
        const starts: Array<Frame | undefined> = []
        this.valueStart(frame.node!, byte, starts)
        return starts.map((child) => (child === undefined ? pop : { kind: "replace", frame: child }))
      }
      case "object":
        return this.objectMoves(frame, frame.node as Extract<GrammarNode, { kind: "object" }>, byte)
      case "array":
        return this.arrayMoves(frame, frame.node as Extract<GrammarNode, { kind: "array" }>, byte)
      case "string": {
        const next = stringNext(frame.position, byte)
        if (next === stringClosed) return [pop]
        if (next === stringRefused) return none
        return [{ kind: "replace", frame: this.stringFrame(next) }]
      }
      case "number":
        return this.numberMoves(frame, byte)
      case "literal": {
        const trie = frame.literal!
        const child = trie.children.get(byte)
        if (child !== undefined) {
          return [
            child.terminal && child.children.size === 0 ? pop : { kind: "replace", frame: this.literalFrame(child) }
          ]
        }
        return trie.terminal ? [pass] : none
      }
      case "complete":
        return none
    }
  }

  private objectMoves(frame: Frame, node: Extract<GrammarNode, { kind: "object" }>, byte: number): ReadonlyArray<Move> {
    const any = node.extra !== undefined
    const index = frame.index
    const replace = (
      phase: number,
      at = index,
      position = 0,
      candidates: ReadonlyArray<number> = []
    ): ReadonlyArray<Move> => [{ kind: "replace", frame: this.objectFrame(node, phase, at, position, candidates) }]
    const startKey = (at: number): ReadonlyArray<Move> => {
      if (any) return [{ kind: "push", frame: this.objectFrame(node, colon, 0), child: this.stringFrame(stringPlain) }]
      const candidates = keyCandidates(node.layout, at)
      return candidates.length === 0 ? none : replace(key, at, 1, candidates)
    }
    const startValue = () =>
      any
        ? this.valueMoves(node.extra!, byte, this.objectFrame(node, afterValue, 0))
        : this.valueMoves(node.properties[index]!.value, byte, this.objectFrame(node, afterValue, index + 1))
    const mayClose = (at: number) => any || mayCloseAt(node.layout, at)
    switch (frame.phase) {
      case open:
        if (byte === char("}") && mayClose(0)) return [pop]
        return byte === char('"') ? startKey(0) : none
      case key: {
        const matched = frame.candidates.filter((j) => node.properties[j]!.key[frame.position] === byte)
        if (matched.length === 0) return none
        const finished = matched.find((j) => node.properties[j]!.key.length === frame.position + 1)
        return finished !== undefined ? replace(colon, finished) : replace(key, index, frame.position + 1, matched)
      }
      case colon:
        return byte === char(":") ? replace(valueSpace) : none
      case valueSpace:
        return byte === char(" ") ? replace(value) : startValue()
      case value:
        return startValue()
      case afterValue:
        if (byte === char(",")) return any || index < node.properties.length ? replace(nextSpace) : none
        return byte === char("}") && mayClose(index) ? [pop] : none
      case nextSpace:
        if (byte === char(" ")) return replace(nextKey)
        return byte === char('"') ? startKey(index) : none
      default:
        return byte === char('"') ? startKey(index) : none
    }
  }

  private arrayMoves(frame: Frame, node: Extract<GrammarNode, { kind: "array" }>, byte: number): ReadonlyArray<Move> {
    const count = frame.index
    const item = (made: number) => this.valueMoves(node.items, byte, this.arrayFrame(node, arrayAfterValue, made))
    switch (frame.phase) {
      case open:
        if (byte === char("]") && node.minItems === 0) return [pop]
        return node.maxItems >= 1 ? item(1) : none
      case arrayAfterValue:
        if (byte === char(",") && count < node.maxItems) {
          return [{ kind: "replace", frame: this.arrayFrame(node, arrayNextSpace, count) }]
        }
        return byte === char("]") && count >= node.minItems ? [pop] : none
      case arrayNextSpace:
        if (byte === char(" ")) return [{ kind: "replace", frame: this.arrayFrame(node, arrayNextValue, count) }]
        return item(count + 1)
      default:
        return item(count + 1)
    }
  }

  private numberMoves(frame: Frame, byte: number): ReadonlyArray<Move> {
    const integer = frame.position === 1
    const digits = frame.index
    const to = (phase: number, count: number): ReadonlyArray<Move> => [
      { kind: "replace", frame: this.numberFrame(integer, phase, count) }
    ]
    const digit = isDigit(byte)
    const fractionOrExponent = (): ReadonlyArray<Move> =>
      integer
        ? [pass]
        : byte === char(".")
          ? to(dot, 0)
          : byte === char("e") || byte === char("E")
            ? to(exponent, 0)
            : [pass]
    switch (frame.phase) {
      case minus:
        return byte === char("0") ? to(zero, 1) : digit ? to(integerDigits, 1) : none
      case zero:
        return fractionOrExponent()
      case integerDigits:
        return digit
          ? digits < numberLimits.integerDigits
            ? to(integerDigits, digits + 1)
            : [pass]
          : fractionOrExponent()
      case dot:
        return digit ? to(fractionDigits, 1) : none
      case fractionDigits:
        if (digit) return digits < numberLimits.fractionDigits ? to(fractionDigits, digits + 1) : [pass]
        return byte === char("e") || byte === char("E") ? to(exponent, 0) : [pass]
      case exponent:
        if (byte === char("+") || byte === char("-")) return to(exponentSign, 0)
        return digit ? to(exponentDigits, 1) : none
      case exponentSign:
        return digit ? to(exponentDigits, 1) : none
      default:
        return digit && digits < numberLimits.exponentDigits ? to(exponentDigits, digits + 1) : [pass]
    }
  }

  /** The shortest bytes that finish `frame`. */
  completion(frame: Frame): ReadonlyArray<number> {
    return this.completions.completion(frame)
  }
}
