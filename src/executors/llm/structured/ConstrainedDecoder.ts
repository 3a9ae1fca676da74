import type { Grammar } from "./GrammarNodes.js"
import { machineOf, stepState, type Thread } from "./JsonMachine.js"
import { computeMask, computeNeedLevels } from "./TokenMask.js"
import { type MaskEntry, type TokenVocabulary, UnspelledBytes } from "./TokenVocabulary.js"

/**
 * One request's constrained decoding: which tokens may come next so that the output is a value of
 * the grammar, finished within the token budget. Each step the sampler asks `mask(remaining)`,
 * sets the logits of tokens whose mask is 0 to -Infinity, draws, and tells `accept(token)`;
 * once `done`, nothing but the end of sequence may follow and generation can stop.
 *
 * The budget: each state knows the fewest bytes that finish the value, and each allowed token the
 * fewest bytes after it. While every allowed token leaves at most `remaining - 1` bytes to write,
 * the cached mask is used as is (every byte is a token, so bytes bound tokens). Closer to the end,
 * a token is allowed only if its bytes still fit, or if it follows the plan: the shortest
 * completion of the current state, tokenized with the fewest tokens, whose cost in tokens is
 * known from every position. Either way the output can always be finished in time; a budget
 * below `minimumTokens()` at the start cannot be met (the router may refuse it), and the decoder
 * then follows the plan as far as the budget goes.
 */
export class ConstrainedDecoder {
  private threads: ReadonlyArray<Thread>
  /** The state's key in the vocabulary's mask cache. */
  private maskKey: string
  private entry: MaskEntry | undefined
  /** The mask last answered for this state, which accept holds the token to. */
  private answered: Uint8Array | undefined
  private plan: Plan | undefined
  private ended = false
  private readonly tight: Uint8Array

  constructor(
    readonly grammar: Grammar,
    readonly vocabulary: TokenVocabulary
  ) {
    if (vocabulary.missingBytes.length > 0) throw new UnspelledBytes({ bytes: vocabulary.missingBytes })
    this.threads = machineOf(grammar).start
    this.maskKey = vocabulary.maskKey(grammar.key, signature(this.threads))
    this.tight = new Uint8Array(vocabulary.size)
  }

  /** The value is complete: the end of sequence is allowed. */
  get complete(): boolean {
    return this.threads.some((thread) => thread.accepting)
  }

  /** The value is complete and nothing may follow it but the end of sequence. */
  get done(): boolean {
    return this.threads.every((thread) => thread.frame.kind === "complete")
  }

  /** The fewest tokens that finish the value from here (all of it, before the first token). */
  minimumTokens(): number {
    const plan = this.currentPlan()
    return plan.cost[plan.position]!
  }

  /**
   * 1 for each token that may come next, with `remainingTokens` tokens left to generate (this one
   * included). Read-only; valid until the next call.
   */
  mask(remainingTokens = Infinity): Uint8Array {
    if (this.ended) throw new Error("constrained decoding has ended: the end of sequence was accepted")
    const entry = this.currentEntry()
    const limit = remainingTokens - 1
    if (entry.maxNeed <= limit) {
      this.answered = entry.mask
      return entry.mask
    }
    const levels = this.vocabulary.needLevels(this.maskKey, entry, () =>
      computeNeedLevels(this.vocabulary, this.threads)
    )
    const out = this.tight
    let allowed = levels.tokens.length
    if (levels.needs[levels.needs.length - 1]! > limit) {
      out.fill(0)
      allowed = 0
    } else {
      out.set(entry.mask)
      for (let level = 0, from = 0; levels.needs[level]! > limit; from = levels.ends[level++]!) {
        for (let i = from; i < levels.ends[level]!; i++) out[levels.tokens[i]!] = 0
        allowed -= levels.ends[level]! - from
      }
    }
    const plan = this.currentPlan()
    const trie = this.vocabulary.trie
    const along = (accept: (cost: number) => boolean) => {
      let node = 0
      for (let at = plan.position; at < plan.bytes.length; at++) {
        node = trie.child(node, plan.bytes[at]!)
        if (node < 0) return
        if (!accept(1 + plan.cost[at + 1]!)) continue
        for (let i = trie.tokenStart[node]!; i < trie.tokenStart[node + 1]!; i++) {
          const token = trie.tokenIds[i]!
          allowed += 1 - out[token]!
          out[token] = 1
        }
      }
    }
    along((cost) => cost <= remainingTokens)
    if (allowed === 0) {
      // The budget cannot be met: go the plan's cheapest way, as far as it lasts.
      along((cost) => cost === plan.cost[plan.position])
    }
    for (const token of this.vocabulary.endOfSequence) out[token] = entry.mask[token]!
    this.answered = out
    return out
  }

  /** Moves past `token`; throws if the last mask (or, without one, the grammar) does not allow it. */
  accept(token: number): void {
    if (this.ended) throw new Error("constrained decoding has ended: the end of sequence was accepted")
    if (this.answered !== undefined && this.answered[token] !== 1) {
      throw new Error(`token ${token} is not allowed here`)
    }
    if (this.vocabulary.endOfSequence.includes(token)) {
      if (!this.complete)
        throw new Error(`the end of sequence (token ${token}) is not allowed before the value is complete`)
      this.ended = true
      return
    }
    const bytes = this.vocabulary.bytes[token]
    const next = bytes === undefined ? [] : stepState(this.threads, bytes)
    if (bytes === undefined || next.length === 0) throw new Error(`token ${token} is not allowed here`)
    const plan = this.plan
    if (plan !== undefined) {
      const follows =
        plan.position + bytes.length <= plan.bytes.length &&
        bytes.every((byte, i) => plan.bytes[plan.position + i] === byte)
      if (follows) plan.position += bytes.length
      else this.plan = undefined
    }
    this.threads = next
    this.maskKey = this.vocabulary.maskKey(this.grammar.key, signature(next))
    this.entry = undefined
    this.answered = undefined
  }

  private currentEntry(): MaskEntry {
    this.entry ??= this.vocabulary.masked(this.maskKey, () => computeMask(this.vocabulary, this.threads))
    return this.entry
  }

  private currentPlan(): Plan {
    if (this.plan !== undefined) return this.plan
    const best = this.threads.reduce((a, b) => (b.need < a.need ? b : a))
    const bytes = Uint8Array.from(best.completion())
    const cost = new Float64Array(bytes.length + 1).fill(Infinity)
    cost[bytes.length] = 0
    const trie = this.vocabulary.trie
    for (let from = bytes.length - 1; from >= 0; from--) {
      let node = 0
      for (let at = from; at < bytes.length; at++) {
        node = trie.child(node, bytes[at]!)
        if (node < 0) break
        if (trie.tokenStart[node]! < trie.tokenStart[node + 1]!) cost[from] = Math.min(cost[from]!, 1 + cost[at + 1]!)
      }
    }
    this.plan = { bytes, cost, position: 0 }
    return this.plan
  }
}

/** The shortest completion of a state, and the fewest tokens that write it from each position. */
interface Plan {
  readonly bytes: Uint8Array
  readonly cost: Float64Array
  position: number
}

const signature = (threads: ReadonlyArray<Thread>): string => threads.map((thread) => thread.sig).join(";")
