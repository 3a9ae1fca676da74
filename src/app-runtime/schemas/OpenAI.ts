import * as Schema from "effect/Schema"

const TextPart = Schema.Struct({ type: Schema.Literal("text"), text: Schema.String })
const ImageUrlPart = Schema.Struct({
  type: Schema.Literal("image_url"),
  image_url: Schema.Struct({ url: Schema.String, detail: Schema.optional(Schema.String) })
})
const InputAudioPart = Schema.Struct({
  type: Schema.Literal("input_audio"),
  input_audio: Schema.Struct({ data: Schema.String, format: Schema.Literal("wav", "mp3", "pcm16") })
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

/** A function the model called: its arguments are a JSON text, as OpenAI gives them. */
export const ToolCall = Schema.Struct({
  id: Schema.String.pipe(Schema.maxLength(256)),
  type: Schema.Literal("function"),
  function: Schema.Struct({ name: Schema.String.pipe(Schema.maxLength(256)), arguments: Schema.String })
})
export type ToolCall = typeof ToolCall.Type

export const ChatMessage = Schema.Struct({
  role: Schema.Literal("system", "user", "assistant", "developer", "tool"),
  /** Null only for an assistant's message that calls tools. */
  content: Schema.NullOr(Schema.Union(Schema.String, Schema.Array(ChatContentPart))),
  name: Schema.optional(Schema.String),
  /** An assistant's calls of the request's tools. */
  tool_calls: Schema.optional(Schema.Array(ToolCall).pipe(Schema.maxItems(128))),
  /** A tool's message: the call it answers. */
  tool_call_id: Schema.optional(Schema.String.pipe(Schema.maxLength(256)))
})
export type ChatMessage = typeof ChatMessage.Type

/** An optional field that OpenAI's API also accepts as null. */
const optionalNullable = <S extends Schema.Schema.Any>(schema: S) => Schema.optional(Schema.NullOr(schema))

const TokenCount = Schema.Int.pipe(Schema.positive())

/** The most choices (`n`) one request may ask for. */
export const maxChoices = 8
/** The most alternatives per token (`top_logprobs`) one request may ask for, as OpenAI allows. */
export const maxTopLogprobs = 20

const Penalty = Schema.Number.pipe(Schema.between(-2, 2))

/**
 * A JSON Schema the answer must match, decoded by masking the model's logits at each step
 * (OpenAI's structured outputs); `strict` is taken as always on.
 */
export const JsonSchemaFormat = Schema.Struct({
  name: Schema.String.pipe(Schema.maxLength(64)),
  description: Schema.optional(Schema.String),
  schema: Schema.optional(Schema.Record({ key: Schema.String, value: Schema.Unknown })),
  strict: optionalNullable(Schema.Boolean)
})

/** A function the model may call; `parameters` is the JSON Schema of its arguments. */
export const FunctionTool = Schema.Struct({
  type: Schema.Literal("function"),
  function: Schema.Struct({
    name: Schema.String.pipe(Schema.pattern(/^[a-zA-Z0-9_-]{1,64}$/)),
    description: Schema.optional(Schema.String),
    parameters: Schema.optional(Schema.Record({ key: Schema.String, value: Schema.Unknown })),
    strict: optionalNullable(Schema.Boolean)
  })
})
export type FunctionTool = typeof FunctionTool.Type

/** Whether the model may (`auto`), must not (`none`) or must (`required`, or the function named) call a tool. */
export const ToolChoice = Schema.Union(
  Schema.Literal("none", "auto", "required"),
  Schema.Struct({ type: Schema.Literal("function"), function: Schema.Struct({ name: Schema.String }) })
)
export type ToolChoice = typeof ToolChoice.Type

export const ResponseFormat = Schema.Union(
  Schema.Struct({ type: Schema.Literal("text") }),
  Schema.Struct({ type: Schema.Literal("json_object") }),
  Schema.Struct({ type: Schema.Literal("json_schema"), json_schema: JsonSchemaFormat })
)
export type ResponseFormat = typeof ResponseFormat.Type

/**
 * A chat request's prompt as OpenAI's legacy completions give it: a text the model continues as it
 * is (no chat template), or its token ids. The gateway's `/v1/completions` sets it; the messages
 * then only describe the prompt to the app.
 */
export const RawPrompt = Schema.Union(
  Schema.String,
  Schema.NonEmptyArray(Schema.Int.pipe(Schema.nonNegative())).pipe(Schema.maxItems(1_000_000))
)
export type RawPrompt = typeof RawPrompt.Type

/**
 * vLLM's `mm_processor_kwargs`: per-request settings of the model's media processor. Qwen2-VL
 * models take the area an image or video frame is resized within (within the model's own bounds)
 * and the frames per second a video is sampled at; other models refuse them.
 */
export const MediaProcessorOptions = Schema.Struct({
  min_pixels: Schema.optional(Schema.Int.pipe(Schema.positive())),
  max_pixels: Schema.optional(Schema.Int.pipe(Schema.positive())),
  fps: Schema.optional(Schema.Number.pipe(Schema.positive(), Schema.lessThanOrEqualTo(60)))
})
export type MediaProcessorOptions = typeof MediaProcessorOptions.Type

/** What a chat answer holds: text, and audio from an app that speaks. */
export const AnswerModality = Schema.Literal("text", "audio")

/**
 * OpenAI's audio output settings. The formats a whole answer is given in: wav, or pcm16 (24 kHz
 * mono PCM16 little-endian, what a streamed answer's chunks always are).
 */
export const ChatAudioSettings = Schema.Struct({
  voice: Schema.String.pipe(Schema.maxLength(64)),
  format: Schema.Literal("wav", "pcm16")
})
export type ChatAudioSettings = typeof ChatAudioSettings.Type

/** The sample rate of a chat answer's audio, as OpenAI's pcm16 is. */
export const chatAudioSampleRate = 24_000

/**
 * An OpenAI chat-completions request: every request OpenAI's API accepts for the fields Cornserve
 * honours. `model` may be left out: an app serves the model its tasks name, and an executor the
 * one it loaded; when given, the gateway and the executor check it.
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
  /** vLLM's extension: settings of the model's media processor for this request's images and videos. */
  mm_processor_kwargs: Schema.optional(MediaProcessorOptions),
  /** Subtracted from a token's logit once it appears in the completion (OpenAI's). */
  presence_penalty: optionalNullable(Penalty),
  /** Subtracted from a token's logit once for each time it appears in the completion (OpenAI's). */
  frequency_penalty: optionalNullable(Penalty),
  seed: optionalNullable(Schema.Int),
  stop: optionalNullable(Schema.Union(Schema.String, Schema.Array(Schema.String).pipe(Schema.maxItems(4)))),
  /** Choices generated for the request, each from its own draw (seed + index when a seed is given). */
  n: optionalNullable(Schema.Int.pipe(Schema.between(1, maxChoices))),
  /** The log probability of each token of the answer, and of its `top_logprobs` most likely alternatives. */
  logprobs: optionalNullable(Schema.Boolean),
  top_logprobs: optionalNullable(Schema.Int.pipe(Schema.between(0, maxTopLogprobs))),
  response_format: optionalNullable(ResponseFormat),
  tools: optionalNullable(Schema.Array(FunctionTool).pipe(Schema.maxItems(128))),
  tool_choice: optionalNullable(ToolChoice),
  /** Several calls in one answer: taken as asked, since the model's template says how it calls. */
  parallel_tool_calls: optionalNullable(Schema.Boolean),
  stream: optionalNullable(Schema.Boolean),
  stream_options: optionalNullable(Schema.Struct({ include_usage: Schema.optional(Schema.Boolean) })),
  /** The end user, as OpenAI's clients name them: taken, not used. */
  user: Schema.optional(Schema.String.pipe(Schema.maxLength(256))),
  /**
   * What the answer holds: ["text"] (the default), or ["text", "audio"], the answer spoken too,
   * which an app with a talker (TalkerTask) gives; an LLM task alone refuses audio.
   */
  modalities: optionalNullable(Schema.Array(AnswerModality).pipe(Schema.minItems(1), Schema.maxItems(2))),
  /** With "audio" in `modalities`: the voice (a model with none takes any name) and the format of the audio. */
  audio: optionalNullable(ChatAudioSettings),
  /** Set by the gateway's `/v1/completions`: the prompt as it is, instead of the messages through the chat template. */
  cornserve_prompt: Schema.optional(RawPrompt)
}).annotations({ identifier: "ChatCompletionRequest" })
export type ChatCompletionRequest = typeof ChatCompletionRequest.Type

