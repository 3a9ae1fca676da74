/**
 * OpenAPI 3.1 documents: one per app (`GET /app/:id/openapi.json`: its invoke route with the app's
 * request and response schemas and example, and OpenAI's routes for an app that takes OpenAI chat
 * requests) and the platform's (`GET /openapi.json`: its own routes and every app's). Pure: the
 * gateway hands in what it knows of the apps and of who asks.
 */
import { readFileSync } from "node:fs"
import * as JSONSchema from "effect/JSONSchema"
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
import { RecordRequest } from "../task-manager/ProfileRecording.js"
import {
  AppList,
  DetailedErrorAnswer,
  HealthAnswer,
  NodeList,
  ReadyAnswer,
  RegisterRequest,
  ScaleAnswer,
  ScaleRequest,
  TaskList,
  TaskProfileAnswer,
  UnregisterAnswer
} from "./GatewayAnswers.js"

/** An OpenAPI document, as JSON. */
export type OpenApiDocument = { readonly openapi: string } & { readonly [field: string]: unknown }

/** An app whose schemas the document shows. */
export type DescribedApp = AppDescription<AppSchemas>

export type { PlatformAuth, UndescribedApp }

const schemasPrefix = "#/components/schemas/"
const ref = (name: string) => ({ $ref: `${schemasPrefix}${name}` })

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
  add("RegisterRequest", RegisterRequest, "strict")
  add("UnregisterAnswer", UnregisterAnswer, "allow")
  add("AppList", AppList, "allow")
  add("TaskList", TaskList, "allow")
  add("NodeList", NodeList, "allow")
  add("ScaleRequest", ScaleRequest, "strict")
  add("ScaleAnswer", ScaleAnswer, "allow")
  add("TaskProfileAnswer", TaskProfileAnswer, "allow")
  add("RecordRequest", RecordRequest, "strict")
  add("HealthAnswer", HealthAnswer, "allow")
  add("ReadyAnswer", ReadyAnswer, "allow")
  add("ChatCompletion", ChatCompletion, "allow")
  add("ChatCompletionChunk", ChatCompletionChunk, "allow")
  add("CompletionRequest", CompletionRequest, "strict")
  add("TextCompletion", TextCompletion, "allow")
  add("ModelObject", ModelObject, "allow")
  add("ModelList", ModelList, "allow")
  for (const [name, schema] of Object.entries(definitions)) if (!named.has(name)) named.set(name, schema)
  const keep = (target: string) =>
    target.startsWith(schemasPrefix) && named.has(target.slice(schemasPrefix.length)) ? target : undefined
  return new Map([...named].map(([name, schema]) => [name, cleanSchema(schema, keep)]))
})()

// ---- Operations ----

const errorContent = { "application/json": { schema: ref("ErrorAnswer") } }
const retryAfter = {
  "Retry-After": { description: "Seconds to wait before trying again.", schema: { type: "integer" } }
}
const failure = (description: string, retry = false) => ({
  description,
  content: errorContent,
  ...(retry ? { headers: retryAfter } : {})
})

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

const apiKeySecurity = (needsApiKey: boolean) => (needsApiKey ? { security: [{ apiKey: [] }] } : {})

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

const appTag = (id: string) => `app ${id}`

/** The request schema of an app that takes OpenAI chat requests, as its process describes `ChatCompletionRequest`. */
const chatRequestRef = `${defsRefPrefix}ChatCompletionRequest`

/** Whether an app takes OpenAI's chat requests as they are: its request schema is the SDK's `ChatCompletionRequest`. */
export const takesChatRequests = (schemas: AppSchemas): boolean =>
  typeof schemas.request === "object" &&
  schemas.request.$ref === chatRequestRef &&
  Object.keys(schemas.request).length === 1 &&
  schemas.defs.has("ChatCompletionRequest")

/** Whether an app takes OpenAI's embeddings requests: its request schema is the SDK's `EmbeddingRequest`. */
/**
 * The failures every OpenAI route of an app answers, with the route's own 400 (and any other
 * answers it adds, such as an upload's 403 and 413).
 */
