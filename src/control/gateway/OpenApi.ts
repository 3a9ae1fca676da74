/**
 * OpenAPI 3.1 documents: one per app (`GET /app/:id/openapi.json`: its invoke route with the app's
 * request and response schemas and example, and OpenAI's routes for an app that takes OpenAI chat
 * requests) and the platform's (`GET /openapi.json`: its own routes and every app's). Pure: the
 * gateway hands in what it knows of the apps and of who asks.
 */
import { readFileSync } from "node:fs"
import * as JSONSchema from "effect/JSONSchema"
import { openAiRoutes } from "./OpenAiPaths.js"
import { apiKeySecurity, appTag, failure, schemasPrefix } from "./OpenApiParts.js"
import { generated, platformPaths } from "./PlatformPaths.js"
import * as Schema from "effect/Schema"
import {
  type AppSchemas,
  cleanSchema,
  defsRefPrefix,
  holdsRef,
  type JsonSchema
} from "../../app-runtime/driver/AppSchemas.js"
import type { AppDescription, PlatformAuth, UndescribedApp } from "../AppDescriptions.js"
import { componentNames } from "./ComponentNames.js"
import {
  ChatCompletion,
  ChatCompletionChunk,
  CompletionRequest,
  ModelObject,
  TextCompletion
} from "../../app-runtime/schemas/OpenAI.js"
import { DetailedErrorAnswer } from "./GatewayAnswers.js"

/** An OpenAPI document, as JSON. */
export type OpenApiDocument = { readonly openapi: string } & { readonly [field: string]: unknown }

/** An app whose schemas the document shows. */
export type DescribedApp = AppDescription<AppSchemas>

export type { PlatformAuth, UndescribedApp }

/** The installation's version: the platform document's. */
const platformVersion = (() => {
  try {
    const manifest = JSON.parse(readFileSync(new URL("../../../package.json", import.meta.url), "utf8")) as {
      readonly version?: unknown
    }
    return typeof manifest.version === "string" ? manifest.version : "unknown"
  } catch {
    return "unknown"
  }
})()

// ---- The platform's own schemas ----

/** `GET /app/:id/v1/models`: OpenAI's list of models. */
const ModelList = Schema.Struct({ object: Schema.Literal("list"), data: Schema.Array(ModelObject) })

/**
 * The platform's schemas, JSON Schema from their Effect Schemas, named in `components/schemas`.
 * Answers take fields they do not name (a client reads those it knows); request bodies do not (the
 * gateway refuses a field it does not know).
 */
const platformSchemas: ReadonlyMap<string, JsonSchema> = (() => {
  const definitions: Record<string, JSONSchema.JsonSchema7> = {}
  const named = new Map<string, unknown>()
  const add = (name: string, schema: Schema.Schema.Any, extraFields: "allow" | "strict") =>
    named.set(
      name,
      JSONSchema.fromAST(schema.ast, {
        definitions,
        definitionPath: schemasPrefix,
        target: "openApi3.1",
        additionalPropertiesStrategy: extraFields
      })
    )
  add("ErrorAnswer", DetailedErrorAnswer, "allow")
  add("ChatCompletion", ChatCompletion, "allow")
  add("ChatCompletionChunk", ChatCompletionChunk, "allow")
  add("CompletionRequest", CompletionRequest, "strict")
  add("TextCompletion", TextCompletion, "allow")
  add("ModelObject", ModelObject, "allow")
  add("ModelList", ModelList, "allow")
  for (const [name, schema] of Object.entries(definitions)) if (!named.has(name)) named.set(name, schema)
  // The platform's own routes' schemas, as generated with them (less the decode error those routes never answer).
  for (const [name, schema] of Object.entries(generated.components.schemas))
    if (!["HttpApiDecodeError", "Issue", "PropertyKey"].includes(name)) named.set(name, schema)
  const keep = (target: string) =>
    target.startsWith(schemasPrefix) && named.has(target.slice(schemasPrefix.length)) ? target : undefined
  return new Map([...named].map(([name, schema]) => [name, cleanSchema(schema, keep)]))
})()

// ---- Operations ----

const invokeFailures = (needsApiKey: boolean) => ({
  "400": failure("The body is not JSON or nests too deeply, or a task refused an input the request made."),
  ...(needsApiKey ? { "401": failure("No API key, or not one this app takes.") } : {}),
  "404": failure("No app has this id (`AppNotFound`)."),
  "413": failure("The body is larger than the platform takes (`PayloadTooLarge`)."),
  "415": failure("The body is not `application/json` (`UnsupportedMediaType`)."),
  "422": failure(
    "The body does not match the app's request schema (`RequestSchemaMismatch`): `issues` names each field."
  ),
  "429": failure("The app runs and queues as many requests as its admission settings allow (`AppOverloaded`).", true),
  "500": failure("The app failed (`AppFailed`)."),
  "502": failure("A task call failed (`DispatchFailed`)."),
  "503": failure(
    "The app is not ready, a task has no executor free, the request waited too long for a turn, or the platform shuts down.",
    true
  ),
  "504": failure("The request took longer than its timeout (`RequestTimeout`).")
})

const streamsNote =
  'A stream that fails ends with an error line, `{"error":{"code":…,"message":…}}`, as the answer\'s last.'

