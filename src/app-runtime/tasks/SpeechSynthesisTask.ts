import * as Schema from "effect/Schema"
import { SpeechRequest } from "../schemas/Speech.js"
import type { AudioChunk } from "./GeneratorTask.js"
import { BatchSettings } from "./EngineSettings.js"
import { modelShortName, ScalingBounds, UnitTask } from "./Task.js"
import { TaskStream } from "./TaskStream.js"

export const SpeechSynthesisConfig = Schema.Struct({
  model: Schema.NonEmptyTrimmedString,
  /** Utterances the executor speaks at once (their decoding steps interleave). */
  maxBatchSize: Schema.optionalWith(Schema.Int.pipe(Schema.between(1, 4096)), { default: () => 8 }),
  ...BatchSettings,
  ...ScalingBounds
})
export type SpeechSynthesisConfig = typeof SpeechSynthesisConfig.Encoded

const requestProblem = (
  request: SpeechRequest
): { readonly path: ReadonlyArray<string>; readonly message: string } | undefined => {
  if (request.speed != null && request.speed !== 1) return { path: ["speed"], message: "only 1 is implemented" }
  if (request.voice != null && request.speaker_embedding != null)
    return { path: ["speaker_embedding"], message: "give a voice or a speaker embedding, not both" }
  return undefined
}

/** A speech request the task can run; a refusal is the request's fault, answered 400. */
export const SpeechSynthesisInput = SpeechRequest.pipe(Schema.filter((request) => requestProblem(request) ?? true))
export type SpeechSynthesisInput = typeof SpeechSynthesisInput.Type

/**
 * Text to speech with a SpeechT5 model on Geri (the community's encoder_model and
 * decoder_model_merged, with its HiFi-GAN vocoder), as transformers.js's `generate_speech` speaks:
 * the audio streams as PCM16 chunks while the decoder is still writing, the first after a fraction
 * of a second.
 */
export class SpeechSynthesisTask extends UnitTask<
  SpeechSynthesisInput,
  TaskStream<AudioChunk>,
  typeof SpeechSynthesisConfig.Type
> {
  readonly operation = "synthesize"
  readonly name: string
  protected readonly inputSchema = SpeechSynthesisInput

  constructor(config: SpeechSynthesisConfig) {
    super("speech-synthesizer", SpeechSynthesisConfig, config)
    this.name = `speech-synthesizer-${modelShortName(this.config.model)}`
  }

  protected makeRecordOutput(): TaskStream<AudioChunk> {
    return TaskStream.placeholder()
  }
}
