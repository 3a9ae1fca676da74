import * as Schema from "effect/Schema"
import { ModelDtype } from "../schemas/ModelDtype.js"
import { type ChatCompletionChunk, ChatCompletionRequest } from "../schemas/OpenAI.js"
import { DataForward } from "./DataForward.js"
import { LlmEngineSettings, prefixWithinKvCache } from "./EngineSettings.js"
import { modelShortName, ScalingBounds, UnitTask } from "./Task.js"
import { TaskStream } from "./TaskStream.js"

export const LLMConfig = Schema.Struct({
  model: Schema.NonEmptyTrimmedString,
  /** Which of the model's ONNX exports runs; by default fp32, or the closest there is. */
  dtype: Schema.optional(ModelDtype),
  /** Media arrives as embeddings from encoder tasks through the sidecar, not encoded in-process. */
  receiveEmbeddings: Schema.optionalWith(Schema.Boolean, { default: () => false }),
  ...LlmEngineSettings,
  ...ScalingBounds
}).pipe(Schema.filter(prefixWithinKvCache))
export type LLMConfig = typeof LLMConfig.Encoded

/** A chat request plus the embeddings (one per media part, in order) that encoder tasks produce. */
export const LLMInput = Schema.extend(
  ChatCompletionRequest,
  Schema.Struct({
    cornserveEmbeddings: Schema.optional(Schema.Array(Schema.instanceOf(DataForward))),
    /**
     * The messages are the app's own trusted prompt: a special token spelled in their texts
     * (`<|im_start|>`) is the model's special token. Without it, as for any client's text, it is
     * its characters. A field of the app's input to the task, not of the OpenAI request clients send.
     */
    parseSpecialTokensInContent: Schema.optional(Schema.Boolean)
  })
)
export type LLMInput = typeof LLMInput.Type

/** Settings of an LLM task that are not its deployment's: tasks that differ in them share executors. */
export interface LLMTaskOptions {
  /** Every call's messages are the app's own trusted prompt (see LLMInput's `parseSpecialTokensInContent`). */
  readonly parseSpecialTokensInContent?: boolean
}

/** A call's input with the task's default for trusting its messages, unless the call says. */
const trusting = (input: LLMInput, options: LLMTaskOptions): LLMInput =>
  options.parseSpecialTokensInContent === true && input.parseSpecialTokensInContent === undefined
    ? { ...input, parseSpecialTokensInContent: true }
    : input

/** Text generation with an LLM (the LLM executor); answers a stream of chat-completion chunks. */
export class LLMTask extends UnitTask<LLMInput, TaskStream<ChatCompletionChunk>, typeof LLMConfig.Type> {
  readonly operation = "chat"
  readonly name: string
  protected readonly inputSchema = LLMInput
  private readonly options: LLMTaskOptions

  constructor({ parseSpecialTokensInContent, ...config }: LLMConfig & LLMTaskOptions) {
    super("llm", LLMConfig, config)
    this.name = `llm-${modelShortName(this.config.model)}`
    this.options = parseSpecialTokensInContent === undefined ? {} : { parseSpecialTokensInContent }
  }

  override compose(input: LLMInput): TaskStream<ChatCompletionChunk> {
    return super.compose(trusting(input, this.options))
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
  private readonly options: LLMTaskOptions

  constructor({ parseSpecialTokensInContent, ...config }: LLMConfig & LLMTaskOptions) {
    super("llm", LLMConfig, config)
    this.name = `llm-${modelShortName(this.config.model)}`
    this.options = parseSpecialTokensInContent === undefined ? {} : { parseSpecialTokensInContent }
  }

  override compose(input: LLMInput): LLMEmbeddingOutput {
    return super.compose(trusting(input, this.options))
  }

  protected makeRecordOutput(): LLMEmbeddingOutput {
    return { embeddings: new DataForward("Tensor") }
  }
}

/** What to paint, and how the image's tokens are chosen. */
export const LLMImageTokensInput = Schema.Struct({
  /** The user's message, rendered with the model's "text_to_image" chat template. */
  prompt: Schema.String.pipe(Schema.minLength(1), Schema.maxLength(32_000)),
  /** Classifier-free guidance (the model's guidance_scale when left out; 1 or less turns it off). */
  guidanceScale: Schema.optional(Schema.Number.pipe(Schema.between(0, 100))),
  /** 0 (the default) takes the most likely token each step; above 0, a draw seeded by `seed`. */
  temperature: Schema.optional(Schema.Number.pipe(Schema.between(0, 2))),
  seed: Schema.optional(Schema.Int)
})
export type LLMImageTokensInput = typeof LLMImageTokensInput.Type

export interface LLMImageTokensOutput {
  /** The image's tokens, int64 [1, image tokens], for an ImageGeneratorTask on the same model to decode. */
  readonly tokens: DataForward<"Tensor">
}

/**
 * An image's tokens from a text-to-image LLM (Janus-Pro: the LLM executor chooses them with
 * classifier-free guidance), forwarded through the sidecar to an ImageGeneratorTask of the same
 * model, which decodes them to pixels. The same config as an LLMTask's is the same deployment.
 */
export class LLMImageTokensTask extends UnitTask<LLMImageTokensInput, LLMImageTokensOutput, typeof LLMConfig.Type> {
  readonly operation = "image-tokens"
  readonly name: string
  protected readonly inputSchema = LLMImageTokensInput

  constructor(config: LLMConfig) {
    super("llm", LLMConfig, config)
    this.name = `llm-${modelShortName(this.config.model)}`
  }

  protected makeRecordOutput(): LLMImageTokensOutput {
    return { tokens: new DataForward("Tensor") }
  }
}
