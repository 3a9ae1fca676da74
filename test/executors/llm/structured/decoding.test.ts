import { Ajv2020 } from "ajv/dist/2020.js"
import { Tokenizer } from "@huggingface/tokenizers"
import { describe, expect, it } from "vitest"
import { Sampler } from "../../../../src/executors/llm/Sampler.js"
import { ConstrainedDecoder } from "../../../../src/executors/llm/structured/ConstrainedDecoder.js"
import { compileGrammar, compileJsonSchema } from "../../../../src/executors/llm/structured/JsonGrammar.js"
import { cases } from "./schemas.js"
import {
  type Family,
  generate,
  RandomModel,
  samplerDraw,
  text,
  tokenId,
  tokenizerFiles,
  vocabulary
} from "./support.js"

/**
 * Random models decode under every kind of schema, greedily and by sampling, with roomy and
 * tight budgets, on a byte-level tokenizer (Qwen 3) and a sentencepiece one (Llama 2): every
 * output is JSON that an independent validator (Ajv) accepts, within the budget.
 */

const ajv = new Ajv2020({ strict: false })
const validator = (schema: unknown) => ajv.compile(schema as object)

const expectValid = (schema: unknown, output: string) => {
  const value: unknown = JSON.parse(output)
  const validate = validator(schema)
  if (!validate(value)) throw new Error(`${output} does not validate: ${ajv.errorsText(validate.errors)}`)
}

const runs: ReadonlyArray<{ readonly family: Family; readonly seeds: number }> = [
  { family: "llama2", seeds: 3 },
  { family: "qwen3", seeds: 1 }
]

