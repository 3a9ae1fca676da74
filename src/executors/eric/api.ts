import * as Schema from "effect/Schema"
import { MediaProcessorOptions } from "../../app-runtime/schemas/OpenAI.js"
import { Pooling } from "../../models/TextEmbedding.js"
import { DataId } from "../common/DataId.js"

/**
 * Eric's HTTP API, shared by the executor and the task dispatcher.
 *
 * `POST /embeddings`: each item's media is embedded and the embedding is sent through the sidecar
 * under the item's id to the receiving nodes (`return: "sidecar"`, the default), or put in the
 * answer (`return: "inline"`, for debugging and tests).
 *
 * `POST /text-embeddings`: each input (a text, or its token ids) becomes one vector of a text
 * embedding model, answered inline.
 */

export const EmbeddingItem = Schema.Struct({
  id: DataId,
  modality: Schema.Literal("image", "video", "audio"),
  /** A data: URL, a file: URL under the executor's media root, or http(s). */
  url: Schema.String,
  /** Node ids that receive this item's embedding (default: the request's receivers). */
  receivers: Schema.optional(Schema.Array(Schema.String)),
  /** Whose projector embeds it: the executor's model (the default) or one of its adapters. */
  model: Schema.optional(Schema.String)
})
export type EmbeddingItem = typeof EmbeddingItem.Type

export const EmbeddingsRequest = Schema.Struct({
  items: Schema.NonEmptyArray(EmbeddingItem),
  /** Node ids that receive the embeddings (default: this node). */
  receivers: Schema.optional(Schema.Array(Schema.String)),
  return: Schema.optionalWith(Schema.Literal("sidecar", "inline"), { default: () => "sidecar" as const }),
  /** The media processor's settings for the images and videos (Qwen2-VL models only). */
  processor: Schema.optional(MediaProcessorOptions)
})
export type EmbeddingsRequest = typeof EmbeddingsRequest.Type

export const EmbeddingResult = Schema.Struct({
  id: Schema.String,
  modality: Schema.Literal("image", "video", "audio"),
  dtype: Schema.Literal("float32"),
  /** [rows, hidden]: rows are the feature positions (all frames' for a video). */
  shape: Schema.Tuple(Schema.Int, Schema.Int),
  /** Row-major, with `return: "inline"` only. */
  embedding: Schema.optional(Schema.Array(Schema.Number))
})
export type EmbeddingResult = typeof EmbeddingResult.Type

export const EmbeddingsResponse = Schema.Struct({ items: Schema.Array(EmbeddingResult) })
export type EmbeddingsResponse = typeof EmbeddingsResponse.Type

/** At most this many inputs in one text-embedding request, as OpenAI's embeddings take. */
export const maxTextEmbeddingInputs = 2048

const TokenId = Schema.Int.pipe(Schema.nonNegative())

export const TextEmbeddingsRequest = Schema.Struct({
  /** Each input: a text (tokenized with the model's special tokens), or token ids taken as they are. */
  inputs: Schema.NonEmptyArray(Schema.Union(Schema.String, Schema.Array(TokenId))).pipe(
    Schema.maxItems(maxTextEmbeddingInputs)
  ),
  /**
   * Cut an input longer than this many tokens to its first ones (special tokens kept) instead of
   * refusing it; -1 is the model's limit (vLLM's `truncate_prompt_tokens`).
   */
  truncate: Schema.optional(Schema.Int.pipe(Schema.greaterThanOrEqualTo(-1))),
  /** Each vector's first `dimensions` values, normalized again (Matryoshka models only). */
  dimensions: Schema.optional(Schema.Int),
  /** The task's own pooling and normalization, over what the model's files say. */
  pooling: Schema.optional(Pooling),
  normalize: Schema.optional(Schema.Boolean)
})
export type TextEmbeddingsRequest = typeof TextEmbeddingsRequest.Type

export const TextEmbeddingsResponse = Schema.Struct({
  /** One per input, in order: its vector as little-endian float32, base64 (exact, and a third the size of JSON numbers). */
  embeddings: Schema.Array(Schema.String),
  /** The tokens the inputs ran with, special tokens included. */
  promptTokens: Schema.Int
})
export type TextEmbeddingsResponse = typeof TextEmbeddingsResponse.Type

/**
 * `POST /transcriptions` (a Whisper model's): one clip's transcript. The router cuts the clip in
 * windows, runs their passes through the engine (batched with other requests' windows) and stitches
 * the windows' texts.
 */
export const TranscriptionsRequest = Schema.Struct({
  /** A data: URL, a file: URL under the executor's media root, or http(s). */
  url: Schema.String,
  language: Schema.optional(Schema.String),
  task: Schema.optional(Schema.Literal("transcribe", "translate")),
  /** Segment timestamps in the answer. */
  timestamps: Schema.optionalWith(Schema.Boolean, { default: () => false }),
  /** Windows of this many seconds for long audio; absent: 30 s windows when the clip is longer than 30 s. */
  chunkSeconds: Schema.optional(Schema.Number.pipe(Schema.positive(), Schema.lessThanOrEqualTo(30))),
  strideSeconds: Schema.optional(Schema.Number.pipe(Schema.nonNegative()))
})
export type TranscriptionsRequest = typeof TranscriptionsRequest.Type

export const TranscriptionsResponse = Schema.Struct({
  text: Schema.String,
  language: Schema.String,
  task: Schema.Literal("transcribe", "translate"),
  /** Seconds of audio. */
  duration: Schema.Number,
  segments: Schema.optional(
    Schema.Array(Schema.Struct({ start: Schema.Number, end: Schema.NullOr(Schema.Number), text: Schema.String }))
  ),
  /** Tokens the model generated over all windows, prompts not counted. */
  tokens: Schema.Int
})
export type TranscriptionsResponse = typeof TranscriptionsResponse.Type
