import { type Draft, settleGrammar } from "./GrammarSettle.js"
import {
  type Grammar,
  type GrammarNode,
  type ObjectLayout,
  type ResponseFormat,
  UnsupportedSchema
} from "./GrammarNodes.js"
import { checkSchemaBounds } from "./SchemaBounds.js"

/**
 * What a structured-output request asks for (OpenAI's `response_format`, or a tool's parameters),
 * compiled into a grammar of JSON values: the nodes a byte-level machine (JsonMachine.ts) walks.
 *
 * The JSON Schema subset is OpenAI's strict structured outputs: `type` (one or several of object,
 * array, string, number, integer, boolean, null), `properties`, `required`, `additionalProperties`,
 * `items`, `minItems`, `maxItems`, `enum`, `const`, `anyOf`, `$ref` to any JSON pointer in the
 * document (`#`, `#/$defs/...`, `#/definitions/...`, recursion included) and `$defs`/`definitions`;
 * annotations (`description`, `title`, `default`, `examples`, ...) are ignored. Any other keyword
 * (`pattern`, `format`, `minimum`, `oneOf`, ...) is refused with an UnsupportedSchema naming it and
 * where it is, since the output could not be held to it.
 *
 * The grammar admits a subset of the values the schema admits, in one written form:
 * - properties in the schema's order; a property not in `required` may be left out (non-strict
 *   only: strict mode refuses a schema whose properties are not all required, as OpenAI does);
 *   no property beyond the declared ones. An object schema that declares no properties admits any
 *   object (values: its `additionalProperties` schema, or any JSON) unless `additionalProperties`
 *   is false or the mode is strict, where it admits `{}` alone.
 * - whitespace: at most one space after each `:` and each `,`, nowhere else (no newlines), so a
 *   model can never spend its budget on layout.
 * - numbers: at most 16 integer digits, 8 fraction digits and a 2-digit exponent; an `integer`
 *   has neither fraction nor exponent.
 * - strings: any length; escapes `\" \\ \/ \b \f \n \r \t \uXXXX` (no lone surrogates: a
 *   \uD800–\uDFFF escape is refused); raw characters are valid UTF-8 at or above U+0020.
 * - enum and const values are written as JSON.stringify writes them.
 *
 * A schema past SchemaBounds.ts's bounds is refused (SchemaTooLarge) before it is compiled, and
 * compiling takes time linear in the schema: an object's properties, optional or not, are laid
 * out in one pass, references are compiled from a queue rather than by recursion, and the
 * shortest values are found in one pass over the schema's graph.
 */

/** The grammar of a `response_format` of type json_object or json_schema. */
export const compileGrammar = (format: ResponseFormat): Grammar => {
  if (format.type === "json_object") return compileJsonSchema({ type: "object" }, { strict: false })
  const { schema, strict } = format.json_schema
  return compileJsonSchema(schema ?? { type: "object" }, { strict: strict === true })
}

/** The grammar of a JSON Schema (a `json_schema` response format's, or a tool's parameters). */
export const compileJsonSchema = (schema: unknown, options: { readonly strict: boolean }): Grammar => {
  checkSchemaBounds(schema)
  const compiler = new Compiler(schema, options.strict)
  const root = compiler.compileAll(schema)
  return { key: `${options.strict ? "strict" : "loose"}:${JSON.stringify(schema)}`, root: compiler.finish(root) }
}

const annotations = new Set([
  "description",
  "title",
  "default",
  "examples",
  "$comment",
  "$schema",
  "$id",
  "deprecated",
  "readOnly",
  "writeOnly",
  "$defs",
  "definitions"
])
const keywords = new Set([
  ...annotations,
  "type",
  "properties",
  "required",
  "additionalProperties",
  "items",
  "minItems",
  "maxItems",
  "enum",
  "const",
  "anyOf",
  "$ref"
])
const typeNames = ["object", "array", "string", "number", "integer", "boolean", "null"] as const
type TypeName = (typeof typeNames)[number]

const utf8 = new TextEncoder()
const pointer = (path: string, ...segments: ReadonlyArray<string | number>) =>
  [path, ...segments.map((s) => String(s).replaceAll("~", "~0").replaceAll("/", "~1"))].join("/")