const openAiRouteFailures = (app: DescribedApp, badRequest: string, more: Record<string, unknown> = {}) => ({
  "400": failure(badRequest),
  ...(app.needsApiKey ? { "401": failure("No API key, or not one this app takes.") } : {}),
  "404": failure("No app has this id, or the request names a model the app does not serve."),
  ...more,
  "422": failure("The request does not match the app's request schema."),
  "429": failure("The app runs and queues as many requests as its admission settings allow.", true),
  "503": failure("The app is not ready, or a task has no executor free.", true)
})

export const takesEmbeddingRequests = (schemas: AppSchemas): boolean =>
  typeof schemas.request === "object" &&
  schemas.request.$ref === `${defsRefPrefix}EmbeddingRequest` &&
  Object.keys(schemas.request).length === 1 &&
  schemas.defs.has("EmbeddingRequest")

/** OpenAI's embeddings route on an embeddings app. */
const embeddingsPaths = (app: DescribedApp, rename: (ref: string) => string | undefined) => ({
  [`/app/${app.id}/v1/embeddings`]: {
    post: {
      operationId: `embeddings_${app.id}`,
      tags: [appTag(app.id)],
      summary: `OpenAI embeddings from ${app.id}`,
      ...apiKeySecurity(app.needsApiKey),
      requestBody: {
        required: true,
        content: { "application/json": { schema: cleanSchema(app.schemas.request, rename) } }
      },
      responses: {
        "200": {
          description: "One vector per input, in the input's order.",
          content: {
            "application/json": {
              schema: app.schemas.response === undefined ? {} : cleanSchema(app.schemas.response, rename)
            }
          }
        },
        ...openAiRouteFailures(app, "An input is empty, too long, or the request asks for what the model cannot do.")
      }
    }
  }
})

/** Whether an app takes OpenAI's transcription requests: its request schema is the SDK's `TranscriptionRequest`. */
export const takesTranscriptionRequests = (schemas: AppSchemas): boolean =>
  typeof schemas.request === "object" &&
  schemas.request.$ref === `${defsRefPrefix}TranscriptionRequest` &&
  Object.keys(schemas.request).length === 1 &&
  schemas.defs.has("TranscriptionRequest")

/** OpenAI's transcriptions and translations routes on a transcriptions app: a multipart upload, or the JSON request with the audio's URL. */
const transcriptionPaths = (app: DescribedApp, rename: (ref: string) => string | undefined) => {
  const json = cleanSchema(app.schemas.request, rename)
  const form = {
    type: "object",
    required: ["file"],
    properties: {
      file: { type: "string", format: "binary", description: "The audio: wav, mp3, ogg, flac, m4a or webm." },
      model: { type: "string" },
      language: { type: "string", description: 'The spoken language, as a code ("en") or name.' },
      response_format: { type: "string", enum: ["json", "text", "verbose_json", "srt", "vtt"] },
      temperature: { type: "number", description: "Only 0 (greedy) is implemented." },
      "timestamp_granularities[]": { type: "array", items: { type: "string", enum: ["segment"] } },
      chunk_length_s: { type: "number", description: "Windows long audio is cut in, from 1 to 30 s." },
      stride_length_s: { type: "number", description: "Overlap on each side of a window, at most 3/8 of it." },
      task: { type: "string", enum: ["transcribe", "translate"] }
    }
  }
  const operation = (route: "transcriptions" | "translations") => ({
    post: {
      operationId: `${route}_${app.id}`,
      tags: [appTag(app.id)],
      summary:
        route === "transcriptions"
          ? `OpenAI audio transcriptions from ${app.id}`
          : `OpenAI audio translations (into English) from ${app.id}`,
      ...apiKeySecurity(app.needsApiKey),
      requestBody: {
        required: true,
        content: { "multipart/form-data": { schema: form }, "application/json": { schema: json } }
      },
      responses: {
        "200": {
          description:
            "The transcript: `{ text }` (json), the text (text), the whole Transcription (verbose_json), or subtitles (srt, vtt).",
          content: {
            "application/json": {
              schema: app.schemas.response === undefined ? {} : cleanSchema(app.schemas.response, rename)
            },
            "text/plain": { schema: { type: "string" } }
          }
        },
        ...openAiRouteFailures(app, "The audio is unreadable, or the request asks for what the model cannot do.", {
          "403": failure("A form posted from a page of another site."),
          "413": failure("The upload is larger than the gateway takes.")
        })
      }
    }
  })
  return {
    [`/app/${app.id}/v1/audio/transcriptions`]: operation("transcriptions"),
    [`/app/${app.id}/v1/audio/translations`]: operation("translations")
  }
}

