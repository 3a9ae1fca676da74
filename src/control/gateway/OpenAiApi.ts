/**
 * OpenAI's API on every app (`/app/:id/v1/...`): chat completions, legacy completions, embeddings,
 * audio transcriptions and translations (TranscriptionsApi.ts), audio speech (SpeechApi.ts), image
 * generations (ImagesApi.ts) and models. An app serves OpenAI's requests through its own `serve`: the gateway checks a
 * request's parameters and model, hands a completions request to the app as a chat request whose
 * `cornserve_prompt` carries the prompt, and writes the app's chat-completion chunks the way the
 * route's client expects them (a stream of events, or one object gathered from the chunks).
 */
import type { ServerResponse } from "node:http"
import * as Either from "effect/Either"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import { responseTooLargeMessage } from "../../app-runtime/driver/protocol.js"
import {
  type ChatCompletion,
  ChatCompletionChunk,
  ChatCompletionRequest,
  type ChoiceLogprobs,
  type CompletionLogprobs,
  CompletionRequest,
  type CompletionUsage,
  type FinishReason,
  type TextCompletion
} from "../../app-runtime/schemas/OpenAI.js"
import { ImageGenerationRequest } from "../../app-runtime/schemas/Images.js"
import { SpeechRequest } from "../../app-runtime/schemas/Speech.js"
import { TranscriptionRequest } from "../../app-runtime/schemas/Transcriptions.js"
import { issueLines, readableIssues } from "../../app-runtime/SchemaIssues.js"
import { shortened } from "../../app-runtime/Shortened.js"
import { AppFailed } from "../errors.js"
import { errorCodes, eventStreamFormat, type ReplyFormat, sendError, writeJson } from "./ReplyFormat.js"

export type OpenAiRoute =
  | "chat"
  | "completions"
  | "embeddings"
  | "transcriptions"
  | "translations"
  | "speech"
  | "images"

const pathPattern =
  /^\/app\/([^/]+)\/v1\/(chat\/completions|completions|embeddings|audio\/transcriptions|audio\/translations|audio\/speech|images\/generations|models)(?:\/([^/]+))?$/

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
  const [, appId, name, model] = match as unknown as [string, string, string, string | undefined]
  if (name === "models") return method === "GET" ? { appId, route: "models", model } : undefined
  if (method !== "POST" || model !== undefined) return undefined
  return {
    appId,
    route:
      name === "chat/completions"
        ? "chat"
        : name === "images/generations"
          ? "images"
          : name.startsWith("audio/")
            ? (name.slice("audio/".length) as OpenAiRoute)
            : (name as OpenAiRoute)
  }
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
 * Parameters of OpenAI's API that the platform does not implement: a request that sets one is
 * refused, naming it, rather than answered as if it had not been asked.
 */
const unimplemented: Readonly<Record<OpenAiRoute, ReadonlySet<string>>> = {
  chat: new Set([
    "audio",
    "function_call",
    "functions",
    "logit_bias",
    "metadata",
    "modalities",
    "prediction",
    "prompt_cache_key",
    "reasoning_effort",
    "safety_identifier",
    "service_tier",
    "store",
    "verbosity",
    "web_search_options"
  ]),
  completions: new Set(["logit_bias", "suffix"]),
  embeddings: new Set(),
  // OpenAI's `prompt` (Whisper's previous text) and streamed transcripts.
  transcriptions: new Set(["prompt", "include", "stream"]),
  translations: new Set(["prompt"]),
  // Voice instructions (gpt-4o-mini-tts's) have no counterpart in the models served here.
  speech: new Set(["instructions"]),
  // Streamed partial images, and settings the generators served here have no counterpart for.
  images: new Set(["stream", "partial_images", "background", "moderation", "output_compression", "quality", "style"])
}

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