const noLayout: ObjectLayout = { nextRequired: [0], cheapest: [-1], tail: [1], nextKey: [Infinity], open: 1 }

class Compiler {
  private nextId = 0
  private nextLiteralId = 0
  private readonly nodes: Array<Draft> = []
  private readonly refs = new Map<string, Draft>()
  /** References whose targets are still to compile: compiled in turn, so that a chain of them is no recursion. */
  private readonly unresolved: Array<{
    readonly ref: Extract<Draft, { kind: "ref" }>
    readonly schema: unknown
    readonly path: string
  }> = []
  private anyValue: Draft | undefined

  constructor(
    private readonly document: unknown,
    private readonly strict: boolean
  ) {}

  /** The whole schema, the targets of its references included. */
  compileAll(schema: unknown): Draft {
    const root = this.compile(schema, "#")
    for (let next = this.unresolved.pop(); next !== undefined; next = this.unresolved.pop()) {
      next.ref.target = this.compile(next.schema, next.path)
    }
    return root
  }

  compile(schema: unknown, path: string): Draft {
    if (schema === true) return this.any()
    if (schema === false)
      throw new UnsupportedSchema({ keyword: "false", path, reason: "the schema `false` admits no value" })
    if (typeof schema !== "object" || schema === null || Array.isArray(schema)) {
      throw new UnsupportedSchema({ keyword: "type", path, reason: "a schema must be an object or a boolean" })
    }
    const s = schema as Record<string, unknown>
    for (const keyword of Object.keys(s)) {
      if (!keywords.has(keyword)) {
        throw new UnsupportedSchema({ keyword, path, reason: `unsupported keyword "${keyword}"` })
      }
    }
    const siblings = (keyword: string) => {
      const other = Object.keys(s).find((k) => k !== keyword && !annotations.has(k))
      if (other !== undefined) {
        throw new UnsupportedSchema({
          keyword: other,
          path,
          reason: `"${other}" next to "${keyword}" is not supported`
        })
      }
    }
    if (s.$ref !== undefined) {
      siblings("$ref")
      return this.reference(s.$ref, path)
    }
    if (s.enum !== undefined || s.const !== undefined) return this.literals(s, path)
    if (s.anyOf !== undefined) {
      siblings("anyOf")
      if (!Array.isArray(s.anyOf) || s.anyOf.length === 0) {
        throw new UnsupportedSchema({ keyword: "anyOf", path, reason: "anyOf must be a non-empty array" })
      }
      return this.add({
        kind: "union",
        id: 0,
        options: s.anyOf.map((option, i) => this.compile(option, pointer(path, "anyOf", i))),
        minLength: Infinity
      })
    }
    const types = this.types(s, path)
    if (types === undefined) return this.any()
    const nodes = types.map((type) => this.typed(type, s, path))
    return nodes.length === 1 ? nodes[0]! : this.add({ kind: "union", id: 0, options: nodes, minLength: Infinity })
  }

  /** Resolves references, drops what admits no finite value, and fills in lengths and layouts. */
  finish(root: Draft): GrammarNode {
    return settleGrammar(root, this.nodes)
  }

  private add<D extends Draft>(node: D): D {
    node.id = this.nextId++
    this.nodes.push(node)
    return node
  }

  /** Any JSON value (an object of any keys, an array of any length, ...). */
  private any(): Draft {
    if (this.anyValue !== undefined) return this.anyValue
    const any = this.add({ kind: "union", id: 0, options: [] as Array<Draft>, minLength: Infinity })
    this.anyValue = any
    any.options.push(
      this.add({ kind: "object", id: 0, properties: [], extra: any, layout: noLayout, minLength: Infinity }),
      this.add({ kind: "array", id: 0, items: any, minItems: 0, maxItems: Infinity, minLength: Infinity }),
      this.add({ kind: "string", id: 0, minLength: Infinity }),
      this.add({ kind: "number", id: 0, integer: false, minLength: Infinity }),
      this.literalNode([true, false, null])
    )
    return any
  }

