/**
 * What an app takes and answers, as JSON Schema: its process writes them from the app's Effect
 * Schemas when it loads and sends them in its "loaded" message; the platform reads them, within
 * bounds and cleaned, for the app's OpenAPI document. Both sides use this module: one contract for
 * the wire.
 */
import * as JSONSchema from "effect/JSONSchema"
import * as Schema from "effect/Schema"
import type { App } from "../App.js"
import { jsonDepthWithin } from "../JsonDepth.js"
import { shortened } from "../Shortened.js"
import { UniqueNames } from "./UniqueNames.js"

/** The most characters an app's schemas may take as JSON: far above a real app's (an OpenAI chat request takes 5 KB). */
export const maxSchemasChars = 256 * 1024

/** How deeply they may nest arrays and objects: each level of a request's data is two or three of JSON Schema's. */
export const maxSchemasDepth = 128

/**
 * How many named schemas (`$defs`) they may hold: far above a real app's (an OpenAI chat request
 * names 3), and few enough that the platform's work on them, linear in their size, stays small.
 */
export const maxSchemaDefs = 1_000

/** The app's schemas as its process sends them. */
export const AppSchemasWire = Schema.Struct({
  /**
   * `{ request, response?, $defs? }` as JSON: JSON Schemas (2020-12, the dialect of OpenAPI 3.1) whose
   * `$ref`s point into `$defs` (`#/$defs/NAME`); `response` is absent when the app declares none.
   */
  json: Schema.String.pipe(Schema.maxLength(maxSchemasChars)),
  /** `serve` is an async generator: every answer streams. Otherwise an answer may be one value or a stream. */
  streams: Schema.Boolean
})
export type AppSchemasWire = typeof AppSchemasWire.Type

/** A JSON Schema: an object of keywords, or `true`/`false`. */
export type JsonSchema = boolean | { readonly [keyword: string]: unknown }

/** An app's schemas as the platform keeps them: cleaned, their references into `defs` only. */
export interface AppSchemas {
  readonly request: JsonSchema
  /** Undefined: the app declares no response schema. */
  readonly response: JsonSchema | undefined
  /** The named schemas the others refer to, as `#/$defs/NAME`; each NAME is `[A-Za-z0-9._-]+`. */
  readonly defs: ReadonlyMap<string, JsonSchema>
  readonly streams: boolean
}

/** The schemas of an app whose process sent none: it takes and answers any JSON. */
export const undescribedSchemas: AppSchemas = {
  request: {},
  response: undefined,
  defs: new Map(),
  streams: false
}

/** Where a reference into `defs` points. */
export const defsRefPrefix = "#/$defs/"

// ---- The app's process: its Effect Schemas as JSON Schema ----

const errorText = (error: unknown): string => {
  try {
    return error instanceof Error ? error.message : String(error)
  } catch {
    return "an error that cannot be described"
  }
}

/**
 * `schema` as JSON Schema, its named parts added to `defs`; a schema JSON Schema cannot express (a
 * declaration such as `instanceOf`, a `Uint8Array`, a recursion without an identifier) is described
 * by a note instead, so that no schema keeps an app from loading.
 */
const jsonSchemaOf = (
  schema: Schema.Schema.Any,
  defs: Record<string, unknown>,
  extraFields: "allow" | "strict",
  what: string
): JsonSchema => {
  const attempt = { ...defs }
  try {
    const out: unknown = JSONSchema.fromAST(schema.ast, {
      definitions: attempt as Record<string, JSONSchema.JsonSchema7>,
      target: "openApi3.1",
      additionalPropertiesStrategy: extraFields
    })
    Object.assign(defs, attempt)
    return out as JsonSchema
  } catch (error) {
    return {
      description: `The app's ${what} schema has no JSON Schema form: ${shortened(errorText(error).replace(/\s+/g, " "), 500)}`
    }
  }
}

const isAsyncGeneratorFunction = (value: unknown): boolean =>
  Object.prototype.toString.call(value) === "[object AsyncGeneratorFunction]"

/** Why schemas written as `json`, naming `defs` schemas, are not sent: over the bounds the platform holds them to. */
const boundsProblem = (json: string, defs: number): string | undefined => {
  if (defs > maxSchemaDefs)
    return `The app's schemas name ${defs} schemas ($defs) as JSON Schema, over the limit of ${maxSchemaDefs}.`
  if (json.length > maxSchemasChars)
    return `The app's schemas take ${json.length} characters as JSON Schema, over the limit of ${maxSchemasChars}.`
  if (jsonDepthWithin(json, maxSchemasDepth) === undefined)
    return `The app's schemas nest deeper than the limit of ${maxSchemasDepth} as JSON Schema.`
  return undefined
}

