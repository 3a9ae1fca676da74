import * as Schema from "effect/Schema"
import * as OpenAI from "../../app-runtime/schemas/OpenAI.js"
import { ChatMessage } from "../../app-runtime/schemas/OpenAI.js"
import { DataId } from "../common/DataId.js"

/**
 * The LLM executor's HTTP API, shared by the executor and the task dispatcher.
 *
 * - `POST /v1/chat/completions`: OpenAI's chat completions, streaming (Server-Sent Events ending
 *   with `data: [DONE]`) or not. Image and audio content parts are embedded by the model's own
 *   encoders, unless `cornserve_embeddings` names embeddings that an encoder executor already sent
 *   through the sidecar: then the n-th entry stands for the n-th media part of the messages.
 * - `GET /v1/models`: the one model this executor serves.
 * - `POST /v1/cornserve/prompt-embeddings`: the model's embeddings of a prompt, sent through the
 *   sidecar to a generator (the LLMEmbeddingTask).
 * - `POST /v1/cornserve/kv-prefill`: a chat's prompt prefilled, its KV cache sent through the
 *   sidecar to a decode executor of the same model, whose chat completion names it (`cornserve_kv`).
 * - `POST /v1/cornserve/image-tokens`: on a Janus-Pro model, an image's tokens for a prompt, sent
 *   through the sidecar to the generator that decodes them (the LLMImageTokensTask).
 * - `POST /v1/cornserve/talk`: on a talker, the codec frames it writes from a thinker's hidden
 *   states (read from the sidecar), streamed as NDJSON lines (the TalkerTask).
 * - `GET /v1/cornserve/stats`: requests waiting and running, the batch size and the KV cache's
 *   budget in effect, what it holds.
 *
 * The texts of a request's messages and tools are text: a special token spelled in one is its
 * characters, unless `cornserve_parse_special_tokens` says they are an app's own trusted prompt.
 */

/** Chat messages as apps send them: the same schema on both sides of the dispatcher. */
export { ChatContentPart, ChatMessage } from "../../app-runtime/schemas/OpenAI.js"

export const Modality = Schema.Literal("image", "audio", "video")
export type Modality = typeof Modality.Type

/** An embedding in the sidecar standing for one media part of the messages. */
export const EmbeddingRef = Schema.Struct({ id: DataId, modality: Modality })
export type EmbeddingRef = typeof EmbeddingRef.Type

/** OpenAI's request (the one schema the SDK and the gateway use), with the executor's extensions. */
export const ChatCompletionRequest = Schema.extend(
  OpenAI.ChatCompletionRequest,
  Schema.Struct({
    /** vLLM's extension: keep generating past end-of-sequence until max_tokens. */
    ignore_eos: Schema.optional(Schema.Boolean),
    cornserve_embeddings: Schema.optional(Schema.Array(EmbeddingRef)),
    /** Each streamed chunk also carries the ids of the tokens it says (`cornserve_token_ids`). */
    cornserve_token_ids: Schema.optional(Schema.Boolean),
    cornserve_parse_special_tokens: Schema.optional(Schema.Boolean),
    /**
     * Go on with a completion another executor began: these tokens follow the prompt as if this
     * executor had generated them, and only what comes after them is streamed (no role chunk). The
     * completion's budget (max_tokens) and its usage count them as generated.
     */
    cornserve_continuation: Schema.optional(
      Schema.Struct({ token_ids: Schema.Array(Schema.Int.pipe(Schema.nonNegative())) })
    ),
    /**
     * The prompt's KV cache, which another executor of the model prefilled and sent through the
     * sidecar under this id (`/v1/cornserve/kv-prefill`): this executor prefills only what follows it.
     */
    cornserve_kv: Schema.optional(Schema.Struct({ id: DataId }))
  })
)
export type ChatCompletionRequest = typeof ChatCompletionRequest.Type

/** Prefill a chat's prompt and send its KV cache through the sidecar, for a decode executor's `cornserve_kv`. */
export const KvPrefillRequest = Schema.Struct({
  model: Schema.optional(Schema.String),
  /** Rendered as a chat completion renders them, with the generation prompt. */
  messages: Schema.NonEmptyArray(ChatMessage),
  /** The chat's tools, which its template renders into the prompt as a chat completion's would. */
  tools: Schema.optional(Schema.NullOr(Schema.Array(OpenAI.FunctionTool).pipe(Schema.maxItems(128)))),
  cornserve_parse_special_tokens: Schema.optional(Schema.Boolean),
  cornserve_embeddings: Schema.optional(Schema.Array(EmbeddingRef)),
  /** The sidecar id the cache goes out under. */
  id: DataId,
  /**
   * Ids each of cornserve_embeddings goes on under, in order, to the same receivers: the decode
   * executor builds the same prompt from them.
   */
  forward_embeddings: Schema.optional(Schema.Array(DataId)),
  /** Node ids that receive it (default: this node). */
  receivers: Schema.optional(Schema.Array(Schema.String))
})
export type KvPrefillRequest = typeof KvPrefillRequest.Type

