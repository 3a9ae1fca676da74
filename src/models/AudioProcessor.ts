import * as Either from "effect/Either"
import * as Schema from "effect/Schema"
import { decodeConfig } from "./ModelDirectory.js"

/**
 * Turns mono PCM into a model's input_values as its preprocessor_config.json says: resampled to
 * sampling_rate (linear interpolation) and cut or zero-padded to n_samples.
 */

export const AudioProcessorConfig = Schema.Struct({
  sampling_rate: Schema.Int.pipe(Schema.positive()),
  n_samples: Schema.Int.pipe(Schema.positive())
})
export type AudioProcessorConfig = typeof AudioProcessorConfig.Type

export const decodeAudioProcessorConfig = (preprocessorConfig: unknown): AudioProcessorConfig =>
  Either.getOrThrowWith(
    decodeConfig(AudioProcessorConfig, preprocessorConfig ?? {}),
    (reason) => new Error(`preprocessor_config.json has no usable audio settings: ${reason}`)
  )

/** Samples in [-1, 1] at `sampleRate` → input_values of one clip, [n_samples]. */
export const inputValues = (config: AudioProcessorConfig, samples: Float32Array, sampleRate: number): Float32Array => {
  const out = new Float32Array(config.n_samples)
  const step = sampleRate / config.sampling_rate
  for (let i = 0; i < out.length; i++) {
    const at = i * step
    const before = Math.floor(at)
    if (before >= samples.length) break
    const after = Math.min(before + 1, samples.length - 1)
    const fraction = at - before
    out[i] = samples[before]! * (1 - fraction) + samples[after]! * fraction
  }
  return out
}
