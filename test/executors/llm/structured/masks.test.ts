import { describe, expect, it } from "vitest"
import { ConstrainedDecoder } from "../../../../src/executors/llm/structured/ConstrainedDecoder.js"
import { compileGrammar, compileJsonSchema } from "../../../../src/executors/llm/structured/JsonGrammar.js"
import { machineOf, stepState, type Thread } from "../../../../src/executors/llm/structured/JsonMachine.js"
import { computeMask, computeNeedLevels } from "../../../../src/executors/llm/structured/TokenMask.js"
import { cases } from "./schemas.js"
import { tokenId, vocabulary } from "./support.js"

/**
 * The masks the trie walk (and the string shortcut) computes are those of trying every token one
 * by one, with the same need per token; and a state's mask is computed once.
 */

const vocab = vocabulary("llama2")

/** Every token tried by itself: allowed when some thread survives its bytes; its need the fewest among them. */
const bruteForce = (threads: ReadonlyArray<Thread>) => {
  const mask = new Uint8Array(vocab.size)
  const need = new Map<number, number>()
  vocab.bytes.forEach((bytes, token) => {
    if (bytes === undefined) return
    const after = stepState(threads, bytes)
    if (after.length === 0) return
    mask[token] = 1
    need.set(token, Math.min(...after.map((thread) => thread.need)))
  })
  if (threads.some((thread) => thread.accepting)) {
    for (const token of vocab.endOfSequence) {
      mask[token] = 1
      need.set(token, 0)
    }
  }
  return { mask, need }
}

const states: ReadonlyArray<{ readonly schema: string; readonly prefix: string }> = [
  { schema: "person", prefix: "" },
  { schema: "person", prefix: '{"name":"Ada L' },
  { schema: "person", prefix: '{"name":"caf\xc3' },
  { schema: "person", prefix: '{"name":"x\\u00' },
  { schema: "person", prefix: '{"name":"x","age":4' },
  { schema: "person", prefix: '{"name":"x","age":42,"email": ' },
  { schema: "shapes (anyOf with a shared prefix)", prefix: '{"shapes":[{"kind":"circle",' },
  { schema: "enums", prefix: '{"status":"active","version":2,"mixed":1' },
  { schema: "json_object", prefix: '{"a": [1, {"b": "' },
  { schema: "array at the root", prefix: "[1, 2" }
]

describe("masks", () => {
  it.each(states)("of $schema after $prefix are those of trying each token", ({ schema, prefix }) => {
    const grammar = compileGrammar(cases.find((c) => c.name === schema)!.format)
    const bytes = Uint8Array.from(prefix, (c) => c.charCodeAt(0))
    const threads = stepState(machineOf(grammar).start, bytes)
    expect(threads.length).toBeGreaterThan(0)
    const expected = bruteForce(threads)
    const entry = computeMask(vocab, threads)
    expect(entry.mask).toEqual(expected.mask)
    expect(entry.maxNeed).toBe(Math.max(0, ...expected.need.values()))
    const levels = computeNeedLevels(vocab, threads)
    const need = new Map<number, number>()
    levels.needs.forEach((value, level) => {
      for (let i = level === 0 ? 0 : levels.ends[level - 1]!; i < levels.ends[level]!; i++) {
        need.set(levels.tokens[i]!, value)
      }
    })
    expect(need).toEqual(expected.need)
  })

  it("are computed once per state and shared by requests with the same schema", () => {
    const schema = { type: "object", properties: { note: { type: "string" } }, required: ["note"] }
    const first = new ConstrainedDecoder(compileJsonSchema(schema, { strict: true }), vocab)
    const second = new ConstrainedDecoder(compileJsonSchema(schema, { strict: true }), vocab)
    for (const piece of ['{"', "note", '":"', "hello"]) {
      const token = tokenId(vocab, piece)
      expect(first.mask()).toBe(second.mask())
      first.accept(token)
      second.accept(token)
    }
    // Inside the string, one token after another: the same state, the same mask.
    const inString = first.mask()
    first.accept(tokenId(vocab, " world"))
    expect(first.mask()).toBe(inString)
  })
})