export const KvPrefillResponse = Schema.Struct({
  id: Schema.String,
  /** [tensors, heads, positions, headDim]: a key and a value per layer, for the prompt's first `positions` tokens. */
  shape: Schema.Tuple(Schema.Int, Schema.Int, Schema.Int, Schema.Int),
  dtype: Schema.Literal("float32", "float16"),
  prompt_tokens: Schema.Int,
  /** Of the positions sent, those this executor's prefix cache held: not run again. */
  cached_tokens: Schema.Int
})
export type KvPrefillResponse = typeof KvPrefillResponse.Type

/** A streamed chunk as the executor sends it: OpenAI's, with the token ids it says when they were asked for. */
export const LlmChunk = Schema.extend(
  OpenAI.ChatCompletionChunk,
  Schema.Struct({ cornserve_token_ids: Schema.optional(Schema.Array(Schema.Int)) })
)
export type LlmChunk = typeof LlmChunk.Type

export {
  ChatCompletion,
  ChatCompletionChunk,
  CompletionUsage as Usage,
  FinishReason
} from "../../app-runtime/schemas/OpenAI.js"

export const ModelList = Schema.Struct({
  object: Schema.Literal("list"),
  data: Schema.Array(
    Schema.Struct({
      id: Schema.String,
      object: Schema.Literal("model"),
      created: Schema.Int,
      owned_by: Schema.String,
      max_model_len: Schema.Int
    })
  )
})
export type ModelList = typeof ModelList.Type

/** What a prompt's embeddings are: the embedding table's rows (media spliced in), or the decoder's final hidden states. */
export const EmbeddingSource = Schema.Literal("embed_tokens", "hidden_states")
export type EmbeddingSource = typeof EmbeddingSource.Type

/** A completion before a prompt's hidden states are taken: greedy unless `temperature` says. */
export const PromptGeneration = Schema.Struct({
  /** By default, as a chat completion's: what the model's generation config and context leave. */
  max_tokens: Schema.optional(Schema.Int.pipe(Schema.between(1, 1_000_000))),
  temperature: Schema.optional(Schema.Number.pipe(Schema.between(0, 2))),
  seed: Schema.optional(Schema.Int),
  /**
   * Stream the hidden states as they are computed: the prompt's as chunk 0 of the sidecar stream
   * `id`, then each generated token's, [1, hidden], as the next step reads it (the last token's is
   * never computed), and the text's pieces, as they are said, as strings on the stream
   * `transcript` names. The answer is NDJSON: the prompt's shape at once (a
   * PromptEmbeddingsResponse), then a `StatesDone` line, or an error line.
   */
  stream: Schema.optional(Schema.Boolean),
  transcript: Schema.optional(Schema.Struct({ id: DataId, receivers: Schema.optional(Schema.Array(Schema.String)) }))
})
export type PromptGeneration = typeof PromptGeneration.Type

export const PromptEmbeddingsRequest = Schema.Struct({
  /** Checked when given, as in chat completions. */
  model: Schema.optional(Schema.String),
  /** Rendered with the chat template (without the generation prompt unless asked)… */
  messages: Schema.optional(Schema.NonEmptyArray(ChatMessage)),
  add_generation_prompt: Schema.optionalWith(Schema.Boolean, { default: () => false }),
  /** …or plain text, tokenized as it is. */
  prompt: Schema.optional(Schema.String),
  cornserve_parse_special_tokens: Schema.optional(Schema.Boolean),
  cornserve_embeddings: Schema.optional(Schema.Array(EmbeddingRef)),
  /** The sidecar id the [rows, hidden] float32 tensor goes out under. */
  id: DataId,
  /** Node ids that receive it (default: this node). */
  receivers: Schema.optional(Schema.Array(Schema.String)),
  source: Schema.optionalWith(EmbeddingSource, { default: () => "embed_tokens" as const }),
  return: Schema.optionalWith(Schema.Literal("sidecar", "inline"), { default: () => "sidecar" as const }),
  /**
   * With source "hidden_states": first answer the messages (rendered with the generation prompt),
   * then give the hidden states of the prompt and the generated tokens, [prompt + generated, hidden].
   */
  generate: Schema.optional(PromptGeneration)
})
export type PromptEmbeddingsRequest = typeof PromptEmbeddingsRequest.Type

