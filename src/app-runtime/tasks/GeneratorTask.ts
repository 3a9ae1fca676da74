import * as Schema from "effect/Schema"
import { DataForward } from "./DataForward.js"
import { BatchSettings } from "./EngineSettings.js"
import { modelShortName, ScalingBounds, UnitTask } from "./Task.js"
import { TaskStream } from "./TaskStream.js"

export const GeneratorConfig = Schema.Struct({
  model: Schema.NonEmptyTrimmedString,
  maxBatchSize: Schema.optionalWith(Schema.Int.pipe(Schema.between(1, 4096)), { default: () => 1 }),
  ...BatchSettings,
  ...ScalingBounds
})
export type GeneratorConfig = typeof GeneratorConfig.Encoded

const Embeddings = Schema.instanceOf(DataForward)
/** What Geri paints: 8 to 4096 pixels a side. */
const Dimension = Schema.Int.pipe(Schema.between(8, 4096))

export const ImageGeneratorInput = Schema.Struct({
  embeddings: Embeddings,
  height: Dimension,
  width: Dimension,
  /**
   * The noise a generator that starts from noise draws: the same seed paints the same image.
   * Left out, each call draws its own; a generator without noise ignores it.
   */
  seed: Schema.optional(Schema.Int),
  /** Leading prompt positions the generator ignores (a fixed system prompt, say). */
  skipTokens: Schema.optional(Schema.Int.pipe(Schema.nonNegative()))
})
export type ImageGeneratorInput = typeof ImageGeneratorInput.Type

export interface ImageGeneratorOutput {
  /** A PNG, base64. */
  readonly image: string
}

/** Paints an image from prompt embeddings (Geri). */
export class ImageGeneratorTask extends UnitTask<
  ImageGeneratorInput,
  ImageGeneratorOutput,
  typeof GeneratorConfig.Type
> {
  readonly operation = "generate-image"
  readonly name: string
  protected readonly inputSchema = ImageGeneratorInput

  constructor(config: GeneratorConfig) {
    super("image-generator", GeneratorConfig, config)
    this.name = `image-generator-${modelShortName(this.config.model)}`
  }

  protected makeRecordOutput(): ImageGeneratorOutput {
    return { image: "" }
  }
}

export const AudioGeneratorInput = Schema.Struct({
  embeddings: Embeddings,
  /** PCM16 samples per streamed chunk (the model's own chunk size when left out). */
  chunkSize: Schema.optional(Schema.Int.pipe(Schema.between(1, 1_048_576))),
  /** How many chunks to stream (the model's default length when left out). */
  chunks: Schema.optional(Schema.Int.pipe(Schema.between(1, 10_000))),
  skipTokens: Schema.optional(Schema.Int.pipe(Schema.nonNegative()))
})
export type AudioGeneratorInput = typeof AudioGeneratorInput.Type

export interface AudioChunk {
  /** PCM16 little-endian mono samples, base64. */
  readonly audio: string
  readonly sampleRate: number
}

/** Produces audio from prompt embeddings as a stream of PCM16 chunks (Geri). */
export class AudioGeneratorTask extends UnitTask<
  AudioGeneratorInput,
  TaskStream<AudioChunk>,
  typeof GeneratorConfig.Type
> {
  readonly operation = "generate-audio"
  readonly name: string
  protected readonly inputSchema = AudioGeneratorInput

  constructor(config: GeneratorConfig) {
    super("audio-generator", GeneratorConfig, config)
    this.name = `audio-generator-${modelShortName(this.config.model)}`
  }

  protected makeRecordOutput(): TaskStream<AudioChunk> {
    return TaskStream.placeholder()
  }
}
