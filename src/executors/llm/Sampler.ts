import { Random } from "../../models/Random.js"
import type { SamplingParams } from "./protocol.js"

/**
 * Picks a request's next token from its logits: the most likely one at temperature 0, otherwise a
 * draw from softmax(logits / temperature) restricted to the smallest set of most likely tokens
 * whose probability reaches top_p. Each request has its own seeded generator, so a seed gives the
 * same tokens whatever the request is batched with.
 */
export class Sampler {
  private readonly random: Random
  private readonly temperature: number
  private readonly topP: number
  /** The prompt's ids and every token drawn so far, in order. */
  private readonly history: Array<number>

  constructor(sampling: Pick<SamplingParams, "temperature" | "topP" | "seed">, promptIds: ArrayLike<number> = []) {
    this.temperature = sampling.temperature
    this.topP = sampling.topP
    this.random = new Random(sampling.seed)
    this.history = Array.from(promptIds)
  }

  /** The token for `logits[from, from + vocab)`; it joins the history the next draw sees. */
  next(logits: Float32Array, from: number, vocab: number): number {
    const token = this.draw(logits, from, vocab)
    this.history.push(token)
    return token
  }

  private draw(logits: Float32Array, from: number, vocab: number): number {
    if (this.temperature === 0) return argmax(logits, from, vocab)
    const max = logits[from + argmax(logits, from, vocab)]!
    const weights = new Float64Array(vocab)
    let total = 0
    for (let i = 0; i < vocab; i++) {
      weights[i] = Math.exp((logits[from + i]! - max) / this.temperature)
      total += weights[i]!
    }
    const candidates = this.topP < 1 ? nucleus(weights, this.topP * total) : undefined
    let draw = this.random.uniform() * (candidates?.mass ?? total)
    if (candidates !== undefined) {
      for (const token of candidates.tokens) {
        draw -= weights[token]!
        if (draw < 0) return token
      }
      return candidates.tokens[candidates.tokens.length - 1]!
    }
    for (let token = 0; token < vocab; token++) {
      draw -= weights[token]!
      if (draw < 0) return token
    }
    return argmax(logits, from, vocab)
  }
}

/** The most likely tokens, most likely first, until their weight reaches `mass`. */
const nucleus = (
  weights: Float64Array,
  mass: number
): { readonly tokens: ReadonlyArray<number>; readonly mass: number } => {
  const order = Array.from({ length: weights.length }, (_, i) => i).filter((i) => weights[i]! > 0)
  order.sort((a, b) => weights[b]! - weights[a]! || a - b)
  const tokens: Array<number> = []
  let sum = 0
  for (const token of order) {
    tokens.push(token)
    sum += weights[token]!
    if (sum >= mass) break
  }
  return { tokens, mass: sum }
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
