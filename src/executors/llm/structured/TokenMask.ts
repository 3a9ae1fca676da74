import type { ByteTrie } from "./ByteTrie.js"
import { stepThread, type Thread } from "./JsonMachine.js"
import type { MaskEntry, NeedLevels, StringTokens, TokenVocabulary } from "./TokenVocabulary.js"

/**
 * The tokens a state allows: the vocabulary's trie walked against the machine, a subtree left as
 * soon as no thread survives its prefix. Inside a string (the one place where most of a
 * vocabulary is allowed) the walk is skipped: the tokens that stay in the string are known per
 * substate, and only the tokens that close it are walked, from the quote on.
 */
export const computeMask = (vocabulary: TokenVocabulary, threads: ReadonlyArray<Thread>): MaskEntry => {
  const mask = new Uint8Array(vocabulary.size)
  const { maxNeed } = walk(vocabulary, threads, mask, undefined)
  return { mask, maxNeed, byNeed: undefined }
}

/** The allowed tokens of a state by the fewest bytes each leaves to write, most first. */
export const computeNeedLevels = (vocabulary: TokenVocabulary, threads: ReadonlyArray<Thread>): NeedLevels => {
  const found: Found = { tokens: [], needs: [] }
  const { inside } = walk(vocabulary, threads, undefined, found)
  // Levels come from the tokens found one by one, and from the string's inside tokens by their need.
  const levels = new Map<number, { pairs: Array<number>; inside: Array<number> }>()
  const level = (need: number) => {
    let known = levels.get(need)
    if (known === undefined) {
      known = { pairs: [], inside: [] }
      levels.set(need, known)
    }
    return known
  }
  found.tokens.forEach((token, i) => level(found.needs[i]!).pairs.push(token))
  inside?.tokens.insideLevels.needs.forEach((need, i) => level(inside.below + need).inside.push(i))
  const needs = [...levels.keys()].sort((a, b) => b - a)
  const tokens = new Int32Array(found.tokens.length + (inside?.tokens.insideLevels.tokens.length ?? 0))
  const ends: Array<number> = []
  let at = 0
  for (const need of needs) {
    const { pairs, inside: groups } = levels.get(need)!
    for (const group of groups) {
      const { tokens: sorted, ends: groupEnds } = inside!.tokens.insideLevels
      const slice = sorted.subarray(group === 0 ? 0 : groupEnds[group - 1]!, groupEnds[group]!)
      tokens.set(slice, at)
      at += slice.length
    }
    for (const token of pairs) tokens[at++] = token
    ends.push(at)
  }
  return { tokens, needs, ends }
}

/** Allowed tokens found one by one, with the fewest bytes each leaves. */
interface Found {
  readonly tokens: Array<number>
  readonly needs: Array<number>
}

/**
 * Marks the allowed tokens in `mask` and lists them in `found`, except the tokens that stay
 * inside a string, which are answered as the string's substate and the need below it.
 */
const walk = (
  vocabulary: TokenVocabulary,
  threads: ReadonlyArray<Thread>,
  mask: Uint8Array | undefined,
  found: Found | undefined
): {
  readonly maxNeed: number
  readonly inside: { readonly tokens: StringTokens; readonly below: number } | undefined
} => {
  let maxNeed = 0
  const allowAt = (trie: ByteTrie, node: number, alive: ReadonlyArray<Thread>) => {
    const from = trie.tokenStart[node]!
    const to = trie.tokenStart[node + 1]!
    if (from === to) return
    let fewest = alive[0]!.need
    for (let i = 1; i < alive.length; i++) fewest = Math.min(fewest, alive[i]!.need)
    if (fewest > maxNeed) maxNeed = fewest
    for (let i = from; i < to; i++) {
      const token = trie.tokenIds[i]!
      if (mask !== undefined) mask[token] = 1
      if (found !== undefined) {
        found.tokens.push(token)
        found.needs.push(fewest)
      }
    }
  }
  const scratch: Array<Array<Thread>> = []
  const visit = (trie: ByteTrie, node: number, alive: ReadonlyArray<Thread>, depth: number) => {
    if (scratch.length === depth) scratch.push([])
    const next = scratch[depth]!
    const end = trie.childStart[node + 1]!
    for (let edge = trie.childStart[node]!; edge < end; edge++) {
      const byte = trie.childByte[edge]!
      next.length = 0
      for (let i = 0; i < alive.length; i++) stepThread(alive[i]!, byte, next)
      if (next.length === 0) continue
      const child = trie.childNode[edge]!
      allowAt(trie, child, next)
      if (trie.childStart[child]! < trie.childStart[child + 1]!) visit(trie, child, next, depth + 1)
    }
  }

  let inside: { readonly tokens: StringTokens; readonly below: number } | undefined
  const substate = commonStringSubstate(threads)
  if (substate === undefined) {
    visit(vocabulary.trie, 0, threads, 0)
  } else {
    const tokens = vocabulary.stringTokens(substate)
    let below = Infinity
    for (const thread of threads) below = Math.min(below, thread.need - thread.frame.need)
    inside = { tokens, below }
    mask?.set(tokens.inside)
    if (tokens.insideLevels.tokens.length > 0) maxNeed = below + tokens.insideLevels.needs[0]!
    const closed = threads.map((thread) => thread.below ?? thread.frame.machine.done)
    allowAt(tokens.closing, 0, closed)
    visit(tokens.closing, 0, closed, 0)
  }
  if (threads.some((thread) => thread.accepting)) {
    for (const token of vocabulary.endOfSequence) {
      if (mask !== undefined) mask[token] = 1
      if (found !== undefined) {
        found.tokens.push(token)
        found.needs.push(0)
      }
    }
  }
  return { maxNeed, inside }
}

/** The substate of the string every thread is in, if they all are in one. */
const commonStringSubstate = (threads: ReadonlyArray<Thread>): number | undefined => {
  const first = threads[0]
  if (first === undefined || first.frame.kind !== "string") return undefined
  for (const thread of threads) {
    if (thread.frame.kind !== "string" || thread.frame.position !== first.frame.position) return undefined
  }
  return first.frame.position
}
