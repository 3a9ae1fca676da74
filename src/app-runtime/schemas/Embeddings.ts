import * as Schema from "effect/Schema"

/**
 * OpenAI's embeddings (`POST /v1/embeddings`): the request every OpenAI client sends and the answer
 * it reads. An app whose request is `EmbeddingRequest` and whose `serve` answers a
 * `TextEmbeddingTask`'s output is an embeddings app.
 */

const optionalNullable = <S extends Schema.Schema.Any>(schema: S) => Schema.optional(Schema.NullOr(schema))

const TokenIds = Schema.Array(Schema.Int)

/**
 * What to embed and how. `input` is one text, several, or their token ids (taken as they are, no
 * special tokens added). Its contents (not empty, at most 2048 inputs, ids the model has) are
 * checked by the task that embeds them, whose refusal is a 400 naming the input.
 */
export const EmbeddingRequest = Schema.Struct({
  input: Schema.Union(Schema.String, Schema.Array(Schema.String), TokenIds, Schema.Array(TokenIds)),
  /** The model asked for; an app answers with the model its task serves. */
  model: optionalNullable(Schema.String),
  /** `float` (the default): arrays of numbers; `base64`: each vector's little-endian float32 bytes, base64. */
  encoding_format: optionalNullable(Schema.Literal("float", "base64")),
  /** Vectors cut to their first `dimensions` values and normalized again: Matryoshka models only. */
  dimensions: optionalNullable(Schema.Int),
  /** The end user, as OpenAI's clients name them: taken, not used. */
  user: Schema.optional(Schema.String.pipe(Schema.maxLength(256))),
  /**
   * vLLM's extension: an input longer than the model takes is cut to this many tokens (its first
   * ones, special tokens kept; -1: the model's limit) instead of refused.
   */
  truncate_prompt_tokens: optionalNullable(Schema.Int)
}).annotations({ identifier: "EmbeddingRequest" })
export type EmbeddingRequest = typeof EmbeddingRequest.Type

/** One input's vector, at its index among the inputs. */
export const Embedding = Schema.Struct({
  object: Schema.Literal("embedding"),
  index: Schema.Int,
  embedding: Schema.Union(Schema.Array(Schema.Number), Schema.String)
}).annotations({ identifier: "Embedding" })
export type Embedding = typeof Embedding.Type

export const EmbeddingUsage = Schema.Struct({ prompt_tokens: Schema.Int, total_tokens: Schema.Int })
export type EmbeddingUsage = typeof EmbeddingUsage.Type

export const EmbeddingResponse = Schema.Struct({
  object: Schema.Literal("list"),
  data: Schema.Array(Embedding),
  model: Schema.String,
  usage: EmbeddingUsage
}).annotations({ identifier: "EmbeddingResponse" })
export type EmbeddingResponse = typeof EmbeddingResponse.Type
