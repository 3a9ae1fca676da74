/**
 * A JSON Schema as a person reads it (`app describe`): one line per field, `name: type` with its
 * bounds and description, an optional field marked `?` as TypeScript marks it, and the fields of
 * nested objects indented below theirs. References into the document's `components/schemas` are
 * followed (each once per branch, so that a recursive schema ends).
 */

type Schema = { readonly [keyword: string]: unknown }

const isSchemaObject = (value: unknown): value is Schema =>
  typeof value === "object" && value !== null && !Array.isArray(value)

const refPrefix = "#/components/schemas/"

/** How deeply nested fields are listed; deeper ones are summed up by their type. */
const maxDepth = 8

export class SchemaText {
  constructor(private readonly components: Readonly<Record<string, unknown>>) {}

  /** The lines of `schema`: its type, then its fields (or its alternatives' fields), indented by `indent`. */
  lines(schema: unknown, indent = "  "): Array<string> {
    const head = this.summary(schema)
    return [`${indent}${head}`, ...this.inside(schema, `${indent}  `, new Set(), 0)]
  }

  /** A schema's name, when it refers to a named one. */
  private refName(schema: Schema): string | undefined {
    const target = schema.$ref
    return typeof target === "string" && target.startsWith(refPrefix) ? target.slice(refPrefix.length) : undefined
  }

  private target(name: string): unknown {
    return Object.hasOwn(this.components, name) ? this.components[name] : undefined
  }

  /**
   * A schema with its `allOf` parts and the references it refines merged in (`{ $ref: Int, minimum:
   * 1 }` is an integer ≥ 1); a reference to a named object stays a reference, by its name.
   */
  private flat(given: unknown, seen: ReadonlySet<string>): unknown {
    if (!isSchemaObject(given)) return given
    let schema: Schema = given
    if (Array.isArray(schema.allOf)) {
      const { allOf, ...rest } = schema
      schema = Object.assign({}, ...allOf.map((part) => this.flat(part, seen)).filter(isSchemaObject), rest)
    }
    const name = this.refName(schema)
    if (name === undefined || seen.has(name)) return schema
    const target = this.target(name)
    if (!isSchemaObject(target) || this.hasInside(target)) return schema
    const { $ref, ...refinements } = schema
    return { ...(this.flat(target, new Set([...seen, name])) as Schema), ...refinements }
  }

  private hasInside(schema: Schema): boolean {
    return (
      isSchemaObject(schema.properties) ||
      "items" in schema ||
      Array.isArray(schema.anyOf) ||
      Array.isArray(schema.oneOf)
    )
  }

  private resolved(given: unknown, seen: ReadonlySet<string>): { schema: unknown; seen: ReadonlySet<string> } {
    const schema = this.flat(given, seen)
    if (!isSchemaObject(schema)) return { schema, seen }
    const name = this.refName(schema)
    if (name === undefined || seen.has(name)) return { schema, seen }
    return { schema: this.target(name), seen: new Set([...seen, name]) }
  }

  /** One line's worth: the type of a value, with its bounds (`string, 1 to 200 characters`). */
  summary(given: unknown, seen: ReadonlySet<string> = new Set()): string {
    const schema = this.flat(given, seen)
    if (schema === false) return "nothing"
    if (!isSchemaObject(schema)) return "any JSON"
    const description =
      typeof schema.description === "string" && !generatedDescription.test(schema.description)
        ? oneLine(schema.description)
        : undefined
    const keywords = Object.keys(schema).filter((keyword) => keyword !== "description" && keyword !== "title")
    if (keywords.length === 0) return description ?? "any JSON"
    const name = this.refName(schema)
    const type = name ?? this.typeText(schema, seen)
    return description === undefined ? type : `${type} (${description})`
  }

  private typeText(schema: Schema, seen: ReadonlySet<string>): string {
    if ("const" in schema) return JSON.stringify(schema.const)
    if (Array.isArray(schema.enum)) {
      const values = schema.enum.map((value) => JSON.stringify(value))
      return values.length === 1 ? values[0]! : `one of ${values.join(", ")}`
    }
    const alternatives = Array.isArray(schema.anyOf) ? schema.anyOf : Array.isArray(schema.oneOf) ? schema.oneOf : []
    if (alternatives.length > 0) {
      const nullable = alternatives.some((alternative) => isSchemaObject(alternative) && alternative.type === "null")
      const kinds = alternatives
        .filter((alternative) => !(isSchemaObject(alternative) && alternative.type === "null"))
        .map((alternative) => this.summary(alternative, seen))
      return `${[...new Set(kinds)].join(" or ")}${nullable ? ", or null" : ""}`
    }
    const types = typeof schema.type === "string" ? [schema.type] : Array.isArray(schema.type) ? schema.type : []
    const nullable = types.includes("null")
    const kind = types.filter((type) => type !== "null")
    const text =
      kind.length === 0
        ? nullable
          ? "null"
          : this.untyped(schema)
        : kind.map((type) => this.typed(String(type), schema, seen)).join(" or ")
    return nullable && kind.length > 0 ? `${text}, or null` : text
  }

