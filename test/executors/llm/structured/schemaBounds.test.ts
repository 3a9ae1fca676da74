import { describe, expect, it } from "vitest"
import { ConstrainedDecoder } from "../../../../src/executors/llm/structured/ConstrainedDecoder.js"
import type { Grammar } from "../../../../src/executors/llm/structured/GrammarNodes.js"
import { compileJsonSchema } from "../../../../src/executors/llm/structured/JsonGrammar.js"
import { machineOf, stepState } from "../../../../src/executors/llm/structured/JsonMachine.js"
import { SchemaTooLarge, schemaBounds } from "../../../../src/executors/llm/structured/SchemaBounds.js"
import { vocabulary } from "./support.js"

/**
 * How large a schema structured output takes, and that what it takes compiles without the work
 * growing past the schema's size: wide objects of optional properties, long chains of references,
 * nested alternatives and shortest values that would double at every level are refused or
 * compiled in one pass, never by recursion as deep as the schema is long.
 */

const loose = (schema: unknown) => compileJsonSchema(schema, { strict: false })

const admits = (grammar: Grammar, text: string): boolean =>
  stepState(machineOf(grammar).start, new TextEncoder().encode(text)).some((thread) => thread.accepting)

const refusal = (compile: () => unknown): SchemaTooLarge => {
  try {
    compile()
  } catch (error) {
    if (error instanceof SchemaTooLarge) return error
    throw error
  }
  throw new Error("the schema was accepted")
}

const wide = (count: number, required = false) => {
  const names = Array.from({ length: count }, (_, i) => `p${i}`)
  return {
    type: "object",
    properties: Object.fromEntries(names.map((name) => [name, { type: "string" }])),
    ...(required ? { required: names } : {})
  }
}

/** `$defs` d0 … d(count - 1), each made by `make` from the name of the one before. */
const chain = (count: number, make: (previous: string) => unknown, first: unknown) => ({
  $ref: `#/$defs/d${count - 1}`,
  $defs: Object.fromEntries(
    Array.from({ length: count }, (_, i) => [`d${i}`, i === 0 ? first : make(`#/$defs/d${i - 1}`)])
  )
})

describe("a schema past a bound", () => {
  it("is refused before it compiles, the message naming what is counted and how much is taken", () => {
    const properties = refusal(() => loose(wide(16_000)))
    expect(properties.bound).toBe("properties")
    expect(properties.message).toBe(
      "the schema has more than 5,000 properties; structured output takes at most that (its properties bound)"
    )
    expect(refusal(() => loose({ enum: Array.from({ length: 1001 }, (_, i) => i) })).bound).toBe("enumValues")
    expect(refusal(() => loose({ properties: { ["x".repeat(120_001)]: { type: "string" } } })).bound).toBe("characters")
    expect(refusal(() => loose({ anyOf: Array.from({ length: 10_000 }, () => ({ type: "string" })) })).bound).toBe(
      "subschemas"
    )
    let deep: unknown = { type: "string" }
    for (let i = 0; i < schemaBounds.depth; i++) deep = { type: "array", items: deep }
    expect(refusal(() => loose(deep)).bound).toBe("depth")
  })

  it("is refused when its shortest value doubles at every level, or nests deeper than the bound", () => {
    const doubling = chain(
      24,
      (previous) => ({
        type: "object",
        properties: { a: { $ref: previous }, b: { $ref: previous } },
        required: ["a", "b"]
      }),
      { type: "string" }
    )
    expect(refusal(() => loose(doubling)).bound).toBe("shortestValue")
    const nested = chain(
      schemaBounds.shortestValueDepth + 10,
      (previous) => ({ type: "object", properties: { n: { $ref: previous } }, required: ["n"] }),
      { type: "null" }
    )
    expect(refusal(() => loose(nested)).bound).toBe("shortestValueDepth")
  })

  it("is refused when its nested alternatives take more steps to gather than the bound", () => {
    const alternatives = chain(1000, (previous) => ({ anyOf: [{ $ref: previous }, { type: "integer" }] }), {
      type: "null"
    })
    expect(refusal(() => loose(alternatives)).bound).toBe("alternatives")
  })
})

describe("a schema within the bounds", () => {
  it("of 5,000 optional properties: any of them, in order, each once", () => {
    const grammar = loose(wide(5000))
    expect(admits(grammar, "{}")).toBe(true)
    expect(admits(grammar, '{"p0": "a", "p17": "b", "p4999": "c"}')).toBe(true)
    expect(admits(grammar, '{"p17": "b", "p0": "a"}')).toBe(false)
    expect(admits(grammar, '{"p5000": "x"}')).toBe(false)
  })

  it("of a chain of 3,000 references: compiled without a recursion as long as the chain", () => {
    const grammar = loose(
      chain(3000, (previous) => ({ type: "object", properties: { next: { $ref: previous } } }), { type: "null" })
    )
    expect(admits(grammar, '{"next": {"next": {}}}')).toBe(true)
    expect(admits(grammar, '{"next": 1}')).toBe(false)
  })

  it("of 5,000 required properties: its shortest value planned in tokens, without a recursion per property", () => {
    const decoder = new ConstrainedDecoder(loose(wide(5000, true)), vocabulary("qwen3"))
    // Each property takes its key, a colon and an empty string: at least a token for `"p123":""`'s parts.
    expect(decoder.minimumTokens()).toBeGreaterThan(5000)
  }, 120_000)
})
