import * as Schema from "effect/Schema"
import { checkSchemaBounds, schemaBounds, schemaTooLarge } from "./SchemaBounds.js"

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

export type ResponseFormat =
  | { readonly type: "json_object" }
  | {
      readonly type: "json_schema"
      readonly json_schema: {
        readonly name?: string | undefined
        readonly schema?: unknown
        readonly strict?: boolean | null | undefined
      }
    }

/** A schema (or part of one) that cannot be held to; the router answers 400 with its message. */
export class UnsupportedSchema extends Schema.TaggedError<UnsupportedSchema>()("UnsupportedSchema", {
  /** The keyword at fault, e.g. `pattern` or `$ref`. */
  keyword: Schema.String,
  /** A JSON pointer into the schema, `#` for its root. */
  path: Schema.String,
  reason: Schema.String
}) {
  override get message() {
    return `${this.reason} at ${this.path}`
  }
}

/** A complete JSON value written as one sequence of bytes: the node admits exactly these. */
export interface LiteralTrie {
  readonly id: number
  readonly children: ReadonlyMap<number, LiteralTrie>
  /** A literal ends here. */
  readonly terminal: boolean
  /** Bytes from here to the nearest end of a literal, and the first of them (-1 at an end). */
  readonly minRemaining: number
  readonly minNext: number
}

export interface Property {
  readonly name: string
  /** The key as written: `"name"`, quotes included, as UTF-8. */
  readonly key: Uint8Array
  readonly value: GrammarNode
  readonly required: boolean
}

/**
 * Bytes still to write in an object with declared properties, by the index of the next property
 * that may be written (all earlier ones written or left out). The keys that may come next at an
 * index are those from it up to the first required one (see `keyCandidates`).
 */
export interface ObjectLayout {
  /** The first required property from this index on (the count of properties when none is left). */
  readonly nextRequired: ReadonlyArray<number>
  /** Of the keys that may come next, the one whose key, value and tail are the fewest bytes (-1 when none may). */
  readonly cheapest: ReadonlyArray<number>
  /** After a value, with properties from this index left: `}` or `,` and the rest. */
  readonly tail: ReadonlyArray<number>
  /** Where a key starts (after `,` or `{`): the cheapest candidate's key, `:`, value, and the tail. */
  readonly nextKey: ReadonlyArray<number>
  /** Right after `{`. */
  readonly open: number
}

/** The properties whose key may come next at `index` (all before it written or left out). */
export const keyCandidates = (layout: ObjectLayout, index: number): Array<number> => {
  const count = layout.nextRequired.length - 1
  const end = Math.min(layout.nextRequired[index]! + 1, count)
  const candidates: Array<number> = []
  for (let j = index; j < end; j++) candidates.push(j)
  return candidates
}

/** No property is left to write from `index` on but optional ones: the object may close. */
export const mayCloseAt = (layout: ObjectLayout, index: number): boolean =>
  layout.nextRequired[index] === layout.nextRequired.length - 1

export type GrammarNode =
  | {
      readonly kind: "object"
      readonly id: number
      readonly properties: ReadonlyArray<Property>
      /** Defined for an object of any keys, whose values are this node. */
      readonly extra: GrammarNode | undefined
      readonly layout: ObjectLayout
      readonly minLength: number
    }
  | {
      readonly kind: "array"
      readonly id: number
      readonly items: GrammarNode
      readonly minItems: number
      readonly maxItems: number
      readonly minLength: number
    }
  | { readonly kind: "string"; readonly id: number; readonly minLength: number }
  | { readonly kind: "number"; readonly id: number; readonly integer: boolean; readonly minLength: number }
  | { readonly kind: "literal"; readonly id: number; readonly trie: LiteralTrie; readonly minLength: number }
  | {
      readonly kind: "union"
      readonly id: number
      readonly options: ReadonlyArray<GrammarNode>
      readonly minLength: number
    }

export interface Grammar {
  /** Equal for equal requests: masks computed for one serve the other. */
  readonly key: string
  readonly root: GrammarNode
}

export const numberLimits = { integerDigits: 16, fractionDigits: 8, exponentDigits: 2 } as const

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