export const CompletionUsage = Schema.Struct({
  prompt_tokens: Schema.Int,
  completion_tokens: Schema.Int,
  total_tokens: Schema.Int
})
export type CompletionUsage = typeof CompletionUsage.Type

export const FinishReason = Schema.Literal("stop", "length", "tool_calls")
export type FinishReason = typeof FinishReason.Type

const TopLogprob = Schema.Struct({
  token: Schema.String,
  logprob: Schema.Number,
  /** The token's UTF-8 bytes: a token may hold part of a character. */
  bytes: Schema.NullOr(Schema.Array(Schema.Int))
})

/** One token of the answer with its log probability and its most likely alternatives. */
export const TokenLogprob = Schema.Struct({
  ...TopLogprob.fields,
  top_logprobs: Schema.Array(TopLogprob)
})
export type TokenLogprob = typeof TokenLogprob.Type

export const ChoiceLogprobs = Schema.Struct({ content: Schema.NullOr(Schema.Array(TokenLogprob)) })
export type ChoiceLogprobs = typeof ChoiceLogprobs.Type

export const ToolCallDelta = Schema.Struct({
  index: Schema.Int,
  id: Schema.optional(Schema.String),
  type: Schema.optional(Schema.Literal("function")),
  function: Schema.optional(
    Schema.Struct({ name: Schema.optional(Schema.String), arguments: Schema.optional(Schema.String) })
  )
})
export type ToolCallDelta = typeof ToolCallDelta.Type

