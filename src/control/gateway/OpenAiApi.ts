/**
 * OpenAI's API on every app (`/app/:id/v1/...`): chat completions, legacy completions, embeddings,
 * audio transcriptions and translations (TranscriptionsApi.ts), audio speech (SpeechApi.ts), image
 * generations (ImagesApi.ts) and models. An app serves OpenAI's requests through its own `serve`: the gateway checks a
 * request's parameters and model, hands a completions request to the app as a chat request whose
 * `cornserve_prompt` carries the prompt, and writes the app's chat-completion chunks the way the
 * route's client expects them (OpenAiReplies.ts).
 */
import type { ServerResponse } from "node:http"
import * as Either from "effect/Either"
import * as Schema from "effect/Schema"
import { ChatCompletionRequest, CompletionRequest } from "../../app-runtime/schemas/OpenAI.js"
import { ImageGenerationRequest } from "../../app-runtime/schemas/Images.js"
import { SpeechRequest } from "../../app-runtime/schemas/Speech.js"
import { TranscriptionRequest } from "../../app-runtime/schemas/Transcriptions.js"
import { issueLines, readableIssues } from "../../app-runtime/SchemaIssues.js"
import { shortened } from "../../app-runtime/Shortened.js"
import { type OpenAiRoute, openAiRouteAt, openAiRoutes } from "./OpenAiRoutes.js"
import { errorCodes, writeJson } from "./ReplyFormat.js"

export type { OpenAiRoute }

const pathPattern = /^\/app\/([^/]+)\/v1\/(.+)$/

/** An OpenAI route's app (its id still percent-encoded) and route, from a request's method and path. */
export const matchOpenAiRoute = (
  method: string | undefined,
  path: string
):
  | { readonly appId: string; readonly route: OpenAiRoute }
  | { readonly appId: string; readonly route: "models"; readonly model: string | undefined }
  | undefined => {
  const match = pathPattern.exec(path)
  if (match === null) return undefined
  const [, appId, rest] = match as unknown as [string, string, string]
  const models = /^models(?:\/([^/]+))?$/.exec(rest)
  if (models !== null) return method === "GET" ? { appId, route: "models", model: models[1] } : undefined
  const route = openAiRouteAt(rest)
  return route === undefined || method !== "POST" ? undefined : { appId, route }
}

/** An answer in OpenAI's error shape (`{ error: { message, type, param, code } }`), for the checks OpenAI's clients know. */
export interface OpenAiRefusal {
  readonly status: number
  readonly message: string
  readonly param: string | null
  readonly code: string
}

export const sendRefusal = (response: ServerResponse, refusal: OpenAiRefusal) => {
  errorCodes.set(response, refusal.code)
  writeJson(
    response,
    JSON.stringify({
      error: {
        message: refusal.message,
        type: "invalid_request_error",
        param: refusal.param,
        code: refusal.code
      }
    }),
    refusal.status
  )
}

