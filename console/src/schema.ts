/**
 * Just enough of JSON Schema to draw a form for an app's request, from its OpenAPI document: the
 * top-level fields, each as an input of its kind; anything richer is edited as JSON.
 */
import { openAiPath } from "../../src/control/gateway/OpenAiRoutes"

export type JsonSchema = Readonly<Record<string, unknown>>

export interface AppDocument {
  readonly info?: { readonly title?: string; readonly description?: string }
  readonly paths?: Readonly<Record<string, unknown>>
  readonly components?: { readonly schemas?: Readonly<Record<string, JsonSchema>> }
}

const isSchema = (value: unknown): value is JsonSchema => typeof value === "object" && value !== null

/** A schema with its `$ref`s (into the document's components) and one-item `allOf`s followed. */
export const resolved = (document: AppDocument, schema: unknown, depth = 0): JsonSchema => {
  if (!isSchema(schema) || depth > 16) return {}
  const ref = schema.$ref
  if (typeof ref === "string" && ref.startsWith("#/components/schemas/")) {
    const { $ref: _, ...own } = schema
    return {
      ...resolved(document, document.components?.schemas?.[ref.slice("#/components/schemas/".length)], depth + 1),
      ...own
    }
  }
  if (Array.isArray(schema.allOf) && schema.allOf.length === 1) {
    const { allOf, ...own } = schema
    return { ...resolved(document, allOf[0], depth + 1), ...own }
  }
  return schema
}

export type FieldKind =
  | { readonly _tag: "enum"; readonly values: ReadonlyArray<string | number | boolean> }
  | { readonly _tag: "boolean" }
  | { readonly _tag: "number"; readonly integer: boolean; readonly min?: number; readonly max?: number }
  | { readonly _tag: "string"; readonly long: boolean; readonly media: boolean }
  | { readonly _tag: "json" }

/** Field names whose strings are usually media, given as `data:` URLs. */
const mediaName = /image|audio|video|speech|voice|file|url/i

export const fieldKind = (document: AppDocument, name: string, raw: unknown, example: unknown): FieldKind => {
  const schema = resolved(document, raw)
  if (Array.isArray(schema.enum) && schema.enum.length > 0) return { _tag: "enum", values: schema.enum }
  if (Array.isArray(schema.anyOf)) {
    const options = schema.anyOf.filter((option) => !(isSchema(option) && option.type === "null"))
    return options.length === 1 ? fieldKind(document, name, options[0], example) : { _tag: "json" }
  }
  switch (schema.type) {
    case "boolean":
      return { _tag: "boolean" }
    case "integer":
    case "number":
      return {
        _tag: "number",
        integer: schema.type === "integer",
        ...(typeof schema.minimum === "number" ? { min: schema.minimum } : {}),
        ...(typeof schema.maximum === "number" ? { max: schema.maximum } : {})
      }
    case "string":
      return {
        _tag: "string",
        long: typeof schema.maxLength !== "number" || schema.maxLength > 200,
        media: mediaName.test(name) || (typeof example === "string" && example.startsWith("data:"))
      }
    default:
      return { _tag: "json" }
  }
}

export interface RequestShape {
  readonly schema: JsonSchema
  readonly properties: ReadonlyArray<readonly [string, unknown]>
  readonly required: ReadonlySet<string>
  readonly example: unknown
}

/** The request of the app's invoke route: its schema (resolved), fields and example. */
export const requestShape = (document: AppDocument, appId: string): RequestShape => {
  const operation = (document.paths?.[`/app/invoke/${appId}`] as { post?: { requestBody?: unknown } } | undefined)?.post
  const media = (operation?.requestBody as { content?: Record<string, { schema?: unknown; example?: unknown }> })
    ?.content?.["application/json"]
  const schema = resolved(document, media?.schema)
  const properties = isSchema(schema.properties) ? Object.entries(schema.properties) : []
  const required = new Set(
    Array.isArray(schema.required) ? schema.required.filter((key) => typeof key === "string") : []
  )
  return { schema, properties, required, example: media?.example }
}

/** Whether the app takes chat requests: its request has a `messages` array (OpenAI's chat, maybe extended). */
export const isChatRequest = (shape: RequestShape) => shape.properties.some(([name]) => name === "messages")

/** Whether the app answers OpenAI's chat route, which streams Server-Sent Events. */
export const hasOpenAiChat = (document: AppDocument, appId: string) =>
  document.paths?.[openAiPath("chat", appId)] !== undefined
