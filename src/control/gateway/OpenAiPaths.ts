/**
 * OpenAI's routes in an app's OpenAPI document: which routes an app takes, read from its request
 * schema (the SDK's `ChatCompletionRequest`, `EmbeddingRequest`, ...), and each route's operation.
 * `openAiRoutes` is the one list `OpenApi.ts` reads.
 */
import type { AppSchemas } from "../../app-runtime/driver/AppSchemas.js"
import { cleanSchema, defsRefPrefix, holdsRef } from "../../app-runtime/driver/AppSchemas.js"
import type { AppDescription } from "../AppDescriptions.js"
import { openAiPath } from "./OpenAiRoutes.js"
import { apiKeySecurity, appTag, failure, ref } from "./OpenApiParts.js"

type DescribedApp = AppDescription<AppSchemas>
type Rename = (ref: string) => string | undefined

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
  [openAiPath("embeddings", app.id)]: {
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
    [openAiPath("transcriptions", app.id)]: operation("transcriptions"),
    [openAiPath("translations", app.id)]: operation("translations")
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
  [openAiPath("speech", app.id)]: {
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
  [openAiPath("images", app.id)]: {
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
    [openAiPath("chat", app.id)]: {
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
    [openAiPath("completions", app.id)]: {
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
    [openAiPath("models", app.id)]: {
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
    [`${openAiPath("models", app.id)}/{model}`]: {
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

/** OpenAI's routes, by the request an app takes: an app's document holds those whose `takes` holds. */
export const openAiRoutes: ReadonlyArray<{
  readonly takes: (schemas: AppSchemas) => boolean
  readonly paths: (app: DescribedApp, rename: Rename) => Record<string, unknown>
}> = [
  { takes: takesChatRequests, paths: openAiPaths },
  { takes: takesEmbeddingRequests, paths: embeddingsPaths },
  { takes: takesTranscriptionRequests, paths: transcriptionPaths },
  { takes: takesSpeechRequests, paths: speechPaths },
  { takes: takesImageRequests, paths: imagesPaths }
]
