import { Schema } from "effect"
import { ModelDtype } from "../schemas/ModelDtype.js"
import { type ChatCompletionChunk, ChatCompletionRequest } from "../schemas/OpenAI.js"
import { DataForward } from "./DataForward.js"
import { modelShortName, ScalingBounds, UnitTask } from "./Task.js"
import { TaskStream } from "./TaskStream.js"

export const LLMConfig = Schema.Struct({
  model: Schema.NonEmptyTrimmedString,
  /** Which of the model's ONNX exports runs; by default fp32, or the closest there is. */
  dtype: Schema.optional(ModelDtype),
  /** Media arrives as embeddings from encoder tasks through the sidecar, not encoded in-process. */
  receiveEmbeddings: Schema.optionalWith(Schema.Boolean, { default: () => false }),
  ...ScalingBounds
})
export type LLMConfig = typeof LLMConfig.Encoded

/** A chat request plus the embeddings (one per media part, in order) that encoder tasks produce. */
export const LLMInput = Schema.extend(
  ChatCompletionRequest,
  Schema.Struct({ cornserveEmbeddings: Schema.optional(Schema.Array(Schema.instanceOf(DataForward))) })
)
export type LLMInput = typeof LLMInput.Type

/** Text generation with an LLM (the LLM executor); answers a stream of chat-completion chunks. */
export class LLMTask extends UnitTask<LLMInput, TaskStream<ChatCompletionChunk>, typeof LLMConfig.Type> {
  readonly operation = "chat"
  readonly name: string
  protected readonly inputSchema = LLMInput

  constructor(config: LLMConfig) {
    super("llm", LLMConfig, config)
    this.name = `llm-${modelShortName(this.config.model)}`
  }

  protected makeRecordOutput(): TaskStream<ChatCompletionChunk> {
    return TaskStream.placeholder()
  }
}

export interface LLMEmbeddingOutput {
  /** The model's final hidden states over the prompt, for a generator to take. */
  readonly embeddings: DataForward<"Tensor">
}

/**
 * Runs an LLM over a prompt and forwards its hidden states through the sidecar. An LLMEmbeddingTask
 * and an LLMTask with the same config are the same deployment: one executor serves both.
 */
export class LLMEmbeddingTask extends UnitTask<LLMInput, LLMEmbeddingOutput, typeof LLMConfig.Type> {
  readonly operation = "hidden-states"
  readonly name: string
  protected readonly inputSchema = LLMInput

  constructor(config: LLMConfig) {
    super("llm", LLMConfig, config)
    this.name = `llm-${modelShortName(this.config.model)}`
  }

  protected makeRecordOutput(): LLMEmbeddingOutput {
    return { embeddings: new DataForward("Tensor") }
  }
}