  private reference(ref: unknown, path: string): Draft {
    if (typeof ref !== "string" || !ref.startsWith("#")) {
      throw new UnsupportedSchema({
        keyword: "$ref",
        path,
        reason: `$ref must point into this schema ("#/$defs/..."), not to ${JSON.stringify(ref)}`
      })
    }
    let target: string
    try {
      target = decodeURIComponent(ref).replace(/(.)\/$/, "$1")
    } catch {
      throw new UnsupportedSchema({
        keyword: "$ref",
        path,
        reason: `$ref ${JSON.stringify(ref)} is not a valid pointer`
      })
    }
    const known = this.refs.get(target)
    if (known !== undefined) return known
    const node = this.add({ kind: "ref", id: 0, target: undefined as Draft | undefined, path, minLength: Infinity })
    this.refs.set(target, node)
    let schema: unknown = this.document
    for (const segment of target.split("/").slice(1)) {
      const key = segment.replaceAll("~1", "/").replaceAll("~0", "~")
      schema =
        typeof schema === "object" && schema !== null && Object.hasOwn(schema, key)
          ? (schema as Record<string, unknown>)[key]
          : undefined
      if (schema === undefined) {
        throw new UnsupportedSchema({
          keyword: "$ref",
          path,
          reason: `$ref ${JSON.stringify(ref)} is not in the schema`
        })
      }
    }
    this.unresolved.push({ ref: node, schema, path: target })
    return node
  }

  private types(s: Record<string, unknown>, path: string): ReadonlyArray<TypeName> | undefined {
    const type = s.type
    if (type === undefined) {
      if (["properties", "required", "additionalProperties"].some((k) => s[k] !== undefined)) return ["object"]
      if (["items", "minItems", "maxItems"].some((k) => s[k] !== undefined)) return ["array"]
      return undefined
    }
    const names = Array.isArray(type) ? type : [type]
    if (names.length === 0) throw new UnsupportedSchema({ keyword: "type", path, reason: "type is empty" })
    for (const name of names) {
      if (!typeNames.includes(name as TypeName)) {
        throw new UnsupportedSchema({ keyword: "type", path, reason: `unknown type ${JSON.stringify(name)}` })
      }
    }
    return [...new Set(names as Array<TypeName>)]
  }

  private typed(type: TypeName, s: Record<string, unknown>, path: string): Draft {
    switch (type) {
      case "object":
        return this.object(s, path)
      case "array":
        return this.array(s, path)
      case "string":
        return this.add({ kind: "string", id: 0, minLength: Infinity })
      case "number":
      case "integer":
        return this.add({ kind: "number", id: 0, integer: type === "integer", minLength: Infinity })
      case "boolean":
        return this.literalNode([true, false])
      case "null":
        return this.literalNode([null])
    }
  }

  private object(s: Record<string, unknown>, path: string): Draft {
    const properties = s.properties ?? {}
    if (typeof properties !== "object" || properties === null || Array.isArray(properties)) {
      throw new UnsupportedSchema({ keyword: "properties", path, reason: "properties must be an object" })
    }
    const required = s.required ?? []
    if (!Array.isArray(required) || required.some((name) => typeof name !== "string")) {
      throw new UnsupportedSchema({ keyword: "required", path, reason: "required must be a list of names" })
    }
    const names = Object.keys(properties)
    const declared = new Set(names)
    const requiredNames = new Set(required as ReadonlyArray<string>)
    for (const name of requiredNames) {
      if (!declared.has(name)) {
        throw new UnsupportedSchema({
          keyword: "required",
          path,
          reason: `required names "${name}", which is not in properties`
        })
      }
    }
    if (this.strict) {
      const optional = names.find((name) => !requiredNames.has(name))
      if (optional !== undefined) {
        throw new UnsupportedSchema({
          keyword: "required",
          path,
          reason: `strict mode needs every property in required, and "${optional}" is not`
        })
      }
    }
    const additional = s.additionalProperties
    if (additional !== undefined && typeof additional !== "boolean" && typeof additional !== "object") {
      throw new UnsupportedSchema({
        keyword: "additionalProperties",
        path,
        reason: "additionalProperties must be a boolean or a schema"
      })
    }
    const node = this.add({
      kind: "object",
      id: 0,
      properties: [] as Array<{ name: string; key: Uint8Array; value: Draft; required: boolean }>,
      extra: undefined as Draft | undefined,
      layout: noLayout,
      minLength: Infinity
    })
    if (names.length === 0 && additional !== false && !this.strict) {
      node.extra =
        additional === undefined || additional === true
          ? this.any()
          : this.compile(additional, pointer(path, "additionalProperties"))
    }
    for (const name of names) {
      node.properties.push({
        name,
        key: utf8.encode(JSON.stringify(name)),
        value: this.compile((properties as Record<string, unknown>)[name], pointer(path, "properties", name)),
        required: requiredNames.has(name)
      })
    }
    return node
  }