/** Whether an app takes OpenAI's speech requests: its request schema is the SDK's `SpeechRequest`. */
export const takesSpeechRequests = (schemas: AppSchemas): boolean =>
  typeof schemas.request === "object" &&
  schemas.request.$ref === `${defsRefPrefix}SpeechRequest` &&
  Object.keys(schemas.request).length === 1 &&
  schemas.defs.has("SpeechRequest")

const audioTypes = {
  mp3: "audio/mpeg",
  opus: "audio/ogg",
  aac: "audio/aac",
  flac: "audio/flac",
  wav: "audio/wav",
  pcm: "audio/pcm"
} as const

/** OpenAI's speech route on a speech app: the request as JSON, the audio streamed in the format asked for. */
const speechPaths = (app: DescribedApp, rename: (ref: string) => string | undefined) => ({
  [`/app/${app.id}/v1/audio/speech`]: {
    post: {
      operationId: `speech_${app.id}`,
      tags: [appTag(app.id)],
      summary: `OpenAI audio speech from ${app.id}`,
      ...apiKeySecurity(app.needsApiKey),
      requestBody: {
        required: true,
        content: { "application/json": { schema: cleanSchema(app.schemas.request, rename) } }
      },
      responses: {
        "200": {
          description:
            "The audio, streamed as it is spoken, in `response_format` (mp3 by default; pcm is 24 kHz PCM16), or with `stream_format: sse` events `speech.audio.delta` of base64 audio and a last `speech.audio.done`.",
          content: {
            ...Object.fromEntries(
              Object.values(audioTypes).map((type) => [type, { schema: { type: "string", format: "binary" } }])
            ),
            "text/event-stream": { schema: { type: "string" } }
          }
        },
        ...openAiRouteFailures(
          app,
          "The request asks for what the model cannot do: an unknown voice, a speed other than 1, a text too long."
        )
      }
    }
  }
})

/** Whether an app takes OpenAI's image generation requests: its request schema is the SDK's `ImageGenerationRequest`. */
export const takesImageRequests = (schemas: AppSchemas): boolean =>
  typeof schemas.request === "object" &&
  schemas.request.$ref === `${defsRefPrefix}ImageGenerationRequest` &&
  Object.keys(schemas.request).length === 1 &&
  schemas.defs.has("ImageGenerationRequest")

/** OpenAI's image generations route on an images app. */
const imagesPaths = (app: DescribedApp, rename: (ref: string) => string | undefined) => ({
  [`/app/${app.id}/v1/images/generations`]: {
    post: {
      operationId: `images_${app.id}`,
      tags: [appTag(app.id)],
      summary: `OpenAI image generations from ${app.id}`,
      ...apiKeySecurity(app.needsApiKey),
      requestBody: {
        required: true,
        content: { "application/json": { schema: cleanSchema(app.schemas.request, rename) } }
      },
      responses: {
        "200": {
          description: "The images, base64 PNGs (`b64_json`).",
          content: {
            "application/json": {
              schema: app.schemas.response === undefined ? {} : cleanSchema(app.schemas.response, rename)
            }
          }
        },
        ...openAiRouteFailures(
          app,
          "The request asks for what the platform does not do: a url answer, streamed partial images."
        )
      }
    }
  }
})

