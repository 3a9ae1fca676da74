import { Random } from "../../models/Random.js"
import type { SamplingParams } from "./protocol.js"
import type { ConstrainedDecoder } from "./structured/ConstrainedDecoder.js"

/**
 * Picks a request's next token from its logits, with transformers.js's steps in its order: the
 * repetition penalty over every token seen so far (prompt and generated, greedy or not), then
 * the temperature, then the top_k most likely tokens, then (as transformers does next) the
 * smallest set of those whose probability reaches top_p; a draw from the softmax of what is
 * left. Temperature 0 is greedy. Each request has its own seeded generator, so a seed gives the
 * same tokens whatever the request is batched with.
 */
export type SamplerParams = Pick<
  SamplingParams,
  "temperature" | "topP" | "seed" | "topK" | "repetitionPenalty" | "presencePenalty" | "frequencyPenalty" | "logprobs"
>

/** A token's log probability under the model, and its most likely alternatives' ([token, logprob, …]). */
export interface TokenLogprobs {
  readonly logprob: number
  readonly top: ReadonlyArray<number>
}

export class Sampler {
  private readonly random: Random
  private readonly temperature: number
  private readonly topP: number
  private readonly topK: number
  private readonly repetitionPenalty: number
  /** The prompt's ids and every token drawn so far, in order. */
  private readonly history: Array<number>
  /** The distinct tokens of the history, which the repetition penalty applies to. */
  private readonly seen: Set<number>
  private readonly presencePenalty: number
  private readonly frequencyPenalty: number
  /** How often each token was generated (not the prompt's), for the presence and frequency penalties. */
  private readonly generated = new Map<number, number>()
  private readonly logprobs: number | undefined
  /** The last drawn token's log probabilities, when they were asked for. */
  lastLogprobs: TokenLogprobs | undefined

  constructor(
    sampling: SamplerParams,
    promptIds: ArrayLike<number> = [],
    /** Holds the output to a JSON format: tokens it does not allow are never drawn. */
    private readonly constraint?: ConstrainedDecoder
  ) {
    this.temperature = sampling.temperature
    this.topP = sampling.topP
    this.topK = sampling.topK ?? 0
    this.repetitionPenalty = sampling.repetitionPenalty ?? 1
    this.random = new Random(sampling.seed)
    this.history = Array.from(promptIds)
    this.seen = new Set(this.history)
    this.presencePenalty = sampling.presencePenalty ?? 0
    this.frequencyPenalty = sampling.frequencyPenalty ?? 0
    this.logprobs = sampling.logprobs
  }

  /** The token for `logits[from, from + vocab)`; it joins the history the next draw sees. */
  next(logits: Float32Array, from: number, vocab: number, remainingTokens = Infinity): number {
    const scores = this.scores(logits, from, vocab)
    const token = this.draw(this.constraint === undefined ? scores : this.masked(scores, logits, remainingTokens))
    this.constraint?.accept(token)
    if (this.logprobs !== undefined) this.lastLogprobs = logprobsOf(logits, from, vocab, token, this.logprobs)
    this.history.push(token)
    this.seen.add(token)
    this.generated.set(token, (this.generated.get(token) ?? 0) + 1)
    return token
  }

  /**
   * The row's logits after the repetition penalty and the temperature, in float32 as
   * transformers.js computes them. The row is copied before any change: rows of a batch share
   * one buffer.
   */
  scores(logits: Float32Array, from: number, vocab: number): Float32Array {
    const penalize = this.repetitionPenalty !== 1
    const openAiPenalize = (this.presencePenalty !== 0 || this.frequencyPenalty !== 0) && this.generated.size > 0
    const scale = this.temperature !== 0 && this.temperature !== 1
    if (!penalize && !scale && !openAiPenalize) return logits.subarray(from, from + vocab)
    const row = logits.slice(from, from + vocab)
    if (penalize) {
      for (const token of this.seen) {
        if (token < 0 || token >= vocab) continue
        if (row[token]! < 0) row[token]! *= this.repetitionPenalty
        else row[token]! /= this.repetitionPenalty
      }
    }
    if (openAiPenalize) {
      for (const [token, count] of this.generated) {
        if (token < 0 || token >= vocab) continue
        row[token]! -= this.presencePenalty + count * this.frequencyPenalty
      }
    }
    if (scale) for (let i = 0; i < vocab; i++) row[i]! /= this.temperature
    return row
  }

  /** The constrained value is whole: nothing but the end of sequence may follow. */
  get constraintDone(): boolean {
    return this.constraint?.done === true
  }

  /** The scores with every token the constraint does not allow now at -Infinity (a copy where they were the logits). */
  private masked(scores: Float32Array, logits: Float32Array, remainingTokens: number): Float32Array {
    const mask = this.constraint!.mask(remainingTokens)
    const row = scores.buffer === logits.buffer ? scores.slice() : scores
    const allowed = Math.min(mask.length, row.length)
    for (let token = 0; token < allowed; token++) if (mask[token] === 0) row[token] = -Infinity
    row.fill(-Infinity, allowed)
    return row
  }

