import * as Schema from "effect/Schema"

/**
 * How large a schema structured output takes: OpenAI's documented limits for strict structured
 * outputs (properties, enum values, the characters of names and values), and bounds of the
 * platform's own on subschemas and their nesting. A schema is measured before it is compiled, in
 * one pass that stops at the first bound it passes, so that a hostile schema costs no more than
 * reading it; the compiler bounds what only compiling shows (see JsonGrammar.ts).
 */
export const schemaBounds = {
  /** Object properties, over the whole schema. */
  properties: 5000,
  /** Values of every `enum`, together. */
  enumValues: 1000,
  /** Characters of property names, `$defs` names, and enum and const values (as JSON), together. */
  characters: 120_000,
  /** Schemas within the schema: properties' values, items, anyOf's options, definitions, ... */
  subschemas: 10_000,
  /** Schemas within schemas within ..., the whole schema being the first. */
  depth: 32,
  /** Steps of gathering the options of nested anyOf (through `$ref`) into one list per anyOf. */
  alternatives: 100_000,
  /** Bytes of the shortest value the schema admits (and of any of its parts). */
  shortestValue: 256 * 1024,
  /** Values within values that the shortest value nests (through `$ref` too). */
  shortestValueDepth: 128
} as const

/** A schema larger than structured output takes; the router answers 400 with its message. */
export class SchemaTooLarge extends Schema.TaggedError<SchemaTooLarge>()("SchemaTooLarge", {
  /** What is bounded, e.g. "properties". */
  bound: Schema.String,
  limit: Schema.Number,
  /** How it is counted, as the message says it. */
  what: Schema.String
}) {
  override get message() {
    return `the schema has more than ${this.limit.toLocaleString("en-US")} ${this.what}; structured output takes at most that (its ${this.bound} bound)`
  }
}

/** The error of passing one of `schemaBounds`, saying what it counts. */
export const schemaTooLarge = (bound: keyof typeof schemaBounds, what: string) =>
  new SchemaTooLarge({ bound, limit: schemaBounds[bound], what })

const isRecord = (value: unknown): value is Record<string, unknown> =>
  typeof value === "object" && value !== null && !Array.isArray(value)

const jsonLength = (value: unknown): number =>
  typeof value === "string" ? value.length + 2 : (JSON.stringify(value) ?? "").length

/**
 * Throws SchemaTooLarge for a schema past one of `schemaBounds`' counts; what is not a schema
 * (a keyword of the wrong type) is the compiler's to refuse.
 */
export const checkSchemaBounds = (schema: unknown): void => {
  let properties = 0
  let enumValues = 0
  let characters = 0
  let subschemas = 0
  const count = (chars: number) => {
    characters += chars
    if (characters > schemaBounds.characters)
      throw schemaTooLarge("characters", "characters in property names, definition names, and enum and const values")
  }
  const pending: Array<{ readonly schema: unknown; readonly depth: number }> = [{ schema, depth: 1 }]
  while (pending.length > 0) {
    const { schema: node, depth } = pending.pop()!
    if (!isRecord(node)) continue
    if (++subschemas > schemaBounds.subschemas) throw schemaTooLarge("subschemas", "subschemas")
    if (depth > schemaBounds.depth) throw schemaTooLarge("depth", "levels of subschemas within subschemas")
    const within = (child: unknown) => pending.push({ schema: child, depth: depth + 1 })
    if (isRecord(node.properties)) {
      for (const name in node.properties) {
        if (++properties > schemaBounds.properties) throw schemaTooLarge("properties", "properties")
        count(name.length)
        within(node.properties[name])
      }
    }
    for (const definitions of [node.$defs, node.definitions]) {
      if (!isRecord(definitions)) continue
      for (const name in definitions) {
        count(name.length)
        within(definitions[name])
      }
    }
    if (Array.isArray(node.anyOf)) for (const option of node.anyOf) within(option)
    within(node.items)
    within(node.additionalProperties)
    if (Array.isArray(node.enum)) {
      enumValues += node.enum.length
      if (enumValues > schemaBounds.enumValues) throw schemaTooLarge("enumValues", "enum values")
      for (const value of node.enum) count(jsonLength(value))
    }
    if (node.const !== undefined) count(jsonLength(node.const))
  }
}
