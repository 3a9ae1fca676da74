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
  /**
   * A half of a DisaggregatedLLMTask (PrefillLLMTask, DecodeLLMTask): a deployment of its own,
   * scaled apart from the other half's and from plain LLM tasks on the model.
   */
  phase: Schema.optional(Schema.Literal("prefill", "decode")),
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
const trusting = <I extends LLMInput>(input: I, options: LLMTaskOptions): I =>
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

/** What an LLMEmbeddingTask forwards: the prompt's input embeddings, or the decoder's final hidden states. */
export const PromptEmbeddingSource = Schema.Literal("embed_tokens", "hidden_states")
export type PromptEmbeddingSource = typeof PromptEmbeddingSource.Type

/** An LLMEmbeddingTask's input: a chat request, and which embeddings of its prompt are forwarded. */
export const LLMEmbeddingInput = Schema.extend(
  LLMInput,
  Schema.Struct({
    /** The task's `source` unless the call says (see LLMEmbeddingTaskOptions). */
    embeddingSource: Schema.optional(PromptEmbeddingSource),
    /** The task's `generate` unless the call says (see LLMEmbeddingTaskOptions). */
    embeddingGenerate: Schema.optional(Schema.Union(Schema.Boolean, Schema.Literal("stream")))
  })
)
export type LLMEmbeddingInput = typeof LLMEmbeddingInput.Type

export interface LLMEmbeddingTaskOptions extends LLMTaskOptions {
  /**
   * "embed_tokens" (the default): the embedding table's rows for the prompt's tokens, media spliced
   * in, as the decoder takes them. "hidden_states": the decoder's final hidden states over the
   * prompt (the final norm's output, what its lm_head reads; a text-generation export is opened
   * rewritten to give them), for another model conditioned on this one's.
   */
  readonly source?: PromptEmbeddingSource
  /**
   * With source "hidden_states": first answer the call's messages (its `max_tokens`, `temperature`
   * and `seed`; greedy by default), then forward the hidden states of the prompt and of the tokens
   * generated, [prompt + generated, hidden]; the output's `completion` says what was generated.
   *
   * "stream": the hidden states stream as they are computed, for a talker to read as the answer
   * is generated (TalkerTask's `trailing`). The call answers once the prompt's are sent, as chunk 0
   * of the stream (`shape` is theirs); each generated token's follows as the next step reads it
   * (the last token's is never computed), and the text goes as it is said to `transcript`.
   */
  readonly generate?: boolean | "stream"
}

export interface LLMEmbeddingOutput {
  /** The embeddings, float32 [prompt tokens, hidden], for a generator or another model to take. */
  readonly embeddings: DataForward<"Tensor">
  /** Their shape and dtype, once the call has run (not while an app's graph is being recorded). */
  readonly shape?: readonly [rows: number, hidden: number]
  readonly dtype?: "float32"
  /** With generate "stream": the answer's text, piece by piece as it is said, for a talker to pass on. */
  readonly transcript?: DataForward<"string">
  /** With `generate` (not "stream"): the answer, whose tokens are the embeddings' last rows. */
  readonly completion?: {
    readonly text: string
    readonly tokenIds: ReadonlyArray<number>
    readonly finishReason: "stop" | "length" | "tool_calls"
  }
}

/**
 * Runs an LLM over a prompt and forwards its embeddings (see `source`) through the sidecar. An
 * LLMEmbeddingTask and an LLMTask with the same config are the same deployment: one executor
 * serves both.
 */
export class LLMEmbeddingTask extends UnitTask<LLMEmbeddingInput, LLMEmbeddingOutput, typeof LLMConfig.Type> {
  readonly operation = "hidden-states"
  readonly name: string
  protected readonly inputSchema = LLMEmbeddingInput
  private readonly options: LLMTaskOptions
  private readonly source: PromptEmbeddingSource | undefined
  private readonly generate: boolean | "stream" | undefined

  constructor({ parseSpecialTokensInContent, source, generate, ...config }: LLMConfig & LLMEmbeddingTaskOptions) {
    super("llm", LLMConfig, config)
    this.name = `llm-${modelShortName(this.config.model)}`
    this.options = parseSpecialTokensInContent === undefined ? {} : { parseSpecialTokensInContent }
    this.source = source
    this.generate = generate
  }

  override compose(input: LLMEmbeddingInput): LLMEmbeddingOutput {
    const trusted = trusting(input, this.options)
    return super.compose({
      ...trusted,
      ...(this.source === undefined || trusted.embeddingSource !== undefined ? {} : { embeddingSource: this.source }),
      ...(this.generate === undefined || trusted.embeddingGenerate !== undefined
        ? {}
        : { embeddingGenerate: this.generate })
    })
  }

  protected makeRecordOutput(input: LLMEmbeddingInput): LLMEmbeddingOutput {
    return {
      embeddings: new DataForward("Tensor"),
      ...(input.embeddingGenerate === "stream" ? { transcript: new DataForward("string") } : {})
    }
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
