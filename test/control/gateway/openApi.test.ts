import { Either, Schema } from "effect"
import { describe, expect, it } from "vitest"
import { type App, defineApp } from "../../../src/app-runtime/App.js"
import {
  type AppSchemas,
  appSchemasOf,
  maxSchemasChars,
  maxSchemasDepth,
  readAppSchemas
} from "../../../src/app-runtime/driver/AppSchemas.js"
import { FromApp } from "../../../src/app-runtime/driver/protocol.js"
import { EmbeddingRequest, EmbeddingResponse } from "../../../src/app-runtime/schemas/Embeddings.js"
import { ChatCompletionRequest } from "../../../src/app-runtime/schemas/OpenAI.js"
import { appDocument, type DescribedApp, platformDocument } from "../../../src/control/gateway/OpenApi.js"
import { type JsonDocument, openApiProblem, requestOf, schemaErrors } from "../../support/openApi.js"

/** What the platform keeps of an app: its schemas as its process writes them, read as the platform reads them. */
const schemasOf = (app: App): AppSchemas => {
  const read = readAppSchemas(appSchemasOf(app))
  if (typeof read === "string") throw new Error(read)
  return read
}

const described = (id: string, app: App, needsApiKey = false): DescribedApp => ({
  id,
  description: app.description,
  example: app.example,
  schemas: schemasOf(app),
  needsApiKey,
  registeredAt: "2026-01-01T00:00:00.000Z"
})

const hello = defineApp({
  description: "Greets whoever it is asked to greet.",
  tasks: {},
  request: Schema.Struct({ name: Schema.String.pipe(Schema.minLength(1), Schema.maxLength(200)) }),
  response: Schema.Struct({ greeting: Schema.String }),
  example: { name: "Ada" },
  serve: ({ name }) => ({ greeting: `Hello, ${name}!` })
})

const chat = defineApp({
  description: "Answers chat requests.",
  tasks: {},
  request: ChatCompletionRequest,
  example: { messages: [{ role: "user", content: "Hi" }], max_tokens: 8 },
  serve: () => ({})
})

const Item = Schema.Struct({ label: Schema.String, at: Schema.Date }).annotations({ identifier: "Item" })

/** Streams: an async generator, whose answer lines have a named part and a transformation (a Date as a string). */
const countdown = defineApp({
  tasks: {},
  request: Schema.Struct({
    from: Schema.Int.pipe(Schema.between(1, 10)),
    items: Schema.optional(Schema.Array(Item)),
    mode: Schema.optional(Schema.Literal("fast", "slow"))
  }),
  response: Schema.Struct({ count: Schema.Int, done: Schema.Boolean }),
  example: { from: 3, items: [{ label: "start", at: "2026-01-01T00:00:00.000Z" }] },
  serve: async function* ({ from }) {
    for (let count = from; count > 0; count--) yield { count, done: count === 1 }
  }
})

/** Another `Item`, unlike countdown's: the platform's document must keep both. */
const inventory = defineApp({
  tasks: {},
  request: Schema.Struct({ item: Schema.Struct({ sku: Schema.Number }).annotations({ identifier: "Item" }) }),
  example: { item: { sku: 7 } },
  serve: () => ({})
})

/** A request JSON Schema cannot express (bytes in memory): described by a note, and the app still loads. */
const bytes = defineApp({
  tasks: {},
  request: Schema.Struct({ data: Schema.Uint8ArrayFromSelf }),
  extraFields: "drop",
  serve: () => ({})
})