/** OpenAI's routes on a chat app: chat completions, legacy completions, models. */
const openAiPaths = (app: DescribedApp, rename: (ref: string) => string | undefined) => {
  const security = apiKeySecurity(app.needsApiKey)
  const tags = [appTag(app.id)]
  const openAiFailures = openAiRouteFailures(
    app,
    "The request is not one OpenAI's API takes, or a task refused an input it made."
  )
  const showsExample = app.example !== undefined && !holdsRef(app.example)
  return {
    [`/app/${app.id}/v1/chat/completions`]: {
      post: {
        operationId: `chat_${app.id}`,
        tags,
        summary: `OpenAI chat completions from ${app.id}`,
        ...security,
        requestBody: {
          required: true,
          content: {
            "application/json": {
              schema: cleanSchema(app.schemas.request, rename),
              ...(showsExample ? { example: app.example } : {})
            }
          }
        },
        responses: {
          "200": {
            description:
              'One `chat.completion`, or with `"stream": true` Server-Sent Events: `data: ` and a `chat.completion.chunk` (ChatCompletionChunk) each, then `data: [DONE]`.',
            content: {
              "application/json": { schema: ref("ChatCompletion") },
              "text/event-stream": {
                schema: { type: "string", description: "`data: {ChatCompletionChunk}` events, then `data: [DONE]`." }
              }
            }
          },
          ...openAiFailures
        }
      }
    },
    [`/app/${app.id}/v1/completions`]: {
      post: {
        operationId: `completions_${app.id}`,
        tags,
        summary: `OpenAI (legacy) completions from ${app.id}`,
        description: "The prompt goes to the app as a chat request; the answer is the text it generates.",
        ...security,
        requestBody: { required: true, content: { "application/json": { schema: ref("CompletionRequest") } } },
        responses: {
          "200": {
            description:
              'One `text_completion`, or with `"stream": true` Server-Sent Events: `data: ` and a `text_completion` chunk each, then `data: [DONE]`.',
            content: {
              "application/json": { schema: ref("TextCompletion") },
              "text/event-stream": {
                schema: { type: "string", description: "`data: {TextCompletion}` events, then `data: [DONE]`." }
              }
            }
          },
          ...openAiFailures
        }
      }
    },
    [`/app/${app.id}/v1/models`]: {
      get: {
        operationId: `models_${app.id}`,
        tags,
        summary: `The models ${app.id} serves`,
        ...security,
        responses: {
          "200": {
            description: "The models of the app's tasks.",
            content: { "application/json": { schema: ref("ModelList") } }
          },
          ...(app.needsApiKey ? { "401": failure("No API key, or not one this app takes.") } : {}),
          "404": failure("No app has this id.")
        }
      }
    },
    [`/app/${app.id}/v1/models/{model}`]: {
      get: {
        operationId: `model_${app.id}`,
        tags,
        summary: `A model ${app.id} serves`,
        ...security,
        parameters: [
          { name: "model", in: "path", required: true, schema: { type: "string" }, description: "The model's id." }
        ],
        responses: {
          "200": { description: "The model.", content: { "application/json": { schema: ref("ModelObject") } } },
          ...(app.needsApiKey ? { "401": failure("No API key, or not one this app takes.") } : {}),
          "404": failure("No app has this id, or the app does not serve this model (`model_not_found`).")
        }
      }
    }
  }
}

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
    ...(takesChatRequests(app.schemas) ? openAiPaths(app, rename) : {}),
    ...(takesEmbeddingRequests(app.schemas) ? embeddingsPaths(app, rename) : {}),
    ...(takesTranscriptionRequests(app.schemas) ? transcriptionPaths(app, rename) : {}),
    ...(takesSpeechRequests(app.schemas) ? speechPaths(app, rename) : {}),
    ...(takesImageRequests(app.schemas) ? imagesPaths(app, rename) : {})
  }
  return { paths, schemas }
}