/** Mutable while compiling; read through GrammarNode afterwards. */
type Draft =
  | {
      kind: "object"
      id: number
      properties: Array<{ name: string; key: Uint8Array; value: Draft; required: boolean }>
      extra: Draft | undefined
      layout: ObjectLayout
      minLength: number
    }
  | { kind: "array"; id: number; items: Draft; minItems: number; maxItems: number; minLength: number }
  | { kind: "string"; id: number; minLength: number }
  | { kind: "number"; id: number; integer: boolean; minLength: number }
  | { kind: "literal"; id: number; trie: LiteralTrie; minLength: number }
  | { kind: "union"; id: number; options: Array<Draft>; minLength: number }
  | { kind: "ref"; id: number; target: Draft | undefined; path: string; minLength: number }

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
    const resolved = new Map<Draft, Draft>()
    /** What a reference (or a chain of them) stands for; each reference is followed once. */
    const resolve = (node: Draft): Draft => {
      const chain: Array<Draft> = []
      let at = node
      while (at.kind === "ref") {
        const known = resolved.get(at)
        if (known !== undefined) {
          at = known
          break
        }
        if (chain.includes(at) || at.target === undefined) {
          throw new UnsupportedSchema({ keyword: "$ref", path: at.path, reason: "$ref refers to itself" })
        }
        chain.push(at)
        at = at.target
      }
      for (const ref of chain) resolved.set(ref, at)
      return at
    }
    for (const node of this.nodes) {
      if (node.kind === "object") {
        for (const property of node.properties) property.value = resolve(property.value)
        if (node.extra !== undefined) node.extra = resolve(node.extra)
      } else if (node.kind === "array") node.items = resolve(node.items)
    }
    let steps = 0
    /** A union's options, the options of unions among them in their place, each once. */
    const flatten = (union: Extract<Draft, { kind: "union" }>): Array<Draft> => {
      const out: Array<Draft> = []
      const seen = new Set<Draft>([union])
      const pending: Array<{ readonly options: ReadonlyArray<Draft>; at: number }> = [{ options: union.options, at: 0 }]
      while (pending.length > 0) {
        const top = pending[pending.length - 1]!
        if (top.at === top.options.length) {
          pending.pop()
          continue
        }
        if (++steps > schemaBounds.alternatives) {
          throw schemaTooLarge("alternatives", "steps of gathering the options of nested anyOf")
        }
        const option = resolve(top.options[top.at++]!)
        if (seen.has(option)) continue
        seen.add(option)
        if (option.kind === "union") pending.push({ options: option.options, at: 0 })
        else out.push(option)
      }
      return out
    }
    for (const node of this.nodes) if (node.kind === "union") node.options = flatten(node)
    const top = resolve(root)
    const live = this.nodes.filter((node) => node.kind !== "ref")
    shortestValues(live)
    if (!Number.isFinite(top.minLength)) {
      throw new UnsupportedSchema({
        keyword: "$ref",
        path: "#",
        reason: "the schema admits no finite value (its recursion never ends)"
      })
    }
    for (const node of live) {
      if (node.kind === "union") node.options = node.options.filter((o) => Number.isFinite(o.minLength))
      if (node.kind === "array" && !Number.isFinite(node.items.minLength)) node.maxItems = 0
      if (node.kind === "object") {
        node.properties = node.properties.filter((p) => p.required || Number.isFinite(p.value.minLength))
        if (node.extra !== undefined && !Number.isFinite(node.extra.minLength)) node.extra = undefined
        node.layout = layout(node)
      }
    }
    return top as GrammarNode
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

/** What a node's shortest value needs first: none (its length is known), all of `needs`, or any one of them. */
const needsOf = (node: Draft): { readonly all: boolean; readonly needs: ReadonlyArray<Draft> } | undefined => {
  switch (node.kind) {
    case "object":
      return node.extra !== undefined
        ? undefined
        : { all: true, needs: node.properties.filter((p) => p.required).map((p) => p.value) }
    case "array":
      return node.minItems === 0 ? undefined : { all: true, needs: [node.items] }
    case "union":
      return { all: false, needs: node.options }
    default:
      return undefined
  }
}

/** The length of a node's shortest value, from those of the nodes it needs. */
const lengthOf = (node: Draft): number => {
  switch (node.kind) {
    case "object": {
      if (node.extra !== undefined) return 2
      let required = 0
      let length = 2
      for (const p of node.properties) {
        if (!p.required) continue
        required++
        length += p.key.length + 1 + p.value.minLength
      }
      return length + Math.max(0, required - 1)
    }
    case "array":
      return node.minItems === 0 ? 2 : 2 + node.minItems * (node.items.minLength + 1) - 1
    case "string":
      return 2
    case "number":
      return 1
    case "literal":
      return node.trie.minRemaining
    case "union":
    case "ref":
      return Infinity
  }
}