/** What the app's process sends of its app's schemas; a note in place of any it cannot send. */
export const appSchemasOf = (app: App): AppSchemasWire => {
  const streams = isAsyncGeneratorFunction(app.serve)
  const defs: Record<string, unknown> = {}
  const request = jsonSchemaOf(app.request, defs, app.extraFields === "drop" ? "allow" : "strict", "request")
  const response = app.response === undefined ? undefined : jsonSchemaOf(app.response, defs, "strict", "response")
  let json: string
  try {
    json = JSON.stringify({
      request,
      ...(response === undefined ? {} : { response }),
      ...(Object.keys(defs).length === 0 ? {} : { $defs: defs })
    })
  } catch (error) {
    // An annotation JSON cannot carry (a cycle, a BigInt) fails here.
    json = JSON.stringify({ request: { description: shortened(errorText(error), 500) } })
  }
  const problem = boundsProblem(json, Object.keys(defs).length)
  if (problem === undefined) return { json, streams }
  const note = { description: problem }
  return { json: JSON.stringify({ request: note, ...(response === undefined ? {} : { response: note }) }), streams }
}

// ---- The platform: the schemas an app's process sent, within bounds and cleaned ----

/** Keywords whose value is a schema. */
const schemaKeywords = new Set([
  "items",
  "additionalProperties",
  "not",
  "if",
  "then",
  "else",
  "contains",
  "propertyNames",
  "unevaluatedItems",
  "unevaluatedProperties",
  "contentSchema"
])
/** Keywords whose value is a list of schemas. */
const schemaListKeywords = new Set(["allOf", "anyOf", "oneOf", "prefixItems"])
/** Keywords whose value maps names to schemas. */
const schemaMapKeywords = new Set(["properties", "patternProperties", "dependentSchemas"])
const textKeywords = new Set(["title", "description", "format", "pattern", "contentMediaType", "contentEncoding"])
const countKeywords = new Set([
  "minLength",
  "maxLength",
  "minItems",
  "maxItems",
  "minProperties",
  "maxProperties",
  "minContains",
  "maxContains"
])
const numberKeywords = new Set(["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"])
const flagKeywords = new Set(["uniqueItems", "deprecated", "readOnly", "writeOnly"])
/** Keywords whose value is data: any JSON. */
const valueKeywords = new Set(["const", "default"])
/** Keywords whose value is a list of data. */
const valueListKeywords = new Set(["enum", "examples"])
const typeNames = new Set(["null", "boolean", "object", "array", "number", "integer", "string"])

const isRecord = (value: unknown): value is Record<string, unknown> =>
  typeof value === "object" && value !== null && !Array.isArray(value)

const isStringList = (value: unknown): value is ReadonlyArray<string> =>
  Array.isArray(value) && value.every((item) => typeof item === "string")

/**
 * Whether a value holds a `$ref` key anywhere: whoever reads a document (Swagger UI, a client
 * generator) resolves a `$ref` wherever it stands, so that an app's data could make a reader's
 * browser fetch from anywhere.
 */
export const holdsRef = (value: unknown): boolean => {
  if (Array.isArray(value)) return value.some(holdsRef)
  if (!isRecord(value)) return false
  return Object.keys(value).some((key) => key === "$ref" || holdsRef(value[key]))
}

/** An object with no prototype: a key `__proto__` from an app's JSON stays a key. */
const bare = (): Record<string, unknown> => Object.create(null) as Record<string, unknown>

/**
 * A JSON Schema with only the keywords a reader of an OpenAPI 3.1 document knows, each of the type
 * its keyword wants, and only the references `rename` maps (to where they point in the document);
 * whatever else it held is left out, so that what an app sends yields a valid document whatever it
 * is. `value` is parsed JSON of a bounded depth, as the walk recurses.
 */
