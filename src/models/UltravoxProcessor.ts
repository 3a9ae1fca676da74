import * as Either from "effect/Either"
import * as Schema from "effect/Schema"
import { decodeConfig, type ModelDirectory } from "./ModelDirectory.js"
import { type VoxtralAudio, voxtralAudioOf } from "./VoxtralProcessor.js"
import { type WhisperFeatureExtractor, whisperFeatureExtractor } from "./WhisperFeatures.js"

/**
 * Audio as Ultravox (UltravoxProcessor) takes it: a clip's Whisper log-mel features, not padded to
 * 30 s (audio_values [1, mel bins, ⌊samples / hop⌋]), standing in the prompt for
 * 1 + ⌈round(samples / encoder_ds_factor) / stack_factor⌉ copies of its placeholder, which the
 * audio encoder's rows replace. Chosen for a model with onnx/audio_encoder.onnx, a
 * WhisperFeatureExtractor in preprocessor_config.json, and processor_config.json's
 * audio_placeholder, encoder_ds_factor and stack_factor.
 */

const Count = Schema.Int.pipe(Schema.positive())

const UltravoxProcessorConfig = Schema.Struct({
  audio_placeholder: Schema.String.pipe(Schema.minLength(1)),
  encoder_ds_factor: Count,
  stack_factor: Count
})

export interface UltravoxAudio {
  readonly kind: "ultravox"
  readonly extractor: WhisperFeatureExtractor
  /** The text that stands for a clip in the prompt, once before expansion. */
  readonly placeholder: string
  readonly encoderDownsampling: number
  readonly stackFactor: number
}

/**
 * The audio of the chat models whose audio_encoder takes Whisper features as audio_values and
 * whose clips stand in the prompt for as many placeholder tokens as it gives rows: Ultravox's, and
 * Voxtral's (VoxtralProcessor.ts), which transformers.js runs through the same UltravoxModel.
 */
export type AudioChatProcessor = UltravoxAudio | VoxtralAudio

const ultravoxOnlyAudioOf = (model: ModelDirectory): UltravoxAudio | undefined => {
  if (!model.onnx.has("audio_encoder")) return undefined
  if (model.preprocessorConfig?.feature_extractor_type !== "WhisperFeatureExtractor") return undefined
  const decoded = decodeConfig(UltravoxProcessorConfig, model.processorConfig ?? {})
  if (Either.isLeft(decoded)) return undefined
  return {
    kind: "ultravox",
    extractor: whisperFeatureExtractor(model.preprocessorConfig),
    placeholder: decoded.right.audio_placeholder,
    encoderDownsampling: decoded.right.encoder_ds_factor,
    stackFactor: decoded.right.stack_factor
  }
}

/** The model's Ultravox or Voxtral audio processor, or undefined when it has neither. */
export const ultravoxAudioOf = (model: ModelDirectory): AudioChatProcessor | undefined =>
  voxtralAudioOf(model) ?? ultravoxOnlyAudioOf(model)

/** The rows (placeholder copies) a clip of `samples` samples takes, as UltravoxProcessor counts them. */
export const ultravoxAudioRows = (
  audio: Pick<UltravoxAudio, "encoderDownsampling" | "stackFactor">,
  samples: number
): number => 1 + Math.ceil(Math.round(samples / audio.encoderDownsampling + 1e-4) / audio.stackFactor)
