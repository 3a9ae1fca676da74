import { Schema } from "effect"
import { describe, expect, it } from "vitest"
import { issueLines, readableIssues } from "../../src/app-runtime/SchemaIssues.js"

const linesOf = <A, I>(schema: Schema.Schema<A, I, never>, value: unknown) => {
  const decoded = Schema.decodeUnknownEither(schema)(value, { errors: "all", onExcessProperty: "error" })
  if (decoded._tag === "Right") throw new Error("the value decoded")
  return issueLines(readableIssues(decoded.left))
}

describe("schema errors as a client reads them", () => {
  const Request = Schema.Struct({
    name: Schema.String,
    delayMs: Schema.optional(Schema.Number),
    mode: Schema.optional(Schema.Literal("fast", "slow")),
    tags: Schema.optional(Schema.Array(Schema.String))
  })

  it("says one line per failing field, without the optional's `Expected undefined` echo", () => {
    expect(linesOf(Request, { name: "a", delayMs: "x" })).toEqual(['delayMs: expected number, got "x"'])
  })

  it("merges a union's alternatives into one expectation", () => {
    expect(linesOf(Request, { name: "a", mode: "medium" })).toEqual(['mode: expected "fast" or "slow", got "medium"'])
  })

  it("names a missing field, an unknown one, and a bad element by its index", () => {
    expect(linesOf(Request, { delayMs: 1, extra: true, tags: ["a", 2] })).toEqual([
      'extra: is not a field here (the fields are "name", "delayMs", "mode", "tags")',
      "name: is required",
      "tags.1: expected string, got 2"
    ])
  })
})