const securitySchemes = {
  apiKey: {
    type: "http",
    scheme: "bearer",
    description:
      "An API key: the platform's (`serve --api-key`, CORNSERVE_API_KEY), one the app's registration set (`app register --api-key`), or the admin token."
  },
  adminToken: {
    type: "http",
    scheme: "bearer",
    description: "The platform's admin token (CORNSERVE_ADMIN_TOKEN, or the `admin-token` file of its state dir)."
  },
  metricsToken: {
    type: "http",
    scheme: "bearer",
    description: "CORNSERVE_METRICS_TOKEN, or the admin token."
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

const json = (schema: unknown) => ({ "application/json": { schema } })
const eventStream = (description: string) => ({ "text/event-stream": { schema: { type: "string", description } } })
const idParameter = (what: string) => ({
  name: "id",
  in: "path",
  required: true,
  schema: { type: "string" },
  description: what
})

/** The platform's own routes (the gateway's router), for whom each wants. */
const platformPaths = (auth: PlatformAuth) => {
  const admin = auth.adminToken ? { security: [{ adminToken: [] }] } : {}
  const adminFailures = {
    ...(auth.adminToken ? { "401": failure("No admin token, or a wrong one.") } : {}),
    "403": failure(
      "A request from a browser page: an admin request must name this server in Host, come from no other origin, and be `application/json`."
    )
  }
  const sse = (events: string) => ({ description: events, content: eventStream(events) })
  return {
    "/app/register": {
      post: {
        operationId: "registerApp",
        tags: ["apps"],
        summary: "Register an app (its TypeScript source, bundled)",
        ...admin,
        requestBody: { required: true, content: json(ref("RegisterRequest")) },
        responses: {
          "200": sse(
            "Server-Sent Events: `progress` (`{ message }`) as the app loads and its tasks deploy, then `final` (`{ message, app }`) or `error` (an error answer)."
          ),
          "400": failure(
            "The body is malformed, or the app does not compile, imports what it may not, or fails to load."
          ),
          ...adminFailures,
          "409": failure(
            "An app by this name is registered (`AppNameTaken`): unregister it, or register with `replace`."
          )
        }
      }
    },
    "/app/unregister/{id}": {
      post: {
        operationId: "unregisterApp",
        tags: ["apps"],
        summary: "Unregister an app once its requests in flight finish",
        ...admin,
        parameters: [idParameter("The app's id.")],
        responses: {
          "200": { description: "The app is unregistered.", content: json(ref("UnregisterAnswer")) },
          ...adminFailures,
          "404": failure("No app has this id.")
        }
      }
    },
    "/app/list": {
      get: {
        operationId: "listApps",
        tags: ["apps"],
        summary: "The registered apps and their states",
        responses: { "200": { description: "The apps.", content: json(ref("AppList")) } }
      }
    },
    "/app/logs/{id}": {
      get: {
        operationId: "appLogs",
        tags: ["apps"],
        summary: "What an app wrote to its stdout and stderr (the last 64 KiB)",
        ...admin,
        parameters: [
          idParameter("The app's id."),
          {
            name: "follow",
            in: "query",
            required: false,
            schema: { type: "string", enum: ["1", "true"] },
            description: "Keep the answer open and write each line as the app writes it."
          }
        ],
        responses: {
          "200": { description: "The app's log.", content: { "text/plain": { schema: { type: "string" } } } },
          ...(auth.adminToken ? { "401": failure("No admin token, or a wrong one.") } : {}),
          "404": failure("No app has this id.")
        }
      }
    },
    "/app/{id}/openapi.json": {
      get: {
        operationId: "appDocument",
        tags: ["apps"],
        summary: "An app's OpenAPI document",
        description: "With API keys set, it wants one the app's invoke route takes.",
        parameters: [idParameter("The app's id.")],
        responses: {
          "200": { description: "An OpenAPI 3.1 document.", content: json({ type: "object" }) },
          "401": failure("The app's routes want an API key, and none (or a wrong one) came."),
          "404": failure("No app has this id."),
          "503": failure("The app is not ready.", true)
        }
      }
    },
    "/tasks/list": {
      get: {
        operationId: "listTasks",
        tags: ["tasks"],
        summary: "The deployed unit tasks and the devices",
        responses: { "200": { description: "The tasks and devices.", content: json(ref("TaskList")) } }
      }
    },
    "/nodes/list": {
      get: {
        operationId: "listNodes",
        tags: ["tasks"],
        summary: "The nodes of the cluster and their devices",
        responses: { "200": { description: "The nodes.", content: json(ref("NodeList")) } }
      }
    },
    "/task/scale": {
      post: {
        operationId: "scaleTask",
        tags: ["tasks"],
        summary: "Add devices to a task (a positive count) or take them away (a negative one)",
        ...admin,
        requestBody: { required: true, content: json(ref("ScaleRequest")) },
        responses: {
          "200": { description: "The tasks once scaled.", content: json(ref("ScaleAnswer")) },
          "400": failure("The body is malformed."),
          ...adminFailures,
          "404": failure("No task has this id."),
          "503": failure("No device is free for another executor.", true)
        }
      }
    },
    "/tasks/{id}/profile": {
      get: {
        operationId: "taskProfile",
        tags: ["tasks"],
        summary: "What a task's calls measured, and its profile recorded ahead of time",
        parameters: [idParameter("The task's id.")],
        responses: {
          "200": { description: "The task's profile.", content: json(ref("TaskProfileAnswer")) },
          "404": failure("No task has this id.")
        }
      }
    },
    "/tasks/{id}/profile/record": {
      post: {
        operationId: "recordTaskProfile",
        tags: ["tasks"],
        summary: "Record a task's profile: a sweep of load levels against its executors",
        ...admin,
        parameters: [idParameter("The task's id.")],
        requestBody: { required: true, content: json(ref("RecordRequest")) },
        responses: {
          "200": sse(
            "Server-Sent Events: `started`, `progress` as each load level ends, then `final` with the recorded profile, or `error`."
          ),
          "400": failure("The body is malformed."),
          ...adminFailures,
          "404": failure("No task has this id."),
          "409": failure("The task is being recorded already.")
        }
      }
    },
    "/health": {
      get: {
        operationId: "health",
        tags: ["platform"],
        summary: "Liveness",
        responses: {
          "200": { description: "The platform runs.", content: json(ref("HealthAnswer")) },
          "503": { description: "The platform shuts down.", content: json(ref("HealthAnswer")) }
        }
      }
    },
    "/ready": {
      get: {
        operationId: "ready",
        tags: ["platform"],
        summary: "Readiness: the apps of the state dir are back",
        responses: {
          "200": { description: "Ready.", content: json(ref("ReadyAnswer")) },
          "503": { description: "Starting, or shutting down.", content: json(ref("ReadyAnswer")) }
        }
      }
    },
    "/metrics": {
      get: {
        operationId: "metrics",
        tags: ["platform"],
        summary: "Prometheus metrics",
        ...(auth.metricsToken ? { security: [{ metricsToken: [] }] } : {}),
        responses: {
          "200": {
            description: "The metrics in Prometheus's text format.",
            content: { "text/plain": { schema: { type: "string" } } }
          },
          ...(auth.metricsToken ? { "401": failure("No metrics token, or a wrong one.") } : {})
        }
      }
    },
    "/openapi.json": {
      get: {
        operationId: "platformDocument",
        tags: ["platform"],
        summary: "This document",
        responses: { "200": { description: "An OpenAPI 3.1 document.", content: json({ type: "object" }) } }
      }
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
  const tags: Array<{ readonly name: string; readonly description?: string }> = [
    { name: "apps", description: "Registering, listing and describing apps." },
    { name: "tasks", description: "The deployed unit tasks, their devices and profiles." },
    { name: "platform", description: "Health, readiness, metrics." }
  ]
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
