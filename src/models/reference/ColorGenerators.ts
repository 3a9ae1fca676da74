import { maskedScore } from "../onnx/Attention.js"
import type { ColorPromptWeights } from "../recipes/ColorPrompt.js"
import type { PainterWeights } from "../recipes/TinyColorPainter.js"
import type { TonesWeights } from "../recipes/TinyColorTones.js"
import { linear, softmaxInPlace } from "./Numeric.js"

/** Float64 references of tiny-color-painter and tiny-color-tones. */

export interface PromptInputs {
  readonly batch: number
  readonly sequence: number
  /** [batch, sequence, hidden] */
  readonly inputsEmbeds: ArrayLike<number>
  /** [batch, sequence] */
  readonly attentionMask: ArrayLike<number>
}

/** → per prompt, its pooled RGB bits [3]. */
const poolColorWords = (w: ColorPromptWeights, inputs: PromptInputs): Array<Float64Array> => {
  const hidden = w.score.rows
  return Array.from({ length: inputs.batch }, (_, b) => {
    const rows = Float64Array.from(
      { length: inputs.sequence * hidden },
      (_, i) => inputs.inputsEmbeds[b * inputs.sequence * hidden + i]!
    )
    const scores = linear(rows, inputs.sequence, { weight: w.score })
    scores.forEach((_, s) => {
      if (inputs.attentionMask[b * inputs.sequence + s] !== 1) scores[s] = maskedScore
    })
    softmaxInPlace(scores)
    const bits = linear(rows, inputs.sequence, { weight: w.bits })
    const pooled = new Float64Array(3)
    for (let s = 0; s < inputs.sequence; s++) for (let i = 0; i < 3; i++) pooled[i]! += scores[s]! * bits[s * 3 + i]!
    return pooled
  })
}

/** → images [batch, 3, size, size]. */
export const painterForward = (w: PainterWeights, inputs: PromptInputs): Float64Array => {
  const plane = w.imageSize * w.imageSize
  const out = new Float64Array(inputs.batch * 3 * plane)
  poolColorWords(w.prompt, inputs).forEach((pooled, b) => {
    const rgb = linear(pooled, 1, w.color).map((value) => Math.min(1, Math.max(0, value)))
    for (let c = 0; c < 3; c++) {
      for (let i = 0; i < plane; i++)
        out[(b * 3 + c) * plane + i] = rgb[c]! * (1 - w.vignette[i]!) + 0.5 * w.vignette[i]!
    }
  })
  return out
}

/** ONNX's Round: halves go to the even neighbour. */
const roundHalfToEven = (x: number): number => {
  const floor = Math.floor(x)
  const fraction = x - floor
  if (fraction !== 0.5) return Math.round(x)
  return floor % 2 === 0 ? floor : floor + 1
}

/** → pcm [batch, chunkSize] for chunk chunkIndex[b] of each prompt. */
export const tonesForward = (w: TonesWeights, inputs: PromptInputs, chunkIndex: ArrayLike<number>): Int16Array => {
  const out = new Int16Array(inputs.batch * w.chunkSize)
  poolColorWords(w.prompt, inputs).forEach((pooled, b) => {
    const hertz = roundHalfToEven(linear(pooled, 1, w.frequency)[0]!)
    for (let i = 0; i < w.chunkSize; i++) {
      const cycles = (hertz * (chunkIndex[b]! * w.chunkSize + i)) / w.sampleRate
      const wave = Math.sin(2 * Math.PI * (cycles - Math.floor(cycles)))
      out[b * w.chunkSize + i] = roundHalfToEven(wave * w.amplitude)
    }
  })
  return out
}
