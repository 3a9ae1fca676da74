import { describe, expect, it } from "vitest"
import { type Grammar, UnsupportedSchema } from "../../../../src/executors/llm/structured/GrammarNodes.js"
import { compileGrammar, compileJsonSchema } from "../../../../src/executors/llm/structured/JsonGrammar.js"
import { machineOf, stepState, type Thread } from "../../../../src/executors/llm/structured/JsonMachine.js"
import { Random } from "../../../../src/models/Random.js"
import { cases } from "./schemas.js"

/** Whether the grammar admits `text` as a whole value, byte by byte. */
const admits = (grammar: Grammar, text: string): boolean => {
  const state = stepState(machineOf(grammar).start, new TextEncoder().encode(text))
  return state.some((thread) => thread.accepting)
}

const strict = (schema: unknown) => compileJsonSchema(schema, { strict: true })
const loose = (schema: unknown) => compileJsonSchema(schema, { strict: false })

const refusal = (compile: () => unknown): UnsupportedSchema => {
  try {
    compile()
  } catch (error) {
    if (error instanceof UnsupportedSchema) return error
    throw error
  }
  throw new Error("the schema was accepted")
}

describe("compiling a schema", () => {
  it("refuses a keyword it cannot hold the output to, naming it and where it is", () => {
    const nested = (inner: Record<string, unknown>) => ({
      type: "object",
      properties: { outer: { type: "object", properties: { code: inner }, required: ["code"] } },
      required: ["outer"]
    })
    for (const [keyword, inner] of [
      ["pattern", { type: "string", pattern: "^[A-Z]+$" }],
      ["format", { type: "string", format: "date-time" }],
      ["minLength", { type: "string", minLength: 3 }],
      ["minimum", { type: "integer", minimum: 0 }],
      ["multipleOf", { type: "number", multipleOf: 2 }],
      ["oneOf", { oneOf: [{ type: "string" }, { type: "integer" }] }],
      ["allOf", { allOf: [{ type: "string" }] }],
      ["not", { not: { type: "string" } }],
      ["uniqueItems", { type: "array", uniqueItems: true }],
      ["prefixItems", { type: "array", prefixItems: [{ type: "string" }] }],
      ["patternProperties", { type: "object", patternProperties: { "^x": { type: "string" } } }]
    ] as const) {
      const error = refusal(() => loose(nested(inner)))
      expect(error.keyword).toBe(keyword)
      expect(error.path).toBe("#/properties/outer/properties/code")
      expect(error.message).toBe(`unsupported keyword "${keyword}" at #/properties/outer/properties/code`)
    }
  })

  it("refuses what strict mode refuses and what has no value", () => {
    const optional = refusal(() =>
      strict({ type: "object", properties: { a: { type: "string" }, b: { type: "string" } }, required: ["a"] })
    )
    expect(optional.message).toBe('strict mode needs every property in required, and "b" is not at #')
    expect(
      refusal(() => loose({ type: "object", properties: { a: { type: "string" } }, required: ["z"] })).keyword
    ).toBe("required")
    expect(refusal(() => loose({ properties: { a: { $ref: "#/$defs/missing" } } })).message).toBe(
      '$ref "#/$defs/missing" is not in the schema at #/properties/a'
    )
    expect(refusal(() => loose({ $ref: "https://example.com/schema.json" })).keyword).toBe("$ref")
    expect(refusal(() => loose({ $ref: "#/$defs/a", type: "object", $defs: { a: {} } })).keyword).toBe("type")
    expect(refusal(() => loose({ $ref: "#/$defs/a", $defs: { a: { $ref: "#/$defs/a" } } })).message).toMatch(
      /refers to itself/
    )
    // A node must hold a node: no finite value.
    const endless = {
      type: "object",
      properties: { child: { $ref: "#" } },
      required: ["child"]
    }
    expect(refusal(() => loose(endless)).message).toMatch(/no finite value/)
    expect(refusal(() => loose({ type: "array", minItems: 3, maxItems: 2 })).keyword).toBe("minItems")
    expect(refusal(() => loose({ type: "string", enum: [1, 2] })).keyword).toBe("enum")
    expect(refusal(() => loose({ type: "date" })).keyword).toBe("type")
    expect(refusal(() => loose(false)).keyword).toBe("false")
  })

  it("takes annotations and the shapes of OpenAI's strict subset", () => {
    const grammar = strict({
      title: "Answer",
      description: "what pydantic writes",
      $schema: "https://json-schema.org/draft/2020-12/schema",
      type: "object",
      properties: {
        answer: { type: "string", title: "Answer", default: "" },
        confidence: { anyOf: [{ type: "number" }, { type: "null" }], description: "0..1" },
        tags: { type: "array", items: { $ref: "#/$defs/Tag" }, minItems: 1, maxItems: 2 }
      },
      required: ["answer", "confidence", "tags"],
      additionalProperties: false,
      $defs: { Tag: { type: "string", enum: ["a", "b"] } }
    })
    expect(admits(grammar, '{"answer":"yes","confidence":null,"tags":["a"]}')).toBe(true)
    expect(admits(grammar, '{"answer": "yes", "confidence": 0.5, "tags": ["a", "b"]}')).toBe(true)
    expect(admits(grammar, '{"answer":"yes","confidence":null,"tags":[]}')).toBe(false)
    expect(admits(grammar, '{"answer":"yes","confidence":null,"tags":["a","b","a"]}')).toBe(false)
    expect(admits(grammar, '{"confidence":null,"answer":"yes","tags":["a"]}')).toBe(false)
    expect(admits(grammar, '{"answer":"yes","confidence":null,"tags":["c"]}')).toBe(false)
  })

  it("bounds whitespace, numbers and what strings may hold", () => {
    const grammar = compileGrammar({ type: "json_object" })
    expect(admits(grammar, '{"a": 1, "b": [1, 2], "c": {}}')).toBe(true)
    expect(admits(grammar, '{"a":  1}')).toBe(false)
    expect(admits(grammar, '{ "a":1}')).toBe(false)
    expect(admits(grammar, '{"a":1}\n')).toBe(false)
    expect(admits(grammar, '{"a":\n1}')).toBe(false)
    expect(admits(grammar, "[1]")).toBe(false)
    const number = loose({ type: "number" })
    for (const ok of ["0", "-0", "12.5", "-3e10", "1E+5", "0.12345678", "1234567890123456"]) {
      expect(admits(number, ok), ok).toBe(true)
    }
    for (const bad of ["01", "1.", ".5", "1e", "+1", "0.123456789", "12345678901234567", "1e123"]) {
      expect(admits(number, bad), bad).toBe(false)
    }
    const integer = loose({ type: "integer" })
    expect(admits(integer, "42")).toBe(true)
    expect(admits(integer, "4.2")).toBe(false)
    expect(admits(integer, "4e2")).toBe(false)
    const string = loose({ type: "string" })
    for (const ok of ['"a\\"b"', '"\\\\"', '"\\n\\t\\u00e9\\/"', '"naïve 日本 🦓"', '"\\uFFFF"']) {
      expect(admits(string, ok), ok).toBe(true)
    }
    for (const bad of ['"a\nb"', '"tab\there"', '"\\x"', '"\\u12"', '"\\ud83d\\ude00"', '"\\uDC00"']) {
      expect(admits(string, bad), bad).toBe(false)
    }
    const machine = machineOf(string)
    const bytes = (...values: Array<number>) => Uint8Array.from(values)
    // Invalid UTF-8: a lone continuation byte, an overlong lead, a surrogate, a truncated character.
    for (const bad of [
      bytes(0x22, 0x80, 0x22),
      bytes(0x22, 0xc0, 0x80, 0x22),
      bytes(0x22, 0xed, 0xa0, 0x80, 0x22),
      bytes(0x22, 0xe6, 0x97, 0x22),
      bytes(0x22, 0xf5, 0x80, 0x80, 0x80, 0x22)
    ]) {
      expect(stepState(machine.start, bad).some((thread) => thread.accepting)).toBe(false)
    }
  })

  it("leaves out optional properties in order, never adds undeclared ones, and opens free objects only where allowed", () => {
    const grammar = loose({
      type: "object",
      properties: { a: { type: "integer" }, b: { type: "integer" }, c: { type: "integer" } },
      required: ["b"]
    })
    for (const ok of ['{"b":1}', '{"a":1,"b":2}', '{"b":1,"c":2}', '{"a":1,"b":2,"c":3}']) {
      expect(admits(grammar, ok), ok).toBe(true)
    }
    for (const bad of ["{}", '{"a":1}', '{"b":1,"a":2}', '{"b":1,"d":2}']) expect(admits(grammar, bad), bad).toBe(false)
    expect(admits(loose({ type: "object" }), '{"x":[1,{"y":null}]}')).toBe(true)
    expect(admits(loose({ type: "object", additionalProperties: false }), '{"x":1}')).toBe(false)
    expect(admits(strict({ type: "object" }), "{}")).toBe(true)
    expect(admits(strict({ type: "object" }), '{"x":1}')).toBe(false)
    expect(admits(loose({ type: "object", additionalProperties: { type: "integer" } }), '{"x":"1"}')).toBe(false)
  })

  it("knows the shortest completion of every state it reaches: its need is its length, and it completes the value", () => {
    const random = new Random(11)
    const encoder = new TextEncoder()
    for (const { format } of cases) {
      const machine = machineOf(compileGrammar(format))
      // Random walks: at each state a random allowed byte (or the completion's next byte, to finish).
      for (let walk = 0; walk < 20; walk++) {
        let state: ReadonlyArray<Thread> = machine.start
        for (let step = 0; step < 60 && state.length > 0; step++) {
          for (const thread of state) {
            const completion = thread.completion()
            expect(completion.length).toBe(thread.need)
            const finished = stepState([thread], Uint8Array.from(completion))
            expect(finished.some((t) => t.accepting)).toBe(true)
          }
          const candidates = [...encoder.encode(' {}[]":,-0123456789.eEtrufalsn\\xyz'), 0xc3, 0xa9]
          const moves = candidates.filter((byte) => stepState(state, Uint8Array.of(byte)).length > 0)
          if (moves.length === 0) break
          state = stepState(state, Uint8Array.of(moves[random.below(moves.length)]!))
        }
      }
    }
  })
})
