import * as Schema from "effect/Schema"
import { EmbeddingRequest, type EmbeddingResponse } from "../schemas/Embeddings.js"
import { ModelDtype } from "../schemas/ModelDtype.js"
import { BatchSettings } from "./EngineSettings.js"
import { modelShortName, ScalingBounds, UnitTask } from "./Task.js"

/** How a text's token embeddings become one vector: their mean, the first ([CLS]), or the last. */
export const TextPooling = Schema.Literal("mean", "cls", "last")
export type TextPooling = typeof TextPooling.Type

export const TextEmbeddingConfig = Schema.Struct({
  model: Schema.NonEmptyTrimmedString,
  /** Which of the model's ONNX exports runs; by default fp32, or the closest there is. */
  dtype: Schema.optional(ModelDtype),
  /**
   * The pooling, for a model whose sentence-transformers files (modules.json, 1_Pooling/config.json)
   * do not say it, or to override them.
   */
  pooling: Schema.optional(TextPooling),
  /** Whether vectors are scaled to unit length; by default as modules.json says, else yes. */
  normalize: Schema.optional(Schema.Boolean),
  /** Inputs the executor runs in one batch, from one request or several. */
  maxBatchSize: Schema.optionalWith(Schema.Int.pipe(Schema.between(1, 4096)), { default: () => 32 }),
  ...BatchSettings,
  ...ScalingBounds
})
export type TextEmbeddingConfig = typeof TextEmbeddingConfig.Encoded

/** At most this many inputs in one request, as OpenAI's embeddings take. */
export const maxEmbeddingInputs = 2048

/** A request's inputs as a list: texts, or token-id lists. */
export const embeddingInputs = (input: EmbeddingRequest["input"]): ReadonlyArray<string | ReadonlyArray<number>> => {
  if (typeof input === "string") return [input]
  if (input.length > 0 && typeof input[0] === "number") return [input as ReadonlyArray<number>]
  return input as ReadonlyArray<string | ReadonlyArray<number>>
}

/** Where and why a request's inputs cannot be embedded (nothing, too many, an empty one, a negative id). */
const inputProblem = (
  input: EmbeddingRequest["input"]
): { readonly path: ReadonlyArray<string | number>; readonly message: string } | undefined => {
  const inputs = embeddingInputs(input)
  if (inputs.length === 0) return { path: ["input"], message: "must not be empty" }
  if (inputs.length > maxEmbeddingInputs) {
    return {
      path: ["input"],
      message: `has ${inputs.length} items; at most ${maxEmbeddingInputs} are embedded at once`
    }
  }
  const nested = Array.isArray(input) && inputs.length === input.length && typeof input[0] !== "number"
  for (const [index, item] of inputs.entries()) {
    const path = nested ? ["input", index] : ["input"]
    if (item.length === 0) return { path, message: "is empty" }
    if (typeof item !== "string" && item.some((id) => id < 0)) return { path, message: "has a negative token id" }
  }
  return undefined
}

/** An embeddings request whose inputs can be embedded; a refusal is the request's fault, answered 400. */
export const TextEmbeddingInput = EmbeddingRequest.pipe(
  Schema.filter((request) => inputProblem(request.input) ?? true),
  Schema.filter((request) =>
    request.dimensions === undefined || request.dimensions === null || request.dimensions >= 1
      ? true
      : { path: ["dimensions"], message: "must be at least 1" }
  )
)
export type TextEmbeddingInput = typeof TextEmbeddingInput.Type

/**
 * Embeds texts (or token ids) with a text embedding model on Eric, as OpenAI's embeddings do: one
 * vector per input, pooled and normalized as the model says, answered inline. Inputs of one request,
 * and of requests arriving together, run as padded batches.
 */
export class TextEmbeddingTask extends UnitTask<
  TextEmbeddingInput,
  EmbeddingResponse,
  typeof TextEmbeddingConfig.Type
> {
  readonly operation = "embed-text"
  readonly name: string
  protected readonly inputSchema = TextEmbeddingInput

  constructor(config: TextEmbeddingConfig) {
    super("text-embedder", TextEmbeddingConfig, config)
    this.name = `text-embedder-${modelShortName(this.config.model)}`
  }

  protected makeRecordOutput(): EmbeddingResponse {
    return { object: "list", data: [], model: this.config.model, usage: { prompt_tokens: 0, total_tokens: 0 } }
  }

  /** Vectors only, no forwarded data: the answer is used as it arrives. */
  protected override reviveOutput(output: unknown): EmbeddingResponse {
    return output as EmbeddingResponse
  }
}
