import {
  LogitsProcessorList,
  RepetitionPenaltyLogitsProcessor,
  TemperatureLogitsWarper,
  Tensor,
  topk
} from "@huggingface/transformers"
import { describe, expect, it } from "vitest"
import { Sampler, type SamplerParams, topK } from "../../../src/executors/llm/Sampler.js"

/** Fixed logits: positive, negative, zero, ties. */
const row = Float32Array.from([1.5, -2.25, 3, 0, 3, -0.5, 2.75, 0.125, -3, 3])
const vocab = row.length

/** The row after transformers.js's repetition penalty over `history` and its temperature warper. */
const reference = (history: ReadonlyArray<number>, penalty: number, temperature: number): Float32Array => {
  const logits = new Tensor("float32", row.slice(), [1, vocab])
  const processors = new LogitsProcessorList()
  processors.push(new RepetitionPenaltyLogitsProcessor(penalty))
  processors.push(new TemperatureLogitsWarper(temperature))
  processors([history.map(BigInt)], logits)
  return logits.data as Float32Array
}

const sampler = (params: Partial<SamplerParams>, history: ReadonlyArray<number> = []) =>
  new Sampler({ temperature: 1, topP: 1, seed: 5, ...params }, history)

describe("Sampler's logits processing", () => {
  it("applies the repetition penalty to the prompt's tokens, then the temperature, as transformers.js does", () => {
    const history = [0, 1, 3, 1, 9]
    for (const penalty of [1.3, 0.8]) {
      for (const temperature of [1, 0.7]) {
        expect(sampler({ repetitionPenalty: penalty, temperature }, history).scores(row, 0, vocab)).toEqual(
          reference(history, penalty, temperature)
        )
      }
    }
  })

  it("penalizes the tokens it draws, for the next draw", () => {
    const greedy = sampler({ temperature: 0, repetitionPenalty: 2 })
    // Tokens 2, 4 and 9 tie at 3; each drawn one is halved, so the next tie-winner comes up.
    expect([greedy.next(row, 0, vocab), greedy.next(row, 0, vocab), greedy.next(row, 0, vocab)]).toEqual([2, 4, 9])
    expect(greedy.scores(row, 0, vocab)).toEqual(reference([2, 4, 9], 2, 1))
    expect(greedy.next(row, 0, vocab)).toBe(6)
  })

  it("applies the repetition penalty when greedy", () => {
    const history = [2, 4, 9]
    expect(sampler({ temperature: 0 }, history).next(row, 0, vocab)).toBe(2)
    expect(sampler({ temperature: 0, repetitionPenalty: 1.2 }, history).next(row, 0, vocab)).toBe(6)
  })

  it("reads its row of a batch's logits and leaves the shared buffer as it was", () => {
    const batch = Float32Array.from([...row.map((x) => -x), ...row])
    const before = batch.slice()
    const penalized = sampler({ temperature: 0.5, repetitionPenalty: 1.5 }, [6])
    expect(penalized.scores(batch, vocab, vocab)).toEqual(reference([6], 1.5, 0.5))
    penalized.next(batch, vocab, vocab)
    expect(batch).toEqual(before)
  })
})

describe("top_k", () => {
  it("keeps the tokens transformers.js's topk keeps, ties to the lower id", async () => {
    const tensor = new Tensor("float32", row.slice(), [1, vocab])
    for (const k of [1, 2, 3, 4, 5, 9]) {
      const [, indices] = await topk(tensor, k)
      expect(topK(row, k), `k=${k}`).toEqual(Array.from(indices.data as BigInt64Array, Number))
    }
  })

  it("draws only among the k most likely, in proportion to their softmax", () => {
    const topTwo = sampler({ topK: 2, seed: 11 })
    // Ties at 3 on tokens 2, 4 and 9: the two kept are 2 and 4, equally likely.
    const counts = new Map<number, number>()
    for (let i = 0; i < 4000; i++) {
      const token = topTwo.next(row, 0, vocab)
      counts.set(token, (counts.get(token) ?? 0) + 1)
    }
    expect([...counts.keys()].sort()).toEqual([2, 4])
    expect(counts.get(2)! / 4000).toBeGreaterThan(0.46)
    expect(counts.get(2)! / 4000).toBeLessThan(0.54)
  })

  it("cuts by top_k on the penalized logits, then by top_p", () => {
    // Penalized, 2, 4 and 9 fall to 1.5: the three most likely are then 6 (2.75), 0 (1.5) and 2 (1.5).
    const first = (params: Partial<SamplerParams>) =>
      new Set(
        Array.from({ length: 300 }, (_, seed) =>
          sampler({ topK: 3, repetitionPenalty: 2, seed, ...params }, [2, 4, 9]).next(row, 0, vocab)
        )
      )
    expect([...first({})].sort()).toEqual([0, 2, 6])
    // Of those, token 6 alone holds e^2.75 / (e^2.75 + 2e^1.5) ≈ 0.64 ≥ 0.6: the nucleus is {6}.
    expect([...first({ topP: 0.6 })]).toEqual([6])
  })

  it("keeps every token at top_k 0", () => {
    const all = sampler({ topK: 0, temperature: 2, seed: 1 })
    const seen = new Set(Array.from({ length: 3000 }, () => all.next(row, 0, vocab)))
    expect(seen.size).toBe(vocab)
  })
})

describe("Sampler's OpenAI penalties and log probabilities", () => {
  it("subtracts the presence penalty once and the frequency penalty per time a generated token appeared, not the prompt's", () => {
    const greedy = sampler({ temperature: 0, presencePenalty: 0.5, frequencyPenalty: 0.25 }, [6])
    // Ties among 2, 4 and 9 at 3: the lowest wins; the prompt's 6 is not penalized.
    expect(greedy.next(row, 0, vocab)).toBe(2)
    expect(greedy.scores(row, 0, vocab)[2]).toBeCloseTo(3 - 0.5 - 0.25, 6)
    expect(greedy.scores(row, 0, vocab)[6]).toBe(row[6])
    expect(greedy.next(row, 0, vocab)).toBe(4)
    expect(greedy.next(row, 0, vocab)).toBe(9)
    // Each of 2, 4, 9 said once: 3 - 0.75 = 2.25 < 2.75, so 6 comes next.
    expect(greedy.next(row, 0, vocab)).toBe(6)
  })

  it("reports the drawn token's log probability under the raw logits, and the top alternatives, when asked", () => {
    const asked = sampler({ temperature: 0, logprobs: 3 })
    const token = asked.next(row, 0, vocab)
    const logZ = Math.log(Array.from(row).reduce((sum, value) => sum + Math.exp(value), 0))
    expect(asked.lastLogprobs!.logprob).toBeCloseTo(row[token]! - logZ, 6)
    const top = asked.lastLogprobs!.top
    expect(top.filter((_, i) => i % 2 === 0)).toEqual([2, 4, 9])
    expect(top[1]).toBeCloseTo(3 - logZ, 6)
    expect(sampler({ temperature: 0 }).lastLogprobs).toBeUndefined()
  })
})