describe("OpenAPI documents of apps", () => {
  it("describes an app's invoke route with its schemas and example, valid OpenAPI 3.1", async () => {
    const document = appDocument(described("hello", hello))
    expect(await openApiProblem(document)).toBeUndefined()
    const { schema, example } = requestOf(document, "/app/invoke/hello")
    expect(example).toEqual({ name: "Ada" })
    expect(schemaErrors(document, schema, example)).toEqual([])
    expect(schemaErrors(document, schema, { name: "" }).join()).toContain("must NOT have fewer than 1 characters")
    expect(schemaErrors(document, schema, { name: "Ada", extra: 1 }).join()).toContain("additional properties")
    const answer = (document as JsonDocument).paths["/app/invoke/hello"].post.responses["200"].content
    expect(answer["application/json"].schema.properties.greeting).toEqual({ type: "string" })
    expect((document as JsonDocument).info.description).toBe("Greets whoever it is asked to greet.")
    expect((document as JsonDocument).paths["/app/invoke/hello"].post.responses["422"]).toBeDefined()
  })

  it("documents OpenAI's routes for an app that takes the SDK's chat request, by reference", async () => {
    const document: JsonDocument = appDocument(described("color_chat", chat))
    expect(await openApiProblem(document)).toBeUndefined()
    expect(Object.keys(document.paths).sort()).toEqual([
      "/app/color_chat/v1/chat/completions",
      "/app/color_chat/v1/completions",
      "/app/color_chat/v1/models",
      "/app/color_chat/v1/models/{model}",
      "/app/invoke/color_chat"
    ])
    const { schema, example } = requestOf(document, "/app/invoke/color_chat")
    expect(schema).toEqual({ $ref: "#/components/schemas/ChatCompletionRequest" })
    expect(schemaErrors(document, schema, example)).toEqual([])
    expect(schemaErrors(document, schema, { messages: [] })).not.toEqual([])
    const chatAnswer = document.paths["/app/color_chat/v1/chat/completions"].post.responses["200"].content
    expect(Object.keys(chatAnswer)).toEqual(["application/json", "text/event-stream"])
    expect(chatAnswer["application/json"].schema).toEqual({ $ref: "#/components/schemas/ChatCompletion" })
    const completions = document.paths["/app/color_chat/v1/completions"].post.requestBody.content["application/json"]
    expect(schemaErrors(document, completions.schema, { prompt: "Once upon a time", max_tokens: 4 })).toEqual([])
    expect(schemaErrors(document, completions.schema, { max_tokens: 4 })).not.toEqual([])
    // Any JSON: the app declares no response schema.
    expect(Object.keys(document.paths["/app/invoke/color_chat"].post.responses["200"].content)).toEqual([
      "application/json",
      "application/x-ndjson"
    ])
  })

  it("documents OpenAI's embeddings route for an app that takes the SDK's embeddings request", async () => {
    const embedder = defineApp({
      tasks: {},
      request: EmbeddingRequest,
      response: EmbeddingResponse,
      serve: () => ({ object: "list" as const, data: [], model: "m", usage: { prompt_tokens: 0, total_tokens: 0 } })
    })
    const document: JsonDocument = appDocument(described("embed", embedder))
    expect(await openApiProblem(document)).toBeUndefined()
    expect(Object.keys(document.paths).sort()).toEqual(["/app/embed/v1/embeddings", "/app/invoke/embed"])
    const request = document.paths["/app/embed/v1/embeddings"].post.requestBody.content["application/json"]
    expect(schemaErrors(document, request.schema, { input: ["a", "b"], encoding_format: "base64" })).toEqual([])
    expect(schemaErrors(document, request.schema, { encoding_format: "float" })).not.toEqual([])
  })

  it("describes a streaming app's answer as NDJSON only, and its named parts as components", async () => {
    const document: JsonDocument = appDocument(described("countdown", countdown))
    expect(await openApiProblem(document)).toBeUndefined()
    const operation = document.paths["/app/invoke/countdown"].post
    expect(Object.keys(operation.responses["200"].content)).toEqual(["application/x-ndjson"])
    expect(document.components.schemas.Item).toBeDefined()
    const { schema, example } = requestOf(document, "/app/invoke/countdown")
    expect(schemaErrors(document, schema, example)).toEqual([])
    // The request is what the client sends: the Date as a string.
    expect(schemaErrors(document, schema, { from: 3, items: [{ label: "x", at: 5 }] }).join()).toContain("string")
  })

  it("describes a schema JSON Schema cannot express by a note, and keeps extra fields open for extraFields: drop", async () => {
    const document: JsonDocument = appDocument(described("bytes", bytes))
    expect(await openApiProblem(document)).toBeUndefined()
    const { schema } = requestOf(document, "/app/invoke/bytes")
    expect(schema.description).toMatch(/no JSON Schema form.*Uint8ArrayFromSelf/)
    const open = schemasOf(
      defineApp({ tasks: {}, request: Schema.Struct({ a: Schema.String }), extraFields: "drop", serve: () => ({}) })
    )
    expect(open.request).not.toHaveProperty("additionalProperties", false)
  })

  it("names the platform's routes and every app's, keeping two apps' different schemas of one name apart", async () => {
    const document: JsonDocument = platformDocument(
      [
        described("hello", hello),
        described("color_chat", chat, true),
        described("countdown", countdown),
        described("inventory", inventory),
        { id: "starting", why: "The app is registering.", needsApiKey: false }
      ],
      { adminToken: true, metricsToken: true }
    )
    expect(await openApiProblem(document)).toBeUndefined()
    for (const path of [
      "/app/register",
      "/app/list",
      "/tasks/list",
      "/task/scale",
      "/health",
      "/metrics",
      "/openapi.json"
    ])
      expect(document.paths[path], path).toBeDefined()
    expect(document.paths["/app/register"].post.security).toEqual([{ adminToken: [] }])
    expect(document.paths["/app/list"].get.security).toBeUndefined()
    expect(document.paths["/app/invoke/color_chat"].post.security).toEqual([{ apiKey: [] }])
    expect(document.paths["/app/invoke/hello"].post.security).toBeUndefined()
    expect(document.paths["/app/invoke/starting"].post.description).toBe("The app is registering.")
    // countdown's Item and inventory's differ: each app's refers to its own.
    const countdownItems = requestOf(document, "/app/invoke/countdown").schema.properties.items.items.$ref
    const inventoryItem = requestOf(document, "/app/invoke/inventory").schema.properties.item.$ref
    expect(countdownItems).not.toBe(inventoryItem)
    for (const app of ["hello", "color_chat", "countdown", "inventory"]) {
      const { schema, example } = requestOf(document, `/app/invoke/${app}`)
      expect(schemaErrors(document, schema, example), app).toEqual([])
    }
    expect(
      schemaErrors(document, requestOf(document, "/app/invoke/inventory").schema, { item: { sku: "x" } })
    ).not.toEqual([])
  })

  it("describes the platform's routes without tokens when it runs without them", async () => {
    const document: JsonDocument = platformDocument([], { adminToken: false, metricsToken: false })
    expect(await openApiProblem(document)).toBeUndefined()
    expect(document.paths["/app/register"].post.security).toBeUndefined()
    expect(document.paths["/metrics"].get.security).toBeUndefined()
  })
})