/**
 * Sets each node's `minLength`, Knuth's generalization of Dijkstra's algorithm over the schema's
 * graph (recursion through $ref makes it one): the shortest values are settled shortest first, a
 * node needing all its parts once they all are, a union at its first settled option. A node
 * never settled admits no finite value. Refuses a schema whose shortest values are longer, or
 * nest deeper, than SchemaBounds.ts takes.
 */
const shortestValues = (nodes: ReadonlyArray<Draft>): void => {
  const dependents = new Map<Draft, Array<Draft>>()
  const waiting = new Map<Draft, number>()
  const depth = new Map<Draft, number>()
  const queue = new SettleQueue()
  for (const node of nodes) {
    const needs = needsOf(node)
    if (needs === undefined || (needs.all && needs.needs.length === 0)) {
      queue.push(node, lengthOf(node), 1)
      continue
    }
    if (needs.all) waiting.set(node, needs.needs.length)
    for (const need of needs.needs) {
      const list = dependents.get(need)
      if (list === undefined) dependents.set(need, [node])
      else list.push(node)
    }
  }
  for (let next = queue.pop(); next !== undefined; next = queue.pop()) {
    const { node, length, nesting } = next
    if (depth.has(node)) continue
    if (length > schemaBounds.shortestValue) {
      throw schemaTooLarge("shortestValue", "bytes in its shortest value (or in that of one of its parts)")
    }
    if (nesting > schemaBounds.shortestValueDepth) {
      throw schemaTooLarge("shortestValueDepth", "values within values in its shortest value")
    }
    node.minLength = length
    depth.set(node, nesting)
    for (const dependent of dependents.get(node) ?? []) {
      if (depth.has(dependent)) continue
      if (dependent.kind === "union") {
        queue.push(dependent, length, nesting)
        continue
      }
      const left = waiting.get(dependent)! - 1
      waiting.set(dependent, left)
      if (left > 0) continue
      let deepest = 0
      for (const need of needsOf(dependent)!.needs) deepest = Math.max(deepest, depth.get(need)!)
      queue.push(dependent, lengthOf(dependent), deepest + 1)
    }
  }
}

/** A binary heap of nodes by the length they would settle at. */
class SettleQueue {
  private readonly items: Array<{ readonly node: Draft; readonly length: number; readonly nesting: number }> = []

  push(node: Draft, length: number, nesting: number): void {
    const items = this.items
    items.push({ node, length, nesting })
    for (let at = items.length - 1; at > 0; ) {
      const parent = (at - 1) >> 1
      if (items[parent]!.length <= items[at]!.length) break
      ;[items[parent], items[at]] = [items[at]!, items[parent]!]
      at = parent
    }
  }

  pop(): { readonly node: Draft; readonly length: number; readonly nesting: number } | undefined {
    const items = this.items
    const first = items[0]
    const last = items.pop()
    if (first === undefined || last === undefined || items.length === 0) return first
    items[0] = last
    for (let at = 0; ; ) {
      const left = 2 * at + 1
      const right = left + 1
      let least = at
      if (left < items.length && items[left]!.length < items[least]!.length) least = left
      if (right < items.length && items[right]!.length < items[least]!.length) least = right
      if (least === at) break
      ;[items[least], items[at]] = [items[at]!, items[least]!]
      at = least
    }
    return first
  }
}

/** An object's layout in one pass from its last property back. */
const layout = (node: Extract<Draft, { kind: "object" }>): ObjectLayout => {
  const properties = node.properties
  const count = properties.length
  const nextRequired = new Array<number>(count + 1).fill(count)
  const cheapest = new Array<number>(count + 1).fill(-1)
  const tail = new Array<number>(count + 1).fill(1)
  const nextKey = new Array<number>(count + 1).fill(Infinity)
  for (let i = count - 1; i >= 0; i--) {
    const p = properties[i]!
    nextRequired[i] = p.required ? i : nextRequired[i + 1]!
    // The candidates at i: i itself, and if it may be left out, those at i + 1 (earlier wins a tie).
    const cost = p.key.length + 1 + p.value.minLength + tail[i + 1]!
    if (p.required || cost <= nextKey[i + 1]!) {
      nextKey[i] = cost
      cheapest[i] = i
    } else {
      nextKey[i] = nextKey[i + 1]!
      cheapest[i] = cheapest[i + 1]!
    }
    tail[i] = nextRequired[i]! < count ? 1 + nextKey[i]! : 1
  }
  const open = nextRequired[0]! < count ? nextKey[0]! : 1
  return { nextRequired, cheapest, tail, nextKey, open }
}
