import { Schema } from "effect"

const TextPart = Schema.Struct({ type: Schema.Literal("text"), text: Schema.String })
const ImageUrlPart = Schema.Struct({
  type: Schema.Literal("image_url"),
  image_url: Schema.Struct({ url: Schema.String, detail: Schema.optional(Schema.String) })
})
const InputAudioPart = Schema.Struct({
  type: Schema.Literal("input_audio"),
  input_audio: Schema.Struct({ data: Schema.String, format: Schema.Literal("wav", "pcm16") })
})
const AudioUrlPart = Schema.Struct({
  type: Schema.Literal("audio_url"),
  audio_url: Schema.Struct({ url: Schema.String })
})
const VideoUrlPart = Schema.Struct({
  type: Schema.Literal("video_url"),
  video_url: Schema.Struct({ url: Schema.String })
})

export const ChatContentPart = Schema.Union(TextPart, ImageUrlPart, InputAudioPart, AudioUrlPart, VideoUrlPart)
export type ChatContentPart = typeof ChatContentPart.Type

export const ChatMessage = Schema.Struct({
  role: Schema.Literal("system", "user", "assistant", "developer"),
  content: Schema.Union(Schema.String, Schema.Array(ChatContentPart)),
  name: Schema.optional(Schema.String)
})
export type ChatMessage = typeof ChatMessage.Type

/** An optional field that OpenAI's API also accepts as null. */
const optionalNullable = <S extends Schema.Schema.Any>(schema: S) => Schema.optional(Schema.NullOr(schema))

const TokenCount = Schema.Int.pipe(Schema.positive())

/**
 * An OpenAI chat-completions request: every request OpenAI's API accepts for the fields Cornserve
 * honours (unknown fields are dropped). `model` may be left out: an app serves the model its tasks
 * name, and an executor the one it loaded; when given, the executor checks it.
 */
export const ChatCompletionRequest = Schema.Struct({
  messages: Schema.NonEmptyArray(ChatMessage),
  model: Schema.optional(Schema.String),
  max_tokens: optionalNullable(TokenCount),
  max_completion_tokens: optionalNullable(TokenCount),
  temperature: optionalNullable(Schema.Number.pipe(Schema.between(0, 2))),
  top_p: optionalNullable(Schema.Number.pipe(Schema.between(0, 1))),
  /** vLLM's extension: sample among the k most likely tokens (0 or -1: all). */
  top_k: optionalNullable(Schema.Int.pipe(Schema.greaterThanOrEqualTo(-1))),
  /** vLLM's extension: penalize tokens already in the prompt or the completion (1: none). */
  repetition_penalty: optionalNullable(Schema.Number.pipe(Schema.positive())),
  seed: optionalNullable(Schema.Int),
  stop: optionalNullable(Schema.Union(Schema.String, Schema.Array(Schema.String).pipe(Schema.maxItems(4)))),
  /** One choice per request is all Cornserve generates. */
  n: optionalNullable(Schema.Literal(1)),
  stream: optionalNullable(Schema.Boolean),
  stream_options: optionalNullable(Schema.Struct({ include_usage: Schema.optional(Schema.Boolean) }))
})
export type ChatCompletionRequest = typeof ChatCompletionRequest.Type

export const CompletionUsage = Schema.Struct({
  prompt_tokens: Schema.Int,
  completion_tokens: Schema.Int,
  total_tokens: Schema.Int
})
export type CompletionUsage = typeof CompletionUsage.Type

export const FinishReason = Schema.Literal("stop", "length")
export type FinishReason = typeof FinishReason.Type

/** One chunk of a streamed chat completion. */
export const ChatCompletionChunk = Schema.Struct({
  id: Schema.String,
  object: Schema.Literal("chat.completion.chunk"),
  created: Schema.Int,
  model: Schema.String,
  choices: Schema.Array(
    Schema.Struct({
      index: Schema.Int,
      delta: Schema.Struct({
        role: Schema.optional(Schema.Literal("assistant")),
        content: Schema.optional(Schema.String)
      }),
      finish_reason: Schema.NullOr(FinishReason),
      logprobs: Schema.optional(Schema.Null)
    })
  ),
  /** With stream_options.include_usage: null on every chunk but the last, which has no choices. */
  usage: Schema.optional(Schema.NullOr(CompletionUsage))
})
export type ChatCompletionChunk = typeof ChatCompletionChunk.Type

/** A whole chat completion, for a request that did not ask to stream. */
export const ChatCompletion = Schema.Struct({
  id: Schema.String,
  object: Schema.Literal("chat.completion"),
  created: Schema.Int,
  model: Schema.String,
  choices: Schema.Tuple(
    Schema.Struct({
      index: Schema.Literal(0),
      message: Schema.Struct({ role: Schema.Literal("assistant"), content: Schema.String }),
      finish_reason: FinishReason,
      logprobs: Schema.Null
    })
  ),
  usage: Schema.optional(CompletionUsage)
})
export type ChatCompletion = typeof ChatCompletion.Type

export type MediaModality = "image" | "video" | "audio"

/** The media parts of a chat request, in the order they appear, as (modality, url) pairs. */
export const chatMediaParts = (request: ChatCompletionRequest): Array<{ modality: MediaModality; url: string }> =>
  request.messages.flatMap((message) =>
    typeof message.content === "string"
      ? []
      : message.content.flatMap((part): Array<{ modality: MediaModality; url: string }> => {
          switch (part.type) {
            case "text":
              return []
            case "image_url":
              return [{ modality: "image", url: part.image_url.url }]
            case "video_url":
              return [{ modality: "video", url: part.video_url.url }]
            case "audio_url":
              return [{ modality: "audio", url: part.audio_url.url }]
            case "input_audio":
              return [
                {
                  modality: "audio",
                  url: `data:audio/${part.input_audio.format === "wav" ? "wav" : "pcm16"};base64,${part.input_audio.data}`
                }
              ]
          }
        })
  )