  private array(s: Record<string, unknown>, path: string): Draft {
    const count = (keyword: "minItems" | "maxItems", fallback: number) => {
      const value = s[keyword] ?? fallback
      if (typeof value !== "number" || !(Number.isInteger(value) || value === Infinity) || value < 0) {
        throw new UnsupportedSchema({ keyword, path, reason: `${keyword} must be a non-negative integer` })
      }
      return value
    }
    const minItems = count("minItems", 0)
    const maxItems = count("maxItems", Infinity)
    if (minItems > maxItems) {
      throw new UnsupportedSchema({ keyword: "minItems", path, reason: "minItems exceeds maxItems" })
    }
    if (
      s.items !== undefined &&
      (typeof s.items !== "object" || Array.isArray(s.items)) &&
      typeof s.items !== "boolean"
    ) {
      throw new UnsupportedSchema({ keyword: "items", path, reason: "items must be one schema" })
    }
    const items = s.items === undefined ? this.any() : this.compile(s.items, pointer(path, "items"))
    return this.add({ kind: "array", id: 0, items, minItems, maxItems, minLength: Infinity })
  }

  private literals(s: Record<string, unknown>, path: string): Draft {
    let values: ReadonlyArray<unknown>
    if (s.enum !== undefined) {
      if (!Array.isArray(s.enum) || s.enum.length === 0) {
        throw new UnsupportedSchema({ keyword: "enum", path, reason: "enum must be a non-empty list" })
      }
      values = s.enum
      if (s.const !== undefined) {
        const only = JSON.stringify(s.const)
        values = values.filter((v) => JSON.stringify(v) === only)
      }
    } else {
      values = [s.const]
    }
    const types = this.types(s, path)
    if (types !== undefined) values = values.filter((value) => types.some((type) => isOfType(value, type)))
    if (values.length === 0) {
      throw new UnsupportedSchema({
        keyword: s.enum !== undefined ? "enum" : "const",
        path,
        reason: `no value of ${s.enum !== undefined ? "enum" : "const"} fits the schema's type`
      })
    }
    return this.literalNode(values)
  }

  private literalNode(values: ReadonlyArray<unknown>): Draft {
    interface Building {
      id: number
      children: Map<number, Building>
      terminal: boolean
      minRemaining: number
      minNext: number
    }
    const make = (): Building => ({
      id: this.nextLiteralId++,
      children: new Map(),
      terminal: false,
      minRemaining: Infinity,
      minNext: -1
    })
    const root = make()
    for (const value of values) {
      let node = root
      for (const byte of utf8.encode(JSON.stringify(value))) {
        let child = node.children.get(byte)
        if (child === undefined) {
          child = make()
          node.children.set(byte, child)
        }
        node = child
      }
      node.terminal = true
    }
    // Children before parents, without recursion: a literal may be long.
    const order: Array<Building> = []
    for (const pending = [root]; pending.length > 0; ) {
      const node = pending.pop()!
      order.push(node)
      for (const child of node.children.values()) pending.push(child)
    }
    for (let i = order.length - 1; i >= 0; i--) {
      const node = order[i]!
      if (node.terminal) node.minRemaining = 0
      for (const [byte, child] of node.children) {
        if (child.minRemaining + 1 < node.minRemaining) {
          node.minRemaining = child.minRemaining + 1
          node.minNext = byte
        }
      }
    }
    return this.add({ kind: "literal", id: 0, trie: root, minLength: root.minRemaining })
  }
}

const isOfType = (value: unknown, type: TypeName): boolean => {
  switch (type) {
    case "null":
      return value === null
    case "boolean":
      return typeof value === "boolean"
    case "integer":
      return Number.isInteger(value)
    case "number":
      return typeof value === "number" && Number.isFinite(value)
    case "string":
      return typeof value === "string"
    case "array":
      return Array.isArray(value)
    case "object":
      return typeof value === "object" && value !== null && !Array.isArray(value)
  }
}
