import { Schema } from "effect"
import { DataId } from "../common/DataId.js"

/**
 * Eric's HTTP API, shared by the executor and the task dispatcher.
 *
 * `POST /embeddings`: each item's media is embedded and the embedding is sent through the sidecar
 * under the item's id to the receiving nodes (`return: "sidecar"`, the default), or put in the
 * answer (`return: "inline"`, for debugging and tests).
 */

export const EmbeddingItem = Schema.Struct({
  id: DataId,
  modality: Schema.Literal("image", "video", "audio"),
  /** A data: URL, a file: URL under the executor's media root, or http(s). */
  url: Schema.String,
  /** Node ids that receive this item's embedding (default: the request's receivers). */
  receivers: Schema.optional(Schema.Array(Schema.String))
})
export type EmbeddingItem = typeof EmbeddingItem.Type

export const EmbeddingsRequest = Schema.Struct({
  items: Schema.NonEmptyArray(EmbeddingItem),
  /** Node ids that receive the embeddings (default: this node). */
  receivers: Schema.optional(Schema.Array(Schema.String)),
  return: Schema.optionalWith(Schema.Literal("sidecar", "inline"), { default: () => "sidecar" as const })
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