describe.each(runs)("constrained decoding with $family's vocabulary", ({ family, seeds }) => {
  const vocab = vocabulary(family)

  it.each(cases)("every output of $name is valid JSON of its schema, greedy or sampled", ({ format, validate }) => {
    const grammar = compileGrammar(format)
    for (let seed = 1; seed <= seeds; seed++) {
      for (const temperature of [0, 1]) {
        const model = new RandomModel(vocab.size, seed * 7919 + temperature)
        const minimum = new ConstrainedDecoder(grammar, vocab).minimumTokens()
        for (const maxTokens of [minimum, minimum + 7, 80]) {
          const run = generate(grammar, vocab, model, { maxTokens, temperature })
          expect(run.tokens.length).toBeLessThanOrEqual(maxTokens)
          expect(run.complete, run.text).toBe(true)
          expectValid(validate, run.text)
        }
      }
    }
  })

  it("writes escapes and multi-byte characters (split across tokens) as valid JSON strings", () => {
    const schema = {
      type: "object",
      properties: { text: { type: "string" }, more: { type: "array", items: { type: "string" } } },
      required: ["text", "more"],
      additionalProperties: false
    }
    const grammar = compileJsonSchema(schema, { strict: true })
    // A model that loves backslashes, quotes, control bytes and bytes of multi-byte characters.
    const favour = {
      bytes: vocab.bytes,
      score: (bytes: Uint8Array) =>
        bytes.some((b) => b === 0x5c || b === 0x22 || b < 0x20) ? 4 : bytes.some((b) => b >= 0x80) ? 3 : 0
    }
    let escapes = 0
    let nonAscii = 0
    for (let seed = 1; seed <= 6; seed++) {
      const model = new RandomModel(vocab.size, seed, favour)
      const run = generate(grammar, vocab, model, { maxTokens: 60, temperature: 1.5 })
      expectValid(schema, run.text)
      if (run.text.includes("\\")) escapes++
      if ([...run.text].some((c) => c.charCodeAt(0) >= 0x80)) nonAscii++
    }
    expect(escapes).toBeGreaterThan(0)
    expect(nonAscii).toBeGreaterThan(0)
  })

  it("meets the exact minimum budget with the fewest tokens, and says up front when a budget is too small", () => {
    const grammar = compileGrammar(cases.find((c) => c.name === "nested")!.format)
    const minimum = new ConstrainedDecoder(grammar, vocab).minimumTokens()
    expect(minimum).toBeGreaterThan(3)
    expect(minimum).toBeLessThan(`{"user":{"id":0,"profile":{"bio":"","score":0}},"flags":[true]}`.length)
    const model = new RandomModel(vocab.size, 3)
    const run = generate(grammar, vocab, model, { maxTokens: minimum, temperature: 0 })
    expect(run.complete).toBe(true)
    expect(run.tokens.length).toBeLessThanOrEqual(minimum)
    // One token short: the router refuses (or finishes with "length"); decoding still goes on without a dead end.
    const short = generate(grammar, vocab, model, { maxTokens: minimum - 1, temperature: 0 })
    expect(short.tokens.length).toBe(minimum - 1)
  })

  it("allows the end of sequence only once the value is complete, and refuses a token it did not allow", () => {
    const grammar = compileGrammar({
      type: "json_schema",
      json_schema: { schema: { type: "object", properties: { n: { type: "integer" } }, required: ["n"] } }
    })
    const eos = vocab.endOfSequence[0]!
    const decoder = new ConstrainedDecoder(grammar, vocab)
    expect(decoder.mask()[eos]).toBe(0)
    expect(() => decoder.accept(eos)).toThrow(/not allowed/)
    expect(() => decoder.accept(tokenId(vocab, "["))).toThrow(/not allowed/)
    for (const piece of ["{", '"', "n", '"', ":", "1", "2"]) {
      const token = tokenId(vocab, piece)
      expect(decoder.mask()[token]).toBe(1)
      decoder.accept(token)
    }
    expect(decoder.complete).toBe(false)
    expect(decoder.mask()[tokenId(vocab, "}")]).toBe(1)
    expect(decoder.mask()[tokenId(vocab, "a")]).toBe(0)
    expect(() => decoder.accept(tokenId(vocab, "a"))).toThrow(/not allowed/)
    decoder.accept(tokenId(vocab, "}"))
    expect(decoder.complete && decoder.done).toBe(true)
    const mask = decoder.mask(5)
    expect(mask[eos]).toBe(1)
    expect(mask.reduce((sum, allowed) => sum + allowed, 0)).toBe(vocab.endOfSequence.length)
    decoder.accept(eos)
    expect(() => decoder.mask()).toThrow(/ended/)
  })

  it("closes a value that a greedy model would never end when the budget comes near", () => {
    const schema = {
      type: "object",
      properties: { notes: { type: "array", items: { type: "string" } }, total: { type: "integer" } },
      required: ["notes", "total"],
      additionalProperties: false
    }
    const grammar = compileJsonSchema(schema, { strict: true })
    // Letters and spaces above all, then `"` with letters, then `[`: greedy decoding would write one endless string.
    const letters = (bytes: Uint8Array) => bytes.every((b) => b === 0x20 || (b >= 0x61 && b <= 0x7a))
    const favour = {
      bytes: vocab.bytes,
      score: (bytes: Uint8Array) =>
        letters(bytes) ? 10 : bytes[0] === 0x22 && letters(bytes.subarray(1)) ? 8 : bytes[0] === 0x5b ? 6 : 0
    }
    for (const maxTokens of [12, 25, 40]) {
      const run = generate(grammar, vocab, new RandomModel(vocab.size, maxTokens, favour), {
        maxTokens,
        temperature: 0
      })
      expect(run.tokens.length).toBeLessThanOrEqual(maxTokens)
      expectValid(schema, run.text)
      if (maxTokens === 40) expect(JSON.parse(run.text).notes.join("").length, run.text).toBeGreaterThan(40)
    }
  })

  it("works with the executor's Sampler drawing from logits set to -Infinity where the mask says no", () => {
    const { format, validate } = cases.find((c) => c.name === "shapes (anyOf with a shared prefix)")!
    const grammar = compileGrammar(format)
    for (const [seed, temperature] of [
      [1, 0],
      [2, 0.7]
    ] as const) {
      const model = new RandomModel(vocab.size, seed)
      const sampler = new Sampler({ temperature, topP: 1, topK: 50, repetitionPenalty: 1.3, seed })
      const run = generate(grammar, vocab, model, { maxTokens: 40, temperature, draw: samplerDraw(model, sampler) })
      expectValid(validate, run.text)
    }
  })

  it("spells every token with the bytes the tokenizer decodes it to", () => {
    const { json, config } = tokenizerFiles(family)
    const tokenizer = new Tokenizer(json, config)
    const prefix = tokenId(vocab, "a")
    const utf8 = new TextDecoder("utf-8", { fatal: true })
    let checked = 0
    for (let token = 0; token < vocab.size; token += 97) {
      const bytes = vocab.bytes[token]
      if (bytes === undefined) continue
      let expected: string
      try {
        expected = utf8.decode(bytes)
      } catch {
        continue
      }
      expect(tokenizer.decode([prefix, token], { skip_special_tokens: false }), `token ${token}`).toBe(`a${expected}`)
      checked++
    }
    expect(checked).toBeGreaterThan(200)
    expect(text(vocab, [tokenId(vocab, "{"), tokenId(vocab, "}")])).toBe("{}")
  })
})