const wire = (json: string) => ({ json, streams: false })

describe("the schemas a hostile app's process sends", () => {
  it("are cleaned: no outside reference, no unknown keyword, no reference hidden in data, yet a valid document", async () => {
    const sent = {
      request: {
        $id: "https://evil.example/",
        type: "object",
        properties: {
          a: { $ref: "https://evil.example/schema.json" },
          b: { $ref: "#/$defs/Good" },
          ["__proto__"]: { type: "string" },
          c: { enum: [{ $ref: "https://evil.example/x" }], minLength: -1, type: "bogus", "x-evil": { $ref: "#/" } },
          d: { default: { $ref: "https://evil.example/y" }, description: 5, required: "a", anyOf: "nope" }
        },
        required: ["a"]
      },
      $defs: { Good: { type: "integer" }, "bad name/with~chars": { type: "string" } }
    }
    const read = readAppSchemas(wire(JSON.stringify(sent)))
    if (typeof read === "string") throw new Error(read)
    expect(read.request).toEqual({
      type: "object",
      properties: {
        a: {},
        b: { $ref: "#/$defs/Good" },
        ["__proto__"]: { type: "string" },
        c: {},
        d: {}
      },
      required: ["a"]
    })
    expect([...read.defs.keys()]).toEqual(["Good", "bad_name_with_chars"])
    expect(Object.getPrototypeOf(read.request)).toBe(null)
    const document = appDocument({
      id: "hostile",
      description: undefined,
      example: { $ref: "https://evil.example/example" },
      schemas: read,
      needsApiKey: false,
      registeredAt: "now"
    })
    expect(await openApiProblem(document)).toBeUndefined()
    expect(JSON.stringify(document)).not.toContain("evil.example")
  })

  it("are refused when over the bounds: too large by the protocol's schema, too deep or not JSON by the reader", () => {
    const loaded = (json: string) =>
      Schema.decodeUnknownEither(FromApp)({ t: "loaded", tasks: [], example: null, schemas: wire(json) })
    expect(Either.isLeft(loaded(`{"request":{"description":"${"x".repeat(maxSchemasChars)}"}}`))).toBe(true)
    expect(Either.isRight(loaded('{"request":{}}'))).toBe(true)
    const deep = `{"request":${'{"not":'.repeat(maxSchemasDepth + 1)}{}${"}".repeat(maxSchemasDepth + 1)}}`
    expect(readAppSchemas(wire(deep))).toMatch(/deeper than the limit/)
    expect(readAppSchemas(wire("{"))).toMatch(/not JSON/)
    expect(readAppSchemas(wire("[1]"))).toMatch(/not an object/)
  })

  it("an app whose schemas are too large to send sends a note instead, and still loads", () => {
    const many = Schema.Struct(
      Object.fromEntries(
        Array.from({ length: 5000 }, (_, index) => [`field_${index}_${"x".repeat(40)}`, Schema.String])
      )
    )
    const sent = appSchemasOf(defineApp({ tasks: {}, request: many, serve: () => ({}) }))
    expect(sent.json.length).toBeLessThan(maxSchemasChars)
    const read = readAppSchemas(sent)
    if (typeof read === "string") throw new Error(read)
    expect((read.request as { description: string }).description).toMatch(/over the limit/)
  })
})