/** A piece of a spoken answer: its id (in the first piece), text, or audio. */
export const AudioDelta = Schema.Struct({
  id: Schema.optional(Schema.String),
  transcript: Schema.optional(Schema.String),
  /** PCM16 little-endian mono at 24 kHz, base64, an even count of bytes. */
  data: Schema.optional(Schema.String),
  expires_at: Schema.optional(Schema.Int)
})
export type AudioDelta = typeof AudioDelta.Type

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
        content: Schema.optional(Schema.String),
        /** A call's id, type and name come in its first delta, its arguments in pieces after. */
        tool_calls: Schema.optional(Schema.Array(ToolCallDelta)),
        /**
         * With "audio" in the request's modalities: the answer's text as `transcript` pieces (not
         * `content`) and its audio as `data` pieces, PCM16 at 24 kHz, base64, as OpenAI streams them.
         */
        audio: Schema.optional(AudioDelta)
      }),
      finish_reason: Schema.NullOr(FinishReason),
      logprobs: Schema.optional(Schema.NullOr(ChoiceLogprobs))
    })
  ),
  /** With stream_options.include_usage: null on every chunk but the last, which has no choices. */
  usage: Schema.optional(Schema.NullOr(CompletionUsage))
}).annotations({ identifier: "ChatCompletionChunk" })
export type ChatCompletionChunk = typeof ChatCompletionChunk.Type

/** A whole chat completion, for a request that did not ask to stream. */
export const ChatCompletion = Schema.Struct({
  id: Schema.String,
  object: Schema.Literal("chat.completion"),
  created: Schema.Int,
  model: Schema.String,
  choices: Schema.Array(
    Schema.Struct({
      index: Schema.Int,
      message: Schema.Struct({
        role: Schema.Literal("assistant"),
        content: Schema.NullOr(Schema.String),
        tool_calls: Schema.optional(Schema.Array(ToolCall)),
        /** A spoken answer: its audio file in the request's format, base64, and its text. */
        audio: Schema.optional(
          Schema.Struct({ id: Schema.String, data: Schema.String, expires_at: Schema.Int, transcript: Schema.String })
        )
      }),
      finish_reason: FinishReason,
      logprobs: Schema.NullOr(ChoiceLogprobs)
    })
  ),
  usage: Schema.optional(CompletionUsage)
}).annotations({ identifier: "ChatCompletion" })
export type ChatCompletion = typeof ChatCompletion.Type

