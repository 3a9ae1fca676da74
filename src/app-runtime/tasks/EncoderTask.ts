import * as Schema from "effect/Schema"
import { MediaProcessorOptions } from "../schemas/OpenAI.js"
import { DataForward } from "./DataForward.js"
import { BatchSettings } from "./EngineSettings.js"
import { modelShortName, ScalingBounds, UnitTask } from "./Task.js"
import { TaskInputError } from "./TaskGraph.js"

export const Modality = Schema.Literal("image", "video", "audio")

export const EncoderConfig = Schema.Struct({
  model: Schema.NonEmptyTrimmedString,
  modality: Modality,
  /**
   * Other models whose vision encoders hold this model's tower and differ in the projector alone
   * (Gemma 3's 4B, 12B and 27B): one deployment runs the tower for all of them and each model's
   * projector apart, and each call names its model. Tasks that list the same models are one task.
   */
  adapters: Schema.optional(Schema.Array(Schema.NonEmptyTrimmedString).pipe(Schema.maxItems(16))),
  maxBatchSize: Schema.optionalWith(Schema.Int.pipe(Schema.between(1, 4096)), { default: () => 1 }),
  ...BatchSettings,
  ...ScalingBounds
})
export type EncoderConfig = typeof EncoderConfig.Encoded

export const EncoderInput = Schema.Struct({
  urls: Schema.NonEmptyArray(Schema.String),
  /** Whose projector embeds the items: the task's model (the default) or one of its adapters. */
  model: Schema.optional(Schema.String),
  /** The media processor's settings for these items (vLLM's mm_processor_kwargs). */
  processor: Schema.optional(MediaProcessorOptions)
})
export type EncoderInput = typeof EncoderInput.Type

/** The adapters sorted, without duplicates or the model itself, so that equal sets make one task. */
const normalAdapters = (config: EncoderConfig): EncoderConfig => {
  if (!Array.isArray(config?.adapters) || typeof config.model !== "string") return config
  const { adapters, ...rest } = config
  const named = adapters.filter((id): id is string => typeof id === "string")
  if (named.length !== adapters.length) return config
  const others = [...new Set(named.map((id) => id.trim()))].filter((id) => id !== config.model.trim()).sort()
  return others.length === 0 ? rest : { ...rest, adapters: others }
}

export interface EncoderOutput {
  /** One embedding per URL, in order; they travel through the sidecar. */
  readonly embeddings: ReadonlyArray<DataForward<"Tensor">>
}

/** Embeds images, video or audio with a multimodal encoder (Eric). */
export class EncoderTask extends UnitTask<EncoderInput, EncoderOutput, typeof EncoderConfig.Type> {
  readonly operation = "embed"
  readonly name: string
  protected readonly inputSchema = EncoderInput

  constructor(config: EncoderConfig) {
    super("encoder", EncoderConfig, normalAdapters(config))
    this.name = `encoder-${this.config.modality}-${modelShortName(this.config.model)}`
  }

  /** The models this task embeds for: its own, then its adapters. */
  get models(): ReadonlyArray<string> {
    return [this.config.model, ...(this.config.adapters ?? [])]
  }

  override compose(input: EncoderInput): EncoderOutput {
    if (input?.model !== undefined && !this.models.includes(input.model)) {
      throw new TaskInputError({
        message: `encoder ${this.name} embeds for ${this.models.join(", ")}, not ${input.model}`
      })
    }
    return super.compose(input)
  }

  protected makeRecordOutput(input: EncoderInput): EncoderOutput {
    return { embeddings: input.urls.map(() => new DataForward("Tensor")) }
  }
}