const modelNotFound = (model: string, models: ReadonlyArray<string>): OpenAiRefusal => ({
  status: 404,
  message: `The model \`${shortened(model, 200)}\` does not exist here: this app serves ${models.map((name) => `\`${name}\``).join(", ")}`,
  param: "model",
  code: "model_not_found"
})

/** `GET /app/:id/v1/models` and `/v1/models/:model`: the models an app's LLM tasks serve. */
export const modelsAnswer = (
  models: ReadonlyArray<string>,
  created: number,
  asked: string | undefined
): { readonly json: string } | { readonly refusal: OpenAiRefusal } => {
  const objects = models.map((id) => ({ id, object: "model", created, owned_by: "cornserve" }))
  if (asked === undefined) return { json: JSON.stringify({ object: "list", data: objects }) }
  let name: string
  try {
    name = decodeURIComponent(asked)
  } catch {
    name = asked
  }
  const found = objects.find((object) => object.id === name)
  return found === undefined ? { refusal: modelNotFound(name, models) } : { json: JSON.stringify(found) }
}

/**
 * Parameters of OpenAI's API that the platform does not implement (OpenAiRoutes.ts): a request that sets one is
 * refused, naming it, rather than answered as if it had not been asked.
 */
const unimplemented = (route: OpenAiRoute, name: string): boolean =>
  (openAiRoutes[route].unimplemented as ReadonlyArray<string>).includes(name)

const known: Readonly<Record<OpenAiRoute, ReadonlySet<string> | undefined>> = {
  chat: new Set(Object.keys(ChatCompletionRequest.fields)),
  completions: new Set(Object.keys(CompletionRequest.fields)),
  // An embeddings app's request schema is its own: it says what it refuses.
  embeddings: undefined,
  transcriptions: new Set(Object.keys(TranscriptionRequest.fields)),
  translations: new Set(Object.keys(TranscriptionRequest.fields)),
  speech: new Set(Object.keys(SpeechRequest.fields)),
  images: new Set(Object.keys(ImageGenerationRequest.fields))
}

const badParameter = (param: string, message: string): OpenAiRefusal => ({
  status: 400,
  message,
  param,
  code: "unsupported_parameter"
})

/** Completions OpenAI answers with at most 16 tokens unless told otherwise. */
const completionsDefaultMaxTokens = 16

const decodeCompletionRequest = Schema.decodeUnknownEither(CompletionRequest)

/** A completions request as the chat request its app's `serve` takes. */
const chatOfCompletion = (request: CompletionRequest): Record<string, unknown> => {
  const { prompt, logprobs, echo: _echo, best_of: _bestOf, max_tokens, ...rest } = request
  const raw = Array.isArray(prompt) && prompt.length === 1 && typeof prompt[0] !== "number" ? prompt[0]! : prompt
  return {
    ...rest,
    messages: [{ role: "user", content: typeof raw === "string" ? raw : "" }],
    cornserve_prompt: raw,
    max_tokens: max_tokens ?? completionsDefaultMaxTokens,
    ...(logprobs == null ? {} : { logprobs: true, top_logprobs: logprobs })
  }
}

/**
 * An OpenAI request as its app takes it: whether its answer streams, the body sent to the app, and
 * the fields the client sent (parsed once: the reply's format reads them; empty when the body is
 * not a JSON object, which the app's schema refuses).
 */
export interface PreparedOpenAiRequest {
  readonly stream: boolean
  readonly body: string
  readonly fields: Readonly<Record<string, unknown>>
}

/**
 * Checks an OpenAI request and gives the body its app takes, and whether the answer streams. A
 * body that is not a JSON object goes to the app as it is (chat), which says what is wrong.
 */
export const prepareOpenAiRequest = (
  route: OpenAiRoute,
  body: string,
  models: ReadonlyArray<string>
): PreparedOpenAiRequest | { readonly refusal: OpenAiRefusal } => {
  let value: unknown
  try {
    value = JSON.parse(body)
  } catch {
    return { stream: false, body, fields: {} }
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) return { stream: false, body, fields: {} }
  const fields = value as Record<string, unknown>
  const prepared = (stream: boolean, sent: string): PreparedOpenAiRequest => ({ stream, body: sent, fields })
  const allowed = known[route]
  for (const name of Object.keys(fields)) {
    if (unimplemented(route, name))
      return {
        refusal: badParameter(name, `\`${name}\` is not supported by this platform's ${openAiRoutes[route].name}`)
      }
    if (allowed !== undefined && !allowed.has(name))
      return {
        refusal: badParameter(
          shortened(name, 100),
          `\`${shortened(name, 100)}\` is not a parameter of ${openAiRoutes[route].name}`
        )
      }
  }
  if (typeof fields.model === "string" && models.length > 0 && !models.includes(fields.model))
    return { refusal: modelNotFound(fields.model, models) }
  if (route === "embeddings" || route === "transcriptions") return prepared(false, body)
  if (route === "speech") return prepared(true, body)
  if (route === "images") {
    if (fields.response_format === "url")
      return {
        refusal: badParameter(
          "response_format",
          "`url` is not supported: the platform keeps no files to link to; use b64_json"
        )
      }
    return prepared(false, body)
  }
  // A translation is a transcription into English: the same request, its task set.
  if (route === "translations") return prepared(false, JSON.stringify({ ...fields, task: "translate" }))
  let chat = fields
  if (route === "completions") {
    const decoded = decodeCompletionRequest(fields, { errors: "all" })
    if (Either.isLeft(decoded)) {
      const issues = readableIssues(decoded.left)
      return {
        refusal: {
          status: 400,
          message: `malformed completions request: ${shortened(issueLines(issues.slice(0, 20)).join("; "), 1000)}`,
          param: issues[0]?.path.join(".") ?? null,
          code: "invalid_value"
        }
      }
    }
    chat = chatOfCompletion(decoded.right)
  }
  if (chat.stream === true) return prepared(true, route === "chat" ? body : JSON.stringify(chat))
  // One answer carries usage as OpenAI's does: the stream behind it is asked for it.
  if (chat.stream_options == null) chat = { ...chat, stream_options: { include_usage: true } }
  return prepared(false, JSON.stringify(chat))
}
