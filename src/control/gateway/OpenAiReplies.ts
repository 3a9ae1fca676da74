/**
 * How the gateway writes an app's chat-completion chunks to an OpenAI client: as they come
 * (Server-Sent Events), or gathered into one `chat.completion`; and for the legacy completions
 * route, as `text_completion` chunks or one `text_completion`.
 */
import * as Either from "effect/Either"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import { responseTooLargeMessage } from "../../app-runtime/driver/protocol.js"
import { wavHeader } from "../../executors/common/media/Wav.js"
import {
  type ChatAudioSettings,
  chatAudioSampleRate,
  type ChatCompletion,
  ChatCompletionChunk,
  type ChoiceLogprobs,
  type CompletionLogprobs,
  type CompletionUsage,
  type FinishReason,
  type TextCompletion
} from "../../app-runtime/schemas/OpenAI.js"
import { shortened } from "../../app-runtime/Shortened.js"
import { AppFailed } from "../errors.js"
import type { OpenAiRoute } from "./OpenAiApi.js"
import { eventStreamFormat, type ReplyFormat, sendError, writeJson } from "./ReplyFormat.js"

const decodeChunk = Schema.decodeUnknownEither(Schema.parseJson(ChatCompletionChunk))

interface GatheredChoice {
  text: string
  /** A spoken answer's pieces (audio deltas): its id, its text and its PCM16. */
  audio: { id: string; transcript: string; pcm: Array<Buffer>; expiresAt: number | undefined } | undefined
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
        calls: new Map(),
        audio: undefined
      }
      gathered.text += choice.delta.content ?? ""
      const audio = choice.delta.audio
      if (audio !== undefined) {
        gathered.audio ??= { id: "", transcript: "", pcm: [], expiresAt: undefined }
        if (audio.id !== undefined) gathered.audio.id = audio.id
        if (audio.expires_at !== undefined) gathered.audio.expiresAt = audio.expires_at
        gathered.audio.transcript += audio.transcript ?? ""
        if (audio.data !== undefined) gathered.audio.pcm.push(Buffer.from(audio.data, "base64"))
      }
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

/** A spoken answer's audio as the request asked: a WAV file, or its PCM16 as it is; base64. */
const audioFile = (pcm: ReadonlyArray<Buffer>, format: ChatAudioSettings["format"]): string => {
  const samples = Buffer.concat(pcm)
  return (
    format === "wav" ? Buffer.concat([wavHeader(chatAudioSampleRate, samples.length), samples]) : samples
  ).toString("base64")
}

/** Chat chunks gathered into one `chat.completion`; a spoken answer's audio in `audioFormat` (wav when left out). */
export const chatCompletionFormat = (
  appId: string,
  maxResponseBytes: number,
  audioFormat: ChatAudioSettings["format"] = "wav"
): ReplyFormat =>
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
          content: choice.text === "" && (choice.calls.size > 0 || choice.audio !== undefined) ? null : choice.text,
          ...(choice.audio === undefined
            ? {}
            : {
                audio: {
                  id: choice.audio.id,
                  data: audioFile(choice.audio.pcm, audioFormat),
                  expires_at: choice.audio.expiresAt ?? Math.floor(Date.now() / 1000) + 3600,
                  transcript: choice.audio.transcript
                }
              }),
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

/** The audio format a chat request asked for (the app's schema has checked it): wav unless pcm16. */
const audioFormatOf = (fields: Readonly<Record<string, unknown>>): ChatAudioSettings["format"] => {
  const audio = fields.audio
  return typeof audio === "object" && audio !== null && (audio as { format?: unknown }).format === "pcm16"
    ? "pcm16"
    : "wav"
}

/** How the reply to an OpenAI request is written. */
export const openAiFormat = (
  route: OpenAiRoute,
  stream: boolean,
  appId: string,
  maxResponseBytes: number,
  fields: Readonly<Record<string, unknown>> = {}
): ReplyFormat | undefined => {
  switch (route) {
    case "chat":
      return stream ? chatStreamFormat : chatCompletionFormat(appId, maxResponseBytes, audioFormatOf(fields))
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