const routeNames: Readonly<Record<OpenAiRoute, string>> = {
  chat: "chat completions",
  completions: "completions",
  embeddings: "embeddings",
  transcriptions: "transcriptions",
  translations: "translations",
  speech: "speech",
  images: "image generations"
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
 * Checks an OpenAI request and gives the body its app takes, and whether the answer streams. A
 * body that is not a JSON object goes to the app as it is (chat), which says what is wrong.
 */
export const prepareOpenAiRequest = (
  route: OpenAiRoute,
  body: string,
  models: ReadonlyArray<string>
): { readonly stream: boolean; readonly body: string } | { readonly refusal: OpenAiRefusal } => {
  let value: unknown
  try {
    value = JSON.parse(body)
  } catch {
    return { stream: false, body }
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) return { stream: false, body }
  const fields = value as Record<string, unknown>
  const allowed = known[route]
  for (const name of Object.keys(fields)) {
    if (unimplemented[route].has(name))
      return { refusal: badParameter(name, `\`${name}\` is not supported by this platform's ${routeNames[route]}`) }
    if (allowed !== undefined && !allowed.has(name))
      return {
        refusal: badParameter(
          shortened(name, 100),
          `\`${shortened(name, 100)}\` is not a parameter of ${routeNames[route]}`
        )
      }
  }
  if (typeof fields.model === "string" && models.length > 0 && !models.includes(fields.model))
    return { refusal: modelNotFound(fields.model, models) }
  if (route === "embeddings" || route === "transcriptions") return { stream: false, body }
  if (route === "speech") return { stream: true, body }
  if (route === "images") {
    if (fields.response_format === "url")
      return {
        refusal: badParameter(
          "response_format",
          "`url` is not supported: the platform keeps no files to link to; use b64_json"
        )
      }
    return { stream: false, body }
  }
  // A translation is a transcription into English: the same request, its task set.
  if (route === "translations") return { stream: false, body: JSON.stringify({ ...fields, task: "translate" }) }
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
  if (chat.stream === true) return { stream: true, body: route === "chat" ? body : JSON.stringify(chat) }
  // One answer carries usage as OpenAI's does: the stream behind it is asked for it.
  if (chat.stream_options == null) chat = { ...chat, stream_options: { include_usage: true } }
  return { stream: false, body: JSON.stringify(chat) }
}

const decodeChunk = Schema.decodeUnknownEither(Schema.parseJson(ChatCompletionChunk))

interface GatheredChoice {
  text: string
  finish: FinishReason | null
  logprobs: Array<NonNullable<ChoiceLogprobs["content"]>[number]>
  /** Tool calls by their index: the first delta names them, the rest add to their arguments. */
  calls: Map<number, { id: string; name: string; arguments: string }>
}

/** What an app's stream says, gathered by choice: a whole answer's parts. */
class Gathered {
  readonly choices = new Map<number, GatheredChoice>()
  id: string | undefined
  created: number | undefined
  model: string | undefined
  usage: CompletionUsage | undefined
  /** Some chunk carried logprobs: the request asked for them. */
  logprobsAsked = false
  private chars = 0
  failure: AppFailed | undefined

  constructor(
    private readonly appId: string,
    private readonly maxResponseBytes: number
  ) {}

  add(json: string): void {
    if (this.failure !== undefined) return
    // A completion is one answer: it is bounded like one, however many chunks it arrives in.
    this.chars += json.length
    if (this.chars > this.maxResponseBytes) {
      this.failure = new AppFailed({ appId: this.appId, message: responseTooLargeMessage(this.maxResponseBytes) })
      this.choices.clear()
      return
    }
    const decoded = decodeChunk(json)
    if (Either.isLeft(decoded)) {
      const problem = shortened(ParseResult.TreeFormatter.formatErrorSync(decoded.left))
      this.failure = new AppFailed({
        appId: this.appId,
        message: `the app streamed something other than chat-completion chunks: ${problem}`
      })
      return
    }
    const chunk = decoded.right
    this.id ??= chunk.id
    this.created ??= chunk.created
    this.model ??= chunk.model
    if (chunk.usage != null) this.usage = chunk.usage
    for (const choice of chunk.choices) {
      if (choice.logprobs != null) this.logprobsAsked = true
      const gathered: GatheredChoice = this.choices.get(choice.index) ?? {
        text: "",
        finish: null,
        logprobs: [],
        calls: new Map()
      }
      gathered.text += choice.delta.content ?? ""
      for (const call of choice.delta.tool_calls ?? []) {
        const known = gathered.calls.get(call.index) ?? { id: "", name: "", arguments: "" }
        if (call.id !== undefined) known.id = call.id
        if (call.function?.name !== undefined) known.name = call.function.name
        known.arguments += call.function?.arguments ?? ""
        gathered.calls.set(call.index, known)
      }
      if (choice.finish_reason !== null) gathered.finish = choice.finish_reason
      if (choice.logprobs?.content != null) gathered.logprobs.push(...choice.logprobs.content)
      this.choices.set(choice.index, gathered)
    }
  }

  /** The choices in index order. */
  ordered() {
    return [...this.choices.entries()].sort(([a], [b]) => a - b)
  }
}

/** An app's chat chunks gathered into one answer (`whole` writes it), for a request that did not ask to stream. */
const gatheringFormat = (
  appId: string,
  maxResponseBytes: number,
  whole: (gathered: Gathered) => ChatCompletion | TextCompletion
): ReplyFormat => {
  const gathered = new Gathered(appId, maxResponseBytes)
  return {
    value: writeJson,
    streamStart: () => undefined,
    chunk: (_, json) => {
      gathered.add(json)
      return true
    },
    end: (response) =>
      gathered.failure !== undefined
        ? sendError(response, gathered.failure)
        : writeJson(response, JSON.stringify(whole(gathered))),
    streamError: (response, error) => sendError(response, error)
  }
}

/** Chat chunks gathered into one `chat.completion`. */
export const chatCompletionFormat = (appId: string, maxResponseBytes: number): ReplyFormat =>
  gatheringFormat(
    appId,
    maxResponseBytes,
    (gathered): ChatCompletion => ({
      id: gathered.id ?? "chatcmpl-cornserve",
      object: "chat.completion",
      created: gathered.created ?? Math.floor(Date.now() / 1000),
      model: gathered.model ?? "",
      choices: gathered.ordered().map(([index, choice]) => ({
        index,
        message: {
          role: "assistant",
          content: choice.text === "" && choice.calls.size > 0 ? null : choice.text,
          ...(choice.calls.size === 0
            ? {}
            : {
                tool_calls: [...choice.calls.entries()]
                  .sort(([a], [b]) => a - b)
                  .map(([, call]) => ({
                    id: call.id,
                    type: "function" as const,
                    function: { name: call.name, arguments: call.arguments }
                  }))
              })
        },
        finish_reason: choice.finish ?? "stop",
        logprobs: gathered.logprobsAsked ? { content: choice.logprobs } : null
      })),
      ...(gathered.usage === undefined ? {} : { usage: gathered.usage })
    })
  )

/** Chat chunks as they come, as Server-Sent Events. */
export const chatStreamFormat: ReplyFormat = eventStreamFormat()

const completionId = (id: string) => (id.startsWith("chatcmpl-") ? `cmpl-${id.slice("chatcmpl-".length)}` : id)

/** Chat logprobs in the completions API's shape; `offset` is where the tokens' text starts in the completion. */
const completionLogprobs = (
  content: NonNullable<ChoiceLogprobs["content"]>,
  offset: number
): { readonly logprobs: CompletionLogprobs; readonly offset: number } => {
  const offsets: Array<number> = []
  let at = offset
  for (const token of content) {
    offsets.push(at)
    at += token.token.length
  }
  return {
    logprobs: {
      tokens: content.map((token) => token.token),
      token_logprobs: content.map((token) => token.logprob),
      top_logprobs: content.map((token) =>
        Object.fromEntries(token.top_logprobs.map((top) => [top.token, top.logprob]))
      ),
      text_offset: offsets
    },
    offset: at
  }
}

/** Chat chunks as `text_completion` chunks, streamed; role-only chunks say nothing here. */
export const completionStreamFormat = (appId: string): ReplyFormat => {
  const events = eventStreamFormat()
  const offsets = new Map<number, number>()
  let failure: AppFailed | undefined
  return {
    ...events,
    chunk: (response, json) => {
      if (failure !== undefined) return true
      const decoded = decodeChunk(json)
      if (Either.isLeft(decoded)) {
        failure = new AppFailed({ appId, message: "the app streamed something other than chat-completion chunks" })
        events.streamError(response, failure)
        return true
      }
      const chunk = decoded.right
      const choices = chunk.choices.flatMap((choice) => {
        const text = choice.delta.content ?? ""
        if (text === "" && choice.finish_reason === null) return []
        let logprobs: CompletionLogprobs | null = null
        if (choice.logprobs?.content != null) {
          const converted = completionLogprobs(choice.logprobs.content, offsets.get(choice.index) ?? 0)
          offsets.set(choice.index, converted.offset)
          logprobs = converted.logprobs
        }
        return [{ index: choice.index, text, finish_reason: choice.finish_reason, logprobs }]
      })
      if (choices.length === 0 && chunk.usage == null) return true
      const completion: TextCompletion = {
        id: completionId(chunk.id),
        object: "text_completion",
        created: chunk.created,
        model: chunk.model,
        choices,
        ...(chunk.usage === undefined ? {} : { usage: chunk.usage })
      }
      return response.write(`data: ${JSON.stringify(completion)}\n\n`)
    },
    end: (response) => {
      if (failure === undefined) events.end(response)
    }
  }
}

/** Chat chunks gathered into one `text_completion`. */
export const completionFormat = (appId: string, maxResponseBytes: number): ReplyFormat =>
  gatheringFormat(
    appId,
    maxResponseBytes,
    (gathered): TextCompletion => ({
      id: completionId(gathered.id ?? "cmpl-cornserve"),
      object: "text_completion",
      created: gathered.created ?? Math.floor(Date.now() / 1000),
      model: gathered.model ?? "",
      choices: gathered.ordered().map(([index, choice]) => ({
        index,
        text: choice.text,
        finish_reason: choice.finish ?? "stop",
        logprobs: gathered.logprobsAsked ? completionLogprobs(choice.logprobs, 0).logprobs : null
      })),
      ...(gathered.usage === undefined ? {} : { usage: gathered.usage })
    })
  )

/** How the reply to an OpenAI request is written. */
export const openAiFormat = (
  route: OpenAiRoute,
  stream: boolean,
  appId: string,
  maxResponseBytes: number
): ReplyFormat | undefined => {
  switch (route) {
    case "chat":
      return stream ? chatStreamFormat : chatCompletionFormat(appId, maxResponseBytes)
    case "completions":
      return stream ? completionStreamFormat(appId) : completionFormat(appId, maxResponseBytes)
    case "embeddings":
    case "transcriptions":
    case "translations":
    case "speech":
    case "images":
      return undefined
  }
}