/** `POST /app/invoke/ID` of an app whose schemas the document shows. */
const invokeOperation = (app: DescribedApp, rename: (ref: string) => string | undefined) => {
  const request = cleanSchema(app.schemas.request, rename)
  const answer =
    app.schemas.response === undefined
      ? { description: "Any JSON: the app declares no response schema." }
      : cleanSchema(app.schemas.response, rename)
  const json = { "application/json": { schema: answer } }
  const ndjson = { "application/x-ndjson": { schema: answer } }
  const showsExample = app.example !== undefined && !holdsRef(app.example)
  return {
    operationId: `invoke_${app.id}`,
    tags: [appTag(app.id)],
    summary: `Call ${app.id}`,
    ...(app.description === undefined ? {} : { description: app.description }),
    ...apiKeySecurity(app.needsApiKey),
    requestBody: {
      required: true,
      content: { "application/json": { schema: request, ...(showsExample ? { example: app.example } : {}) } }
    },
    responses: {
      "200": app.schemas.streams
        ? {
            description: `The app's answer streams: one JSON value per line (NDJSON), each matching the schema. ${streamsNote}`,
            content: ndjson
          }
        : {
            description: `The app's answer: one JSON value, or, when the app answers this request with a stream, one value per line (NDJSON), each matching the schema. ${streamsNote}`,
            content: { ...json, ...ndjson }
          },
      ...invokeFailures(app.needsApiKey)
    }
  }
}

/** `POST /app/invoke/ID` of an app the document names without its schemas. */
const undescribedInvokeOperation = (app: UndescribedApp) => ({
  operationId: `invoke_${app.id}`,
  tags: [appTag(app.id)],
  summary: `Call ${app.id}`,
  description: app.why,
  ...apiKeySecurity(app.needsApiKey),
  requestBody: { required: true, content: { "application/json": { schema: {} } } },
  responses: {
    "200": { description: "The app's answer.", content: { "application/json": { schema: {} } } },
    ...invokeFailures(app.needsApiKey)
  }
})

/** An app's paths and the schemas they name, under the names `names` gives them. */
const appPaths = (app: DescribedApp, names: ReadonlyMap<string, string>) => {
  const rename = (target: string) => {
    const name = target.startsWith(defsRefPrefix) ? names.get(target.slice(defsRefPrefix.length)) : undefined
    return name === undefined ? undefined : `${schemasPrefix}${name}`
  }
  const schemas = [...app.schemas.defs].map(
    ([name, schema]) => [names.get(name)!, cleanSchema(schema, rename)] as const
  )
  const paths = {
    [`/app/invoke/${app.id}`]: { post: invokeOperation(app, rename) },
    ...Object.assign(
      {},
      ...openAiRoutes.filter((route) => route.takes(app.schemas)).map((route) => route.paths(app, rename))
    )
  }
  return { paths, schemas }
}

const securitySchemes: Record<"apiKey" | "adminToken" | "metricsToken", unknown> = {
  adminToken: generated.components.securitySchemes.adminToken,
  metricsToken: generated.components.securitySchemes.metricsToken,
  apiKey: {
    type: "http",
    scheme: "bearer",
    description:
      "An API key: the platform's (`serve --api-key`, CORNSERVE_API_KEY), one the app's registration set (`app register --api-key`), or the admin token."
  }
}

const usedSchemes = (names: ReadonlyArray<keyof typeof securitySchemes>) =>
  Object.fromEntries(names.map((name) => [name, securitySchemes[name]]))

const namedSchemas = (entries: Iterable<readonly [string, JsonSchema]>) => Object.fromEntries(entries)

/** `GET /app/:id/openapi.json`: the app's routes, its schemas, its example. */
export const appDocument = (app: DescribedApp): OpenApiDocument => {
  const { paths, schemas } = appPaths(app, componentNames(platformSchemas, [app]).get(app.id)!)
  return {
    openapi: "3.1.0",
    info: {
      title: app.id,
      version: app.registeredAt,
      ...(app.description === undefined ? {} : { description: app.description })
    },
    tags: [{ name: appTag(app.id), ...(app.description === undefined ? {} : { description: app.description }) }],
    paths,
    components: {
      schemas: namedSchemas([...platformSchemas, ...schemas]),
      securitySchemes: usedSchemes(["apiKey"])
    }
  }
}

/** `GET /openapi.json`: the platform's routes, and each app's, with the schemas of those the reader may see. */
export const platformDocument = (
  apps: ReadonlyArray<DescribedApp | UndescribedApp>,
  auth: PlatformAuth
): OpenApiDocument => {
  const described = apps.filter((app): app is DescribedApp => "schemas" in app)
  const names = componentNames(platformSchemas, described)
  const paths: Record<string, unknown> = {}
  const schemas = new Map(platformSchemas)
  const tags: Array<{ readonly name: string; readonly description?: string }> = [...generated.tags]
  for (const app of apps) {
    if ("schemas" in app) {
      const own = appPaths(app, names.get(app.id)!)
      Object.assign(paths, own.paths)
      for (const [name, schema] of own.schemas) schemas.set(name, schema)
      tags.push({ name: appTag(app.id), ...(app.description === undefined ? {} : { description: app.description }) })
    } else {
      paths[`/app/invoke/${app.id}`] = { post: undescribedInvokeOperation(app) }
      tags.push({ name: appTag(app.id), description: app.why })
    }
  }
  return {
    openapi: "3.1.0",
    info: {
      title: "Cornserve",
      version: platformVersion,
      description:
        "The platform's routes, and each registered app's. `/docs` shows this document; `/app/ID/docs` an app's."
    },
    tags,
    paths: { ...platformPaths(auth), ...paths },
    components: {
      schemas: namedSchemas(schemas),
      securitySchemes: usedSchemes(["apiKey", "adminToken", "metricsToken"])
    }
  }
}
