import { maskedScore } from "../onnx/Attention.js"
import type { AttentionWeights, DecoderWeights, TransformerBlockWeights, VisionTransformerWeights } from "../Weights.js"
import { add, layerNorm, linear, mlp, patchEmbedding, softmaxInPlace } from "./Numeric.js"

/** Float64 references of the transformer architectures in src/models/architectures. */

/** One sequence's keys or values, [heads, positions, headDim]. */
interface HeadsCache {
  readonly key: Float64Array
  readonly value: Float64Array
  readonly length: number
}

/** Which keys query `query` may attend to (both counted from the start of the cache). */
type Visibility = (query: number, key: number) => boolean

const attention = (
  x: Float64Array,
  rows: number,
  w: AttentionWeights,
  past: HeadsCache,
  visible: Visibility
): { output: Float64Array; cache: HeadsCache } => {
  const hidden = w.query.weight.cols
  const headDim = hidden / w.heads
  const query = linear(x, rows, w.query)
  const newKey = linear(x, rows, w.key)
  const newValue = linear(x, rows, w.value)
  const total = past.length + rows
  const key = new Float64Array(w.heads * total * headDim)
  const value = new Float64Array(w.heads * total * headDim)
  for (let h = 0; h < w.heads; h++) {
    for (let t = 0; t < total; t++) {
      for (let d = 0; d < headDim; d++) {
        const at = (h * total + t) * headDim + d
        const fromPast = t < past.length
        key[at] = fromPast
          ? past.key[(h * past.length + t) * headDim + d]!
          : newKey[(t - past.length) * hidden + h * headDim + d]!
        value[at] = fromPast
          ? past.value[(h * past.length + t) * headDim + d]!
          : newValue[(t - past.length) * hidden + h * headDim + d]!
      }
    }
  }
  const merged = new Float64Array(rows * hidden)
  const scale = 1 / Math.sqrt(headDim)
  const scores = new Float64Array(total)
  for (let h = 0; h < w.heads; h++) {
    for (let s = 0; s < rows; s++) {
      for (let t = 0; t < total; t++) {
        let dot = 0
        for (let d = 0; d < headDim; d++)
          dot += query[s * hidden + h * headDim + d]! * key[(h * total + t) * headDim + d]!
        scores[t] = visible(past.length + s, t) ? dot * scale : maskedScore
      }
      softmaxInPlace(scores)
      for (let t = 0; t < total; t++) {
        for (let d = 0; d < headDim; d++)
          merged[s * hidden + h * headDim + d]! += scores[t]! * value[(h * total + t) * headDim + d]!
      }
    }
  }
  return { output: linear(merged, rows, w.output), cache: { key, value, length: total } }
}

const block = (x: Float64Array, rows: number, w: TransformerBlockWeights, past: HeadsCache, visible: Visibility) => {
  const attended = attention(layerNorm(x, rows, w.norm1), rows, w.attention, past, visible)
  const afterAttention = add(x, attended.output)
  const output = add(afterAttention, mlp(layerNorm(afterAttention, rows, w.norm2), rows, w.mlp))
  return { output, cache: attended.cache }
}

export interface DecoderInputs {
  readonly batch: number
  readonly sequence: number
  readonly pastLength: number
  /** [batch, sequence, hidden] */
  readonly inputsEmbeds: ArrayLike<number>
  /** [batch, past + sequence], 1 for a real token and 0 for padding. */
  readonly attentionMask: ArrayLike<number>
  /** [batch, sequence] */
  readonly positionIds: ArrayLike<number>
  /** Per layer, [batch, heads, past, headDim]. */
  readonly past: ReadonlyArray<{ readonly key: ArrayLike<number>; readonly value: ArrayLike<number> }>
}

export interface DecoderOutputs {
  /** [batch, sequence, vocab] */
  readonly logits: Float64Array
  /** Per layer, [batch, heads, past + sequence, headDim]. */
  readonly present: ReadonlyArray<{ readonly key: Float64Array; readonly value: Float64Array }>
}

export const decoderForward = (w: DecoderWeights, inputs: DecoderInputs): DecoderOutputs => {
  const { batch, sequence, pastLength } = inputs
  const hidden = w.embedTokens.cols
  const vocab = w.lmHead.cols
  const total = pastLength + sequence
  const logits = new Float64Array(batch * sequence * vocab)
  const presentParts = w.layers.map(() => ({ key: [] as Array<Float64Array>, value: [] as Array<Float64Array> }))
  for (let b = 0; b < batch; b++) {
    let x: Float64Array = new Float64Array(sequence * hidden)
    for (let s = 0; s < sequence; s++) {
      const position = inputs.positionIds[b * sequence + s]!
      for (let d = 0; d < hidden; d++) {
        x[s * hidden + d] =
          inputs.inputsEmbeds[(b * sequence + s) * hidden + d]! + w.positions.data[position * hidden + d]!
      }
    }
    const visible: Visibility = (query, key) => key <= query && inputs.attentionMask[b * total + key] === 1
    w.layers.forEach((layer, i) => {
      // heads × headDim = hidden values per cached position
      const pastSize = pastLength * hidden
      const past: HeadsCache = {
        key: Float64Array.from({ length: pastSize }, (_, j) => inputs.past[i]!.key[b * pastSize + j]!),
        value: Float64Array.from({ length: pastSize }, (_, j) => inputs.past[i]!.value[b * pastSize + j]!),
        length: pastLength
      }
      const result = block(x, sequence, layer, past, visible)
      x = result.output
      presentParts[i]!.key.push(result.cache.key)
      presentParts[i]!.value.push(result.cache.value)
    })
    const normed = layerNorm(x, sequence, w.finalNorm)
    logits.set(linear(normed, sequence, { weight: w.lmHead }), b * sequence * vocab)
  }
  return { logits, present: presentParts.map((parts) => ({ key: concat(parts.key), value: concat(parts.value) })) }
}

const concat = (parts: ReadonlyArray<Float64Array>): Float64Array => {
  const out = new Float64Array(parts.reduce((n, part) => n + part.length, 0))
  let offset = 0
  for (const part of parts) {
    out.set(part, offset)
    offset += part.length
  }
  return out
}

/** pixel_values [batch, channels, size, size] → image_features [batch, 1 + patches, hidden]. */
export const visionTransformerForward = (
  w: VisionTransformerWeights,
  pixels: ArrayLike<number>,
  batch: number
): Float64Array => {
  const { channels, hidden } = w.patch
  const imageLength = channels * w.imageSize * w.imageSize
  const rows = w.positions.rows
  const out = new Float64Array(batch * rows * hidden)
  for (let b = 0; b < batch; b++) {
    const image = Float64Array.from({ length: imageLength }, (_, i) => pixels[b * imageLength + i]!)
    const patches = patchEmbedding(image, w.imageSize, w.patch)
    let x: Float64Array = new Float64Array(rows * hidden)
    x.set(w.classToken, 0)
    x.set(patches, hidden)
    x = x.map((value, i) => value + w.positions.data[i]!)
    for (const layer of w.layers) {
      x = block(x, rows, layer, { key: new Float64Array(0), value: new Float64Array(0), length: 0 }, () => true).output
    }
    out.set(layerNorm(x, rows, w.finalNorm), b * rows * hidden)
  }
  return out
}