export const PromptEmbeddingsResponse = Schema.Struct({
  id: Schema.String,
  source: EmbeddingSource,
  dtype: Schema.Literal("float32"),
  shape: Schema.Tuple(Schema.Int, Schema.Int),
  /** Row-major, with `return: "inline"` only. */
  embedding: Schema.optional(Schema.Array(Schema.Number)),
  /** With `generate`: what was generated, whose tokens are the last rows. */
  completion: Schema.optional(
    Schema.Struct({
      text: Schema.String,
      token_ids: Schema.Array(Schema.Int),
      finish_reason: OpenAI.FinishReason
    })
  )
})
export type PromptEmbeddingsResponse = typeof PromptEmbeddingsResponse.Type

/** The last line of a streamed generation's hidden states: what was generated. */
export const StatesDone = Schema.Struct({
  done: Schema.Literal(true),
  completion: Schema.Struct({
    text: Schema.String,
    token_ids: Schema.Array(Schema.Int),
    finish_reason: OpenAI.FinishReason
  })
})
export type StatesDone = typeof StatesDone.Type

/**
 * A chunk of a streamed generation's transcript (PromptGeneration's `transcript`), a JSON string:
 * a piece of its text as it is said, then, last, how it ended.
 */
export const TranscriptChunk = Schema.Union(
  Schema.Struct({ text: Schema.String }),
  Schema.Struct({ finish_reason: OpenAI.FinishReason, completion_tokens: Schema.Int })
)
export type TranscriptChunk = typeof TranscriptChunk.Type

/** A line of a streamed generation's answer after the first: its end, or a failure midway. */
export const StatesLine = Schema.Union(StatesDone, Schema.Struct({ error: Schema.Unknown }))

export const LlmStats = Schema.Struct({
  /**
   * The decoder it runs: its file (in the model's folder), its dtype, and how a 4-bit decoder's
   * products compute ("int8": activations quantized to int8, `--q4-activations int8`; "exported":
   * as its export says). Absent from a Janus-Pro executor's.
   */
  decoder: Schema.optional(
    Schema.Struct({
      file: Schema.String,
      dtype: Schema.String,
      q4Activations: Schema.optional(Schema.Literal("exported", "int8"))
    })
  ),
  waiting: Schema.Int,
  running: Schema.Int,
  /** Requests decoding together on a device. */
  maxBatchSize: Schema.Int,
  /** Prompt tokens a step prefills while others decode (absent: sized to the decode step; 0: whole prompts). */
  prefillChunkTokens: Schema.optional(Schema.Int),
  /** The KV cache: its budget per device and what running requests hold of it, over all devices. */
  kvCache: Schema.Struct({
    /** Positions running requests reserved (prompt and max_tokens). */
    usedTokens: Schema.Int,
    /** The budget per device (`kvCacheBytes`): running requests' rows and the prefix cache together. */
    budgetBytes: Schema.Int,
    /** Of it, the prefix cache's share per device. */
    prefixBytes: Schema.Int,
    /** Bytes one position of one request takes. */
    bytesPerPosition: Schema.Int,
    /** Bytes running requests' rows reserve now, over all devices (each row as wide as the longest). */
    reservedBytes: Schema.Int,
    /**
     * "shared": the cache is in buffers the executor owns, which the decoder's attention
     * (rewritten at load time) reads in place; "copies": the decoder as exported, which copies
     * the whole cache at every step, and `reason` says why.
     */
    mode: Schema.optional(Schema.Literal("shared", "copies")),
    reason: Schema.optional(Schema.String),
    /** Bytes the shared cache's buffers take now, over all devices. */
    bytes: Schema.optional(Schema.Int)
  }),
  finished: Schema.Int,
  cancelled: Schema.Int,
  /** The most requests that decoded together in one step so far. */
  largestBatch: Schema.Int,
  /** The prefix cache, all devices together (absent when the executor keeps none). */
  prefixCache: Schema.optional(
    Schema.Struct({
      /** Prompts looked up, and those that found cached blocks. */
      lookups: Schema.Int,
      hits: Schema.Int,
      /** Prompt tokens not prefilled because they were cached. */
      hitTokens: Schema.Int,
      blocks: Schema.Int,
      bytes: Schema.Int,
      maxBytes: Schema.Int,
      evictions: Schema.Int
    })
  ),
  /** Requests that took a KV cache another executor prefilled (cornserve_kv), and its positions. */
  kvImports: Schema.optional(Schema.Struct({ requests: Schema.Int, tokens: Schema.Int })),
  /**
   * Where the workers' time goes, all devices together (absent from a Janus-Pro or talker executor's):
   * the steps that prefilled or decoded and their seconds, and of those seconds, the decoder's runs
   * in ONNX Runtime. What is left (sampling, the cache's bookkeeping, streaming tokens out) is
   * `seconds - decoderSeconds`.
   */
  steps: Schema.optional(
    Schema.Struct({
      count: Schema.Int,
      seconds: Schema.Number,
      decoderRuns: Schema.Int,
      decoderSeconds: Schema.Number
    })
  )
})
export type LlmStats = typeof LlmStats.Type

