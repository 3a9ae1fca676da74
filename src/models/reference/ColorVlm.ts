import type { ColorVisionWeights, NormCompletion, PitchAudioWeights } from "../recipes/TinyColorVlm.js"
import type { DecoderWeights } from "../Weights.js"
import { gelu, linear, patchEmbedding } from "./Numeric.js"

/** Float64 references of tiny-color-vlm's encoders and embedding lookup. */

const completeNorms = (rows: Float64Array, width: number, completion: NormCompletion): Float64Array => {
  const out = Float64Array.from(rows)
  for (let start = 0; start < rows.length; start += width) {
    let squared = 0
    for (let i = 0; i < width; i++) squared += rows[start + i]! ** 2
    const amount = Math.sqrt(Math.max(0, completion.normSquared - squared) * 0.5)
    out[start + completion.channel]! += amount
    out[start + completion.channel + width / 2]! -= amount
  }
  return out
}

/** pixel_values [batch, 3, size, size] → image_features [batch, patches, hidden]. */
export const colorVisionForward = (w: ColorVisionWeights, pixels: ArrayLike<number>, batch: number): Float64Array => {
  const imageLength = 3 * w.imageSize * w.imageSize
  const patches = (w.imageSize / w.patch.patchSize) ** 2
  const width = w.projector.weight.cols
  const out = new Float64Array(batch * patches * width)
  for (let b = 0; b < batch; b++) {
    const image = Float64Array.from({ length: imageLength }, (_, i) => pixels[b * imageLength + i]!)
    const votes = patchEmbedding(image, w.imageSize, w.patch).map(gelu)
    out.set(completeNorms(linear(votes, patches, w.projector), width, w.completion), b * patches * width)
  }
  return out
}

/** input_values [batch, samples] → audio_features [batch, frames, hidden]. */
export const pitchAudioForward = (w: PitchAudioWeights, samples: ArrayLike<number>, batch: number): Float64Array => {
  const frames = w.clipSamples / w.frameLength
  const bins = w.cosine.cols
  const width = w.projector.weight.cols
  const out = new Float64Array(batch * frames * width)
  for (let b = 0; b < batch; b++) {
    const ratios = new Float64Array(frames)
    for (let f = 0; f < frames; f++) {
      let difference = 0
      let total = 0
      for (let k = 0; k < bins; k++) {
        let real = 0
        let imaginary = 0
        for (let n = 0; n < w.frameLength; n++) {
          const sample = samples[b * w.clipSamples + f * w.frameLength + n]!
          real += sample * w.cosine.data[n * bins + k]!
          imaginary += sample * w.sine.data[n * bins + k]!
        }
        const power = real * real + imaginary * imaginary
        difference += power * w.bands.data[k * 2]!
        total += power * w.bands.data[k * 2 + 1]!
      }
      ratios[f] = difference / (total + w.epsilon)
    }
    out.set(completeNorms(linear(ratios, frames, w.projector), width, w.completion), b * frames * width)
  }
  return out
}

/** input_ids [batch, sequence] → inputs_embeds [batch, sequence, hidden]. */
export const embedTokensForward = (w: DecoderWeights, ids: ArrayLike<number>): Float64Array => {
  const hidden = w.embedTokens.cols
  const out = new Float64Array(ids.length * hidden)
  for (let i = 0; i < ids.length; i++) {
    for (let d = 0; d < hidden; d++) out[i * hidden + d] = w.embedTokens.data[ids[i]! * hidden + d]!
  }
  return out
}