  /** A schema without `type`: an object or an array by its keywords, or anything. */
  private untyped(schema: Schema): string {
    if (isSchemaObject(schema.properties)) return "object"
    if ("items" in schema) return "array"
    return "any JSON"
  }

  private typed(type: string, schema: Schema, seen: ReadonlySet<string>): string {
    switch (type) {
      case "string": {
        const parts = ["string", range(schema.minLength, schema.maxLength, "character")]
        if (typeof schema.format === "string") parts.push(`format ${schema.format}`)
        if (typeof schema.pattern === "string") parts.push(`matching /${schema.pattern}/`)
        return parts.filter((part) => part !== "").join(", ")
      }
      case "integer":
      case "number": {
        const bounds = numberBounds(schema)
        return bounds === "" ? type : `${type} ${bounds}`
      }
      case "array": {
        const count = range(schema.minItems, schema.maxItems, "item")
        const items = "items" in schema ? this.summary(schema.items, seen) : "any JSON"
        return `array of ${items}${count === "" ? "" : ` (${count})`}`
      }
      default:
        return type
    }
  }

  /** The fields of an object (of an array's items, of each alternative), each a line and its own fields below. */
  private inside(given: unknown, indent: string, seen: ReadonlySet<string>, depth: number): Array<string> {
    if (depth >= maxDepth) return []
    const { schema, seen: within } = this.resolved(given, seen)
    if (!isSchemaObject(schema)) return []
    if (isSchemaObject(schema.properties)) {
      const required = new Set(Array.isArray(schema.required) ? schema.required : [])
      return Object.entries(schema.properties).flatMap(([name, field]) => [
        `${indent}${name}${required.has(name) ? "" : "?"}: ${this.summary(field, within)}`,
        ...this.inside(field, `${indent}  `, within, depth + 1)
      ])
    }
    if ("items" in schema) return this.inside(schema.items, indent, within, depth)
    const alternatives = Array.isArray(schema.anyOf) ? schema.anyOf : Array.isArray(schema.oneOf) ? schema.oneOf : []
    const withFields = alternatives
      .map((alternative) => ({ alternative, fields: this.inside(alternative, `${indent}  `, within, depth) }))
      .filter(({ fields }) => fields.length > 0)
    if (withFields.length === 1) return this.inside(withFields[0]!.alternative, indent, within, depth)
    return withFields.flatMap(({ alternative, fields }) => [
      `${indent}- ${this.summary(alternative, within)}${this.label(alternative, within)}`,
      ...fields
    ])
  }

  /** What tells an alternative object apart: a field whose value is one constant (`type: "text"`). */
  private label(given: unknown, seen: ReadonlySet<string>): string {
    const { schema } = this.resolved(given, seen)
    if (!isSchemaObject(schema) || !isSchemaObject(schema.properties)) return ""
    for (const [name, field] of Object.entries(schema.properties)) {
      if (!isSchemaObject(field)) continue
      const value =
        "const" in field
          ? field.const
          : Array.isArray(field.enum) && field.enum.length === 1
            ? field.enum[0]
            : undefined
      if (value !== undefined) return ` with ${name} ${JSON.stringify(value)}`
    }
    return ""
  }
}

/**
 * The descriptions Effect gives a refinement of its own (`a string at most 200 character(s) long`),
 * which say again what the bounds beside them say.
 */
const generatedDescription =
  /character\(s\) long$|item\(s\)$|^a string matching the pattern |^an? (?:(?:positive|negative|non-negative|non-positive|finite) )?number(?: between .*| greater than .*| less than .*)?$|^an integer$/

const oneLine = (text: string) => {
  const line = text.replace(/\s+/g, " ").trim()
  return line.length > 160 ? `${line.slice(0, 159)}…` : line
}

const isCount = (value: unknown): value is number => typeof value === "number" && Number.isFinite(value)

/** `1 to 200 characters`, `at least 1 item`, `at most 4 items`, or "" with no bound; `unit` is singular. */
const range = (least: unknown, most: unknown, unit: string): string => {
  const units = (count: number) => (count === 1 ? unit : `${unit}s`)
  if (isCount(least) && isCount(most))
    return least === most ? `${least} ${units(least)}` : `${least} to ${most} ${units(most)}`
  if (isCount(least) && least > 0) return `at least ${least} ${units(least)}`
  if (isCount(most)) return `at most ${most} ${units(most)}`
  return ""
}

const numberBounds = (schema: Schema): string => {
  const parts: Array<string> = []
  if (isCount(schema.minimum)) parts.push(`≥ ${schema.minimum}`)
  if (isCount(schema.exclusiveMinimum)) parts.push(`> ${schema.exclusiveMinimum}`)
  if (isCount(schema.maximum)) parts.push(`≤ ${schema.maximum}`)
  if (isCount(schema.exclusiveMaximum)) parts.push(`< ${schema.exclusiveMaximum}`)
  if (isCount(schema.multipleOf)) parts.push(`a multiple of ${schema.multipleOf}`)
  return parts.join(", ")
}
