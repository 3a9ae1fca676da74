import type { ModelDirectory } from "./ModelDirectory.js"
import { type WhisperFeatureExtractor, whisperFeatureExtractor, whisperFeatures } from "./WhisperFeatures.js"

/**
 * Audio as Voxtral (transformers.js's VoxtralProcessor) takes it: a clip cut in non-overlapping
 * chunks of the extractor's n_samples (30 s), each chunk's Whisper log-mel features padded to 30 s
 * (audio_values [chunks, mel bins, 3000]); in the prompt, each `[AUDIO]` the chat template wrote
 * becomes `[BEGIN_AUDIO]` followed by 375 `[AUDIO]` a chunk, which the audio encoder's rows
 * replace. Chosen for a model of model_type voxtral with onnx/audio_encoder.onnx, a
 * WhisperFeatureExtractor in preprocessor_config.json, and [BEGIN_AUDIO] in its tokenizer.
 */

export const voxtralAudioText = "[AUDIO]"
export const voxtralBeginAudioText = "[BEGIN_AUDIO]"

/** The rows a 30 s chunk gives: VoxtralProcessor's NUM_AUDIO_TOKENS (1500 encoder frames, 4 a row). */
export const voxtralRowsPerChunk = 375

export interface VoxtralAudio {
  readonly kind: "voxtral"
  readonly extractor: WhisperFeatureExtractor
  /** The token written before each clip's rows. */
  readonly beginAudioId: number
}

const addedTokenId = (model: ModelDirectory, content: string): number | undefined => {
  const added = model.tokenizer?.json.added_tokens
  if (!Array.isArray(added)) return undefined
  const token = added.find((entry: { readonly content?: unknown }) => entry.content === content) as
    | { readonly id?: unknown }
    | undefined
  return typeof token?.id === "number" ? token.id : undefined
}

/** The model's Voxtral audio processor, or undefined when it is not a Voxtral. */
export const voxtralAudioOf = (model: ModelDirectory): VoxtralAudio | undefined => {
  if (model.config.model_type !== "voxtral" || !model.onnx.has("audio_encoder")) return undefined
  if (model.preprocessorConfig?.feature_extractor_type !== "WhisperFeatureExtractor") return undefined
  const beginAudioId = addedTokenId(model, voxtralBeginAudioText)
  if (beginAudioId === undefined) return undefined
  return { kind: "voxtral", extractor: whisperFeatureExtractor(model.preprocessorConfig), beginAudioId }
}

/** A clip's audio_values: each chunk's features, padded to the extractor's window, one after another. */
export const voxtralAudioValues = (
  extractor: WhisperFeatureExtractor,
  samples: Float32Array
): { readonly data: Float32Array; readonly chunks: number; readonly frames: number } => {
  const chunks: Array<Float32Array> = []
  let frames = 0
  for (let from = 0; from < samples.length; from += extractor.nSamples) {
    const features = whisperFeatures(
      extractor,
      samples.subarray(from, Math.min(from + extractor.nSamples, samples.length))
    )
    chunks.push(features.data)
    frames = features.frames
  }
  const data = new Float32Array(chunks.reduce((sum, chunk) => sum + chunk.length, 0))
  chunks.forEach((chunk, index) => data.set(chunk, index * chunk.length))
  return { data, chunks: chunks.length, frames }
}

/** The [AUDIO] rows of a clip of `chunks` chunks. */
export const voxtralAudioRows = (chunks: number): number => chunks * voxtralRowsPerChunk
