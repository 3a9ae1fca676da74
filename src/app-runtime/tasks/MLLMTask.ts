import * as Schema from "effect/Schema"
import { type ChatCompletionChunk, type ChatCompletionRequest, chatMediaParts } from "../schemas/OpenAI.js"
import type { DataForward } from "./DataForward.js"
import { EncoderTask, Modality } from "./EncoderTask.js"
import { ModelDtype } from "../schemas/ModelDtype.js"
import { DisaggregatedLLMTask } from "./DisaggregatedLLMTask.js"
import { LLMTask } from "./LLMTask.js"
import { EncoderSettings, LlmSettings } from "./EngineSettings.js"
import { CompositeTask, ScalingBounds, TaskConfigError } from "./Task.js"
import { TaskInputError } from "./TaskGraph.js"
import type { TaskStream } from "./TaskStream.js"

export const MLLMConfig = Schema.Struct({
  model: Schema.NonEmptyTrimmedString,
  /** The LLM's dtype (see LLMTask). */
  dtype: Schema.optional(ModelDtype),
  modalities: Schema.Array(Modality),
  /** Run each encoder as its own task (Eric) and forward embeddings; false: encode inside the LLM. */
  encoderFission: Schema.optionalWith(Schema.Boolean, { default: () => true }),
  /** The encoder's model when it differs from the LLM's. */
  encoderModel: Schema.optional(Schema.NonEmptyTrimmedString),
  /**
   * Models whose vision encoders share one tower (Gemma 3's sizes), this one among them: every
   * MLLM task that lists the same models uses one encoder deployment, which runs the tower once
   * for them all and each model's projector apart (the original's `encoder_model_ids`).
   */
  encoderModels: Schema.optional(
    Schema.Array(Schema.NonEmptyTrimmedString).pipe(Schema.minItems(1), Schema.maxItems(16))
  ),
  /** The messages are the app's own trusted prompt (see LLMTask). */
  parseSpecialTokensInContent: Schema.optional(Schema.Boolean),
  /** The LLM's engine settings (see LLMTask: maxBatchSize, kvCacheBytes, ...). */
  llmSettings: Schema.optional(LlmSettings),
  /** The encoders' batch settings (see EncoderTask). */
  encoderSettings: Schema.optional(EncoderSettings),
  /** Seconds without a call after which its encoders' and LLM's executors stop (see ScalingBounds). */
  idleReleaseS: ScalingBounds.idleReleaseS
})
export type MLLMConfig = typeof MLLMConfig.Encoded

/**
 * A multimodal LLM: with encoder fission, one encoder task per modality plus an LLM that takes
 * their embeddings through the sidecar; without it, the LLM alone, encoding media in-process.
 */
export class MLLMTask<L extends LLMTask | DisaggregatedLLMTask = LLMTask> extends CompositeTask<
  ChatCompletionRequest,
  TaskStream<ChatCompletionChunk>
> {
  readonly name: string
  readonly config: typeof MLLMConfig.Type
  readonly encoders: ReadonlyMap<string, EncoderTask>
  readonly llm: L

  /** `phases` "apart": the LLM's prefill and decode on executors apart (see DisaggregatedMLLMTask). */
  constructor(config: MLLMConfig, phases: "together" | "apart" = "together") {
    super()
    const decoded = Schema.decodeUnknownEither(MLLMConfig)(config, { errors: "all", onExcessProperty: "error" })
    if (decoded._tag === "Left") {
      throw TaskConfigError.of("MLLM", decoded.left)
    }
    this.config = { ...decoded.right, modalities: [...new Set(decoded.right.modalities)].sort() }
    const {
      model,
      dtype,
      encoderFission,
      encoderModel,
      encoderModels,
      parseSpecialTokensInContent,
      llmSettings,
      encoderSettings,
      idleReleaseS
    } = this.config
    const idle = idleReleaseS === undefined ? {} : { idleReleaseS }
    const shared = encoderModels === undefined ? undefined : [...new Set(encoderModels)].sort()
    if (shared !== undefined && (encoderModel !== undefined || !shared.includes(model))) {
      throw new TaskConfigError({
        message:
          encoderModel !== undefined
            ? "MLLM: give encoderModel or encoderModels, not both"
            : `MLLM: encoderModels must include the task's model ${model}`
      })
    }
    // Shared: the first model (sorted) is the encoder's, the others its adapters, whichever task names them.
    const encoderModelConfig =
      shared === undefined
        ? { model: encoderModel ?? model }
        : { model: shared[0]!, ...(shared.length > 1 ? { adapters: shared.slice(1) } : {}) }
    this.encoders = new Map(
      encoderFission
        ? this.config.modalities.map((modality) => [
            modality,
            this.use(new EncoderTask({ ...encoderModelConfig, modality, ...encoderSettings, ...idle }))
          ])
        : []
    )
    const llmConfig = {
      model,
      receiveEmbeddings: encoderFission,
      ...llmSettings,
      ...idle,
      ...(dtype === undefined ? {} : { dtype }),
      ...(parseSpecialTokensInContent === undefined ? {} : { parseSpecialTokensInContent })
    }
    this.llm = this.use(phases === "apart" ? new DisaggregatedLLMTask(llmConfig) : new LLMTask(llmConfig)) as L
    this.name = `mllm-${this.llm.name.slice("llm-".length)}`
  }

  compose(request: ChatCompletionRequest): TaskStream<ChatCompletionChunk> {
    const media = chatMediaParts(request)
    for (const part of media) {
      if (!this.config.modalities.includes(part.modality)) {
        const accepted = this.config.modalities.length > 0 ? this.config.modalities.join(", ") : "text only"
        throw new TaskInputError({ message: `this model takes ${accepted}; the request has ${part.modality}` })
      }
    }
    if (!this.config.encoderFission) return this.llm.compose(request)
    const processor = request.mm_processor_kwargs
    const embeddings: Array<DataForward<"Tensor">> = media.map(
      (part) =>
        this.encoders.get(part.modality)!.compose({
          urls: [part.url],
          ...(this.config.encoderModels === undefined ? {} : { model: this.config.model }),
          ...(processor === undefined || part.modality === "audio" ? {} : { processor })
        }).embeddings[0]!
    )
    return this.llm.compose({ ...request, cornserveEmbeddings: embeddings })
  }
}

/**
 * A multimodal LLM whose prefill and decode run on executors apart (see DisaggregatedLLMTask): with
 * encoder fission, the encoders' embeddings go to the prefill task, which sends them on to the
 * decode task with the prompt's KV cache. An app uses it as it would an MLLMTask.
 */
export class DisaggregatedMLLMTask extends MLLMTask<DisaggregatedLLMTask> {
  constructor(config: MLLMConfig) {
    super(config, "apart")
  }
}
