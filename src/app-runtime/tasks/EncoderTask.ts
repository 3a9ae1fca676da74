import * as Schema from "effect/Schema"
import { MediaProcessorOptions } from "../schemas/OpenAI.js"
import { DataForward } from "./DataForward.js"
import { BatchSettings } from "./EngineSettings.js"
import { modelShortName, ScalingBounds, UnitTask } from "./Task.js"

export const Modality = Schema.Literal("image", "video", "audio")

export const EncoderConfig = Schema.Struct({
  model: Schema.NonEmptyTrimmedString,
  modality: Modality,
  maxBatchSize: Schema.optionalWith(Schema.Int.pipe(Schema.between(1, 4096)), { default: () => 1 }),
  ...BatchSettings,
  ...ScalingBounds
})
export type EncoderConfig = typeof EncoderConfig.Encoded

export const EncoderInput = Schema.Struct({
  urls: Schema.NonEmptyArray(Schema.String),
  /** The media processor's settings for these items (vLLM's mm_processor_kwargs). */
  processor: Schema.optional(MediaProcessorOptions)
})
export type EncoderInput = typeof EncoderInput.Type

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
    super("encoder", EncoderConfig, config)
    this.name = `encoder-${this.config.modality}-${modelShortName(this.config.model)}`
  }

  protected makeRecordOutput(input: EncoderInput): EncoderOutput {
    return { embeddings: input.urls.map(() => new DataForward("Tensor")) }
  }
}