/**
 * An image's tokens for a prompt (a Janus-Pro model), chosen as transformers.js's generate_images
 * chooses them and sent as one int64 [1, image tokens] tensor through the sidecar.
 */
export const ImageTokensRequest = Schema.Struct({
  /** Checked when given, as in chat completions. */
  model: Schema.optional(Schema.String),
  /** What to paint, rendered with the model's "text_to_image" chat template as the user's message. */
  prompt: Schema.String.pipe(Schema.minLength(1), Schema.maxLength(32_000)),
  /** The sidecar id the tokens go out under. */
  id: DataId,
  /** Node ids that receive them (default: this node). */
  receivers: Schema.optional(Schema.Array(Schema.String)),
  /** Classifier-free guidance: the model's generation_config.json guidance_scale when left out; 1 or less turns it off. */
  guidanceScale: Schema.optional(Schema.Number.pipe(Schema.between(0, 100))),
  /** 0 (the default) chooses the most likely token; above 0, a draw from the seeded generator. */
  temperature: Schema.optional(Schema.Number.pipe(Schema.between(0, 2))),
  seed: Schema.optional(Schema.Int)
})
export type ImageTokensRequest = typeof ImageTokensRequest.Type

export const ImageTokensResponse = Schema.Struct({
  id: Schema.String,
  /** How many tokens were sent: the model's image tokens. */
  tokens: Schema.Int
})
export type ImageTokensResponse = typeof ImageTokensResponse.Type

/** A talker's frames for a thinker's hidden states, which another executor sent through the sidecar. */
export const TalkRequest = Schema.Struct({
  /** Checked when given, as in chat completions. */
  model: Schema.optional(Schema.String),
  /** The sidecar id of the hidden states: float32 [rows, thinker hidden], in one chunk or more. */
  embeddings: DataId,
  /** Frames at most (the model's default_max_frames when left out). */
  maxFrames: Schema.optional(Schema.Int.pipe(Schema.between(1, 7500))),
  /** 0 (the default) chooses each frame's first code greedily; above 0, a draw from the seeded generator. */
  temperature: Schema.optional(Schema.Number.pipe(Schema.between(0, 2))),
  topP: Schema.optional(Schema.Number.pipe(Schema.between(0, 1))),
  seed: Schema.optional(Schema.Int),
  /**
   * The hidden states stream in (a thinker's generation streamed): their first chunk is the
   * prompt, and each later chunk's rows are added, one a step, to the frames' inputs, frame k + 1
   * taking row k; a step waits for its row until the stream ends.
   */
  trailing: Schema.optional(Schema.Boolean),
  /**
   * The sidecar id of the thinker's transcript (TranscriptChunk), passed on as `{ text }` lines as
   * its pieces come, then a `{ textDone }` line.
   */
  transcript: Schema.optional(DataId)
})
export type TalkRequest = typeof TalkRequest.Type

/** One line of a talk answer: a frame (a code per codebook), the end, or a failure midway. */
export const TalkLine = Schema.Union(
  Schema.Struct({ frame: Schema.Array(Schema.Int) }),
  Schema.Struct({ text: Schema.String }),
  /** The thinker's text ended: how, and its tokens. */
  Schema.Struct({ textDone: Schema.Struct({ finishReason: OpenAI.FinishReason, completionTokens: Schema.Int }) }),
  Schema.Struct({
    done: Schema.Literal(true),
    frames: Schema.Int,
    finishReason: Schema.Literal("stop", "length"),
    frameRate: Schema.Number
  }),
  Schema.Struct({ error: Schema.Unknown })
)
export type TalkLine = typeof TalkLine.Type