export const cleanSchema = (value: unknown, rename: (ref: string) => string | undefined): JsonSchema => {
  if (typeof value === "boolean") return value
  if (!isRecord(value)) return {}
  const out = bare()
  for (const keyword of Object.keys(value)) {
    const given = value[keyword]
    if (keyword === "$ref") {
      const target = typeof given === "string" ? rename(given) : undefined
      if (target !== undefined) out.$ref = target
    } else if (schemaKeywords.has(keyword)) {
      out[keyword] = cleanSchema(given, rename)
    } else if (schemaListKeywords.has(keyword)) {
      if (Array.isArray(given) && given.length > 0) out[keyword] = given.map((item) => cleanSchema(item, rename))
    } else if (schemaMapKeywords.has(keyword)) {
      if (isRecord(given)) {
        const map = bare()
        for (const name of Object.keys(given)) map[name] = cleanSchema(given[name], rename)
        out[keyword] = map
      }
    } else if (textKeywords.has(keyword)) {
      if (typeof given === "string") out[keyword] = given
    } else if (countKeywords.has(keyword)) {
      if (Number.isSafeInteger(given) && (given as number) >= 0) out[keyword] = given
    } else if (numberKeywords.has(keyword)) {
      if (typeof given === "number") out[keyword] = given
    } else if (keyword === "multipleOf") {
      if (typeof given === "number" && given > 0) out[keyword] = given
    } else if (flagKeywords.has(keyword)) {
      if (typeof given === "boolean") out[keyword] = given
    } else if (valueKeywords.has(keyword)) {
      if (!holdsRef(given)) out[keyword] = given
    } else if (valueListKeywords.has(keyword)) {
      if (Array.isArray(given) && !holdsRef(given)) out[keyword] = given
    } else if (keyword === "type") {
      if (
        typeof given === "string" ? typeNames.has(given) : isStringList(given) && given.every((t) => typeNames.has(t))
      )
        out[keyword] = given
    } else if (keyword === "required") {
      if (isStringList(given)) out[keyword] = given
    } else if (keyword === "dependentRequired") {
      if (isRecord(given) && Object.values(given).every(isStringList)) {
        const map = bare()
        for (const name of Object.keys(given)) map[name] = given[name]
        out[keyword] = map
      }
    }
    // Anything else ($id, $schema, $anchor, $comment, extensions, unknown keywords) is left out.
  }
  return out
}

/** A name a document may give a schema (OpenAPI's components take `[A-Za-z0-9._-]+`). */
const documentName = (name: string): string => name.replace(/[^A-Za-z0-9._-]/g, "_").slice(0, 100) || "_"

/** A name as a JSON pointer writes it (`~` and `/` escaped). */
const pointerEscaped = (name: string) => name.replace(/~/g, "~0").replace(/\//g, "~1")

/**
 * The schemas an app's process sent, or why they cannot be read (which only a process that
 * replaced the SDK's code sends): refused when nested too deeply, not JSON, or naming more than
 * `maxSchemaDefs` schemas; then cleaned (`cleanSchema`), their references pointing into their own
 * `$defs` under names a document takes. Linear in their size: within the bounds, a few milliseconds.
 */
export const readAppSchemas = (wire: AppSchemasWire): AppSchemas | string => {
  if (jsonDepthWithin(wire.json, maxSchemasDepth) === undefined)
    return `its schemas nest deeper than the limit of ${maxSchemasDepth}`
  let parsed: unknown
  try {
    parsed = JSON.parse(wire.json)
  } catch {
    return "its schemas are not JSON"
  }
  if (!isRecord(parsed) || !("request" in parsed)) return "its schemas are not an object with a request schema"
  const given = isRecord(parsed.$defs) ? parsed.$defs : {}
  const givenNames = Object.keys(given)
  if (givenNames.length > maxSchemaDefs)
    return `its schemas name ${givenNames.length} schemas ($defs), over the limit of ${maxSchemaDefs}`
  const names = new Map<string, string>()
  const unique = new UniqueNames()
  for (const name of givenNames) names.set(`${defsRefPrefix}${pointerEscaped(name)}`, unique.take(documentName(name)))
  const rename = (ref: string) => {
    const name = names.get(ref)
    return name === undefined ? undefined : `${defsRefPrefix}${name}`
  }
  const defs = new Map<string, JsonSchema>()
  for (const name of givenNames) {
    defs.set(names.get(`${defsRefPrefix}${pointerEscaped(name)}`)!, cleanSchema(given[name], rename))
  }
  return {
    request: cleanSchema(parsed.request, rename),
    response: "response" in parsed ? cleanSchema(parsed.response, rename) : undefined,
    defs,
    streams: wire.streams
  }
}