  private draw(scores: Float32Array): number {
    if (this.temperature === 0) return argmax(scores, 0, scores.length)
    const tokens = this.topK > 0 && this.topK < scores.length ? topK(scores, this.topK) : undefined
    const max = tokens === undefined ? scores[argmax(scores, 0, scores.length)]! : scores[tokens[0]!]!
    const count = tokens?.length ?? scores.length
    const weights = new Float64Array(count)
    let total = 0
    for (let i = 0; i < count; i++) {
      weights[i] = Math.exp(scores[tokens === undefined ? i : tokens[i]!]! - max)
      total += weights[i]!
    }
    const kept = this.topP < 1 ? nucleus(weights, this.topP * total) : undefined
    let draw = this.random.uniform() * (kept?.mass ?? total)
    const token = (index: number) => (tokens === undefined ? index : tokens[index]!)
    if (kept !== undefined) {
      for (const index of kept.indices) {
        draw -= weights[index]!
        if (draw < 0) return token(index)
      }
      return token(kept.indices[kept.indices.length - 1]!)
    }
    for (let index = 0; index < count; index++) {
      draw -= weights[index]!
      if (draw < 0) return token(index)
    }
    // Rounding left the draw past the last weight: the most likely token.
    return tokens === undefined ? argmax(scores, 0, count) : tokens[0]!
  }
}

/**
 * The k highest scores' tokens, highest first; equal scores keep the lower token first (as the
 * TopK operator transformers.js samples with does).
 */
export const topK = (scores: Float32Array, k: number): Array<number> => {
  // A min-heap of the best k so far, worst at the root: lower score, or equal score and later token.
  const heap: Array<number> = []
  const worse = (a: number, b: number) => scores[a]! < scores[b]! || (scores[a] === scores[b] && a > b)
  const siftDown = (start: number) => {
    let i = start
    for (;;) {
      const left = 2 * i + 1
      const right = left + 1
      let worst = i
      if (left < heap.length && worse(heap[left]!, heap[worst]!)) worst = left
      if (right < heap.length && worse(heap[right]!, heap[worst]!)) worst = right
      if (worst === i) return
      ;[heap[i], heap[worst]] = [heap[worst]!, heap[i]!]
      i = worst
    }
  }
  for (let token = 0; token < scores.length; token++) {
    if (heap.length < k) {
      heap.push(token)
      let i = heap.length - 1
      while (i > 0) {
        const parent = (i - 1) >> 1
        if (!worse(heap[i]!, heap[parent]!)) break
        ;[heap[i], heap[parent]] = [heap[parent]!, heap[i]!]
        i = parent
      }
    } else if (worse(heap[0]!, token)) {
      heap[0] = token
      siftDown(0)
    }
  }
  return heap.sort((a, b) => (worse(a, b) ? 1 : worse(b, a) ? -1 : 0))
}

/** Indices of the largest weights, largest first, until their weight reaches `mass`. */
const nucleus = (
  weights: Float64Array,
  mass: number
): { readonly indices: ReadonlyArray<number>; readonly mass: number } => {
  const order = Array.from({ length: weights.length }, (_, i) => i).filter((i) => weights[i]! > 0)
  order.sort((a, b) => weights[b]! - weights[a]! || a - b)
  const indices: Array<number> = []
  let sum = 0
  for (const index of order) {
    indices.push(index)
    sum += weights[index]!
    if (sum >= mass) break
  }
  return { indices, mass: sum }
}

/**
 * `token`'s log probability under the softmax of the raw logits (the model's own distribution,
 * before penalties, temperature and truncation, as vLLM reports by default), and the `count` most
 * likely tokens' with theirs.
 */
export const logprobsOf = (
  logits: Float32Array,
  from: number,
  vocab: number,
  token: number,
  count: number
): TokenLogprobs => {
  const row = logits.subarray(from, from + vocab)
  let max = -Infinity
  for (let i = 0; i < vocab; i++) if (row[i]! > max) max = row[i]!
  let sum = 0
  for (let i = 0; i < vocab; i++) sum += Math.exp(row[i]! - max)
  const logZ = max + Math.log(sum)
  const top: Array<number> = []
  if (count > 0) for (const best of topK(row, count)) top.push(best, row[best]! - logZ)
  return { logprob: row[token]! - logZ, top }
}

export const argmax = (values: Float32Array, from: number, length: number): number => {
  let best = 0
  let bestValue = values[from]!
  for (let i = 1; i < length; i++) {
    const value = values[from + i]!
    if (value > bestValue) {
      bestValue = value
      best = i
    }
  }
  return best
}
