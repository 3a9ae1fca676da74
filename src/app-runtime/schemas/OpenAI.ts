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

const Probability = Schema.Number.pipe(Schema.between(0, 1))

/** An OpenAI chat-completions request (the subset Cornserve's LLM executor honours). */
export const ChatCompletionRequest = Schema.Struct({
  messages: Schema.NonEmptyArray(ChatMessage),
  model: Schema.optional(Schema.String),
  max_tokens: Schema.optional(Schema.Int.pipe(Schema.positive())),
  max_completion_tokens: Schema.optional(Schema.Int.pipe(Schema.positive())),
  temperature: Schema.optional(Schema.Number.pipe(Schema.between(0, 2))),
  top_p: Schema.optional(Probability),
  seed: Schema.optional(Schema.Int),
  stop: Schema.optional(Schema.Union(Schema.String, Schema.Array(Schema.String))),
  stream: Schema.optional(Schema.Boolean),
  stream_options: Schema.optional(Schema.Struct({ include_usage: Schema.optional(Schema.Boolean) }))
})
export type ChatCompletionRequest = typeof ChatCompletionRequest.Type

export const CompletionUsage = Schema.Struct({
  prompt_tokens: Schema.Int,
  completion_tokens: Schema.Int,
  total_tokens: Schema.Int
})

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
      finish_reason: Schema.NullOr(Schema.String)
    })
  ),
  usage: Schema.optional(Schema.NullOr(CompletionUsage))
})
export type ChatCompletionChunk = typeof ChatCompletionChunk.Type

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