/**
 * OpenAI's legacy completions request (`POST /v1/completions`): one prompt, a text or its token
 * ids, continued as it is. The gateway turns it into a chat request with `cornserve_prompt`, so
 * that the app that serves chat serves it.
 */
export const CompletionRequest = Schema.Struct({
  prompt: Schema.Union(RawPrompt, Schema.Tuple(RawPrompt)),
  model: Schema.optional(Schema.String),
  max_tokens: optionalNullable(TokenCount),
  temperature: ChatCompletionRequest.fields.temperature,
  top_p: ChatCompletionRequest.fields.top_p,
  top_k: ChatCompletionRequest.fields.top_k,
  repetition_penalty: ChatCompletionRequest.fields.repetition_penalty,
  presence_penalty: ChatCompletionRequest.fields.presence_penalty,
  frequency_penalty: ChatCompletionRequest.fields.frequency_penalty,
  seed: ChatCompletionRequest.fields.seed,
  stop: ChatCompletionRequest.fields.stop,
  n: ChatCompletionRequest.fields.n,
  /** The log probabilities of this many most likely tokens at each step, besides the chosen one's. */
  logprobs: optionalNullable(Schema.Int.pipe(Schema.between(0, 5))),
  /** Only `false`: the prompt is not repeated in the answer. */
  echo: optionalNullable(Schema.Literal(false)),
  /** Only the value that changes nothing: one draw per choice. */
  best_of: optionalNullable(Schema.Literal(1)),
  stream: ChatCompletionRequest.fields.stream,
  stream_options: ChatCompletionRequest.fields.stream_options,
  user: ChatCompletionRequest.fields.user
})
export type CompletionRequest = typeof CompletionRequest.Type

export const CompletionLogprobs = Schema.Struct({
  tokens: Schema.Array(Schema.String),
  token_logprobs: Schema.Array(Schema.Number),
  top_logprobs: Schema.Array(Schema.Record({ key: Schema.String, value: Schema.Number })),
  text_offset: Schema.Array(Schema.Int)
})
export type CompletionLogprobs = typeof CompletionLogprobs.Type

/** A text completion, whole or one chunk of a stream: the same object. */
export const TextCompletion = Schema.Struct({
  id: Schema.String,
  object: Schema.Literal("text_completion"),
  created: Schema.Int,
  model: Schema.String,
  choices: Schema.Array(
    Schema.Struct({
      index: Schema.Int,
      text: Schema.String,
      finish_reason: Schema.NullOr(FinishReason),
      logprobs: Schema.NullOr(CompletionLogprobs)
    })
  ),
  usage: Schema.optional(Schema.NullOr(CompletionUsage))
})
export type TextCompletion = typeof TextCompletion.Type

/** `GET /v1/models`: the models an app (or an executor) serves. */
export const ModelObject = Schema.Struct({
  id: Schema.String,
  object: Schema.Literal("model"),
  created: Schema.Int,
  owned_by: Schema.String
})

export type MediaModality = "image" | "video" | "audio"

/** The media parts of a chat request, in the order they appear, as (modality, url) pairs. */
/** The media type of each input_audio format, as its data: URL says it. */
const inputAudioTypes = { wav: "audio/wav", mp3: "audio/mpeg", pcm16: "audio/pcm16" } as const

export const chatMediaParts = (request: ChatCompletionRequest): Array<{ modality: MediaModality; url: string }> =>
  request.messages.flatMap((message) =>
    typeof message.content === "string" || message.content === null
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
                  url: `data:${inputAudioTypes[part.input_audio.format]};base64,${part.input_audio.data}`
                }
              ]
          }
        })
  )
