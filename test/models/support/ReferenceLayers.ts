import type { SiglipTowerWeights } from "../../../src/models/architectures/Gemma3.js"
import { add, layerNorm, linear, patchEmbedding, softmaxInPlace } from "../../../src/models/reference/Numeric.js"

interface SiglipSize {
  readonly imageSize: number
  readonly hiddenSize: number
  readonly patchSize: number
}

/**
 * The float64 pieces the VLM references share (Gemma 3's, Qwen3-VL's, LLaVA-OneVision's), from
 * transformers' definitions. Rows are flat row-major Float64Arrays.
 */

/** gelu_pytorch_tanh. */
export const geluTanh = (x: number): number =>
  0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x ** 3)))

export const silu = (x: number): number => x / (1 + Math.exp(-x))

/** RMSNorm over rows of `weight.length`: x · rsqrt(mean(x²) + ε) · (offset + w); Gemma's offset is 1. */
export const rmsNorm = (x: Float64Array, weight: Float32Array, epsilon: number, offset = 0): Float64Array => {
  const width = weight.length
  const y = new Float64Array(x.length)
  for (let start = 0; start < x.length; start += width) {
    let squares = 0
    for (let i = 0; i < width; i++) squares += x[start + i]! ** 2
    const scale = 1 / Math.sqrt(squares / width + epsilon)
    for (let i = 0; i < width; i++) y[start + i] = x[start + i]! * scale * (offset + weight[i]!)
  }
  return y
}

/**
 * Softmax attention of query rows [sequence, heads·headDim] over key and value rows [total,
 * kvHeads·headDim], scaled by `scale` (headDim^-½ by default); query head h reads KV head
 * ⌊h / (heads / kvHeads)⌋ and the keys `visible` allows.
 */
export const attend = (
  queries: Float64Array,
  keys: Float64Array,
  values: Float64Array,
  shape: { readonly heads: number; readonly kvHeads: number; readonly headDim: number; readonly scale?: number },
  visible: (query: number, key: number) => boolean
): Float64Array => {
  const { heads, kvHeads, headDim } = shape
  const scale = shape.scale ?? 1 / Math.sqrt(headDim)
  const queryWidth = heads * headDim
  const keyWidth = kvHeads * headDim
  const rows = queries.length / queryWidth
  const total = keys.length / keyWidth
  const out = new Float64Array(rows * queryWidth)
  for (let h = 0; h < heads; h++) {
    const kv = Math.floor(h / (heads / kvHeads))
    for (let s = 0; s < rows; s++) {
      const seen = Array.from({ length: total }, (_, t) => t).filter((t) => visible(s, t))
      const scores = Float64Array.from(seen, (t) => {
        let dot = 0
        for (let d = 0; d < headDim; d++)
          dot += queries[s * queryWidth + h * headDim + d]! * keys[t * keyWidth + kv * headDim + d]!
        return dot * scale
      })
      softmaxInPlace(scores)
      seen.forEach((t, j) => {
        for (let d = 0; d < headDim; d++)
          out[s * queryWidth + h * headDim + d]! += scores[j]! * values[t * keyWidth + kv * headDim + d]!
      })
    }
  }
  return out
}

export const argmax = (row: ArrayLike<number>): number => {
  let best = 0
  for (let i = 1; i < row.length; i++) if (row[i]! > row[best]!) best = i
  return best
}

/**
 * Greedy decoding as transformers.js runs these VLMs: the prompt's embeddings with the media
 * feature rows written over its media tokens in order (masked_scatter: as many tokens as rows),
 * the whole sequence recomputed at each step, stopping after `steps` tokens or at one of
 * `stopTokens` (which is kept).
 */
export const referenceGreedy = (model: {
  readonly hidden: number
  readonly lmHead: { readonly rows: number; readonly cols: number; readonly data: Float32Array }
  readonly embed: (ids: ReadonlyArray<number>) => Float64Array
  /** The decoder's final hidden states [sequence, hidden] over `positions`. */
  readonly hiddenStates: (embeds: Float64Array, positions: ReadonlyArray<number>) => Float64Array
  /** The position of the prompt's first token (Gemma 3 counts from 1). */
  readonly firstPosition?: number
  readonly prompt: ReadonlyArray<number>
  readonly media: { readonly tokenId: number; readonly features: Float64Array }
  readonly steps: number
  readonly stopTokens?: ReadonlyArray<number>
}): Array<number> => {
  const { hidden, prompt, media } = model
  const embeds = model.embed(prompt)
  let row = 0
  prompt.forEach((id, at) => {
    if (id !== media.tokenId) return
    embeds.set(media.features.subarray(row * hidden, (row + 1) * hidden), at * hidden)
    row++
  })
  if (row * hidden !== media.features.length) {
    throw new Error(`${row} media tokens for ${media.features.length / hidden} feature rows`)
  }
  const tokens = [...prompt]
  let sequence: Float64Array = embeds
  const generated: Array<number> = []
  for (let step = 0; step < model.steps; step++) {
    const positions = tokens.map((_, i) => i + (model.firstPosition ?? 0))
    const last = model.hiddenStates(sequence, positions).subarray((tokens.length - 1) * hidden)
    const token = argmax(linear(last, 1, { weight: model.lmHead }))
    generated.push(token)
    if (model.stopTokens?.includes(token)) break
    tokens.push(token)
    const next = new Float64Array(sequence.length + hidden)
    next.set(sequence)
    next.set(model.embed([token]), sequence.length)
    sequence = next
  }
  return generated
}

/**
 * SigLIP's vision tower over one image [3, S, S]: the patch embedding and positions, then each
 * encoder layer (LayerNorm, multi-head attention, residual, LayerNorm, fc1, gelu_pytorch_tanh,
 * fc2, residual): hidden_states[-1], [patches, hidden], before any post_layernorm.
 */
export const siglipHiddenStates = (w: SiglipTowerWeights & { readonly config: SiglipSize }, image: Float64Array) => {
  const { imageSize: size, hiddenSize: hidden, patchSize } = w.config
  const patches = (size / patchSize) ** 2
  let x: Float64Array = patchEmbedding(image, size, w.patch).map((value, i) => value + w.positions.data[i]!)
  for (const layer of w.layers) {
    const normed = layerNorm(x, patches, layer.norm1)
    const heads = layer.attention.heads
    const attended = attend(
      linear(normed, patches, layer.attention.query),
      linear(normed, patches, layer.attention.key),
      linear(normed, patches, layer.attention.value),
      { heads, kvHeads: heads, headDim: hidden / heads },
      () => true
    )
    x = add(x, linear(attended, patches, layer.attention.output))
    const up = linear(layerNorm(x, patches, layer.norm2), patches, layer.mlp.up).map(geluTanh)
    x = add(x, linear(up, patches, layer.mlp.down))
  }
  return x
}

/** rotate_half(x)·sin + x·cos of each head of each row, at angle position · frequencies[d mod half]. */
export const rotate = (
  x: Float64Array,
  width: number,
  headDim: number,
  positions: ReadonlyArray<number>,
  frequencies: ReadonlyArray<number>
): Float64Array => {
  const half = headDim / 2
  const out = new Float64Array(x.length)
  for (let s = 0; s < positions.length; s++) {
    for (let head = 0; head < width / headDim; head++) {
      const at = s * width + head * headDim
      for (let d = 0; d < headDim; d++) {
        const angle = positions[s]! * frequencies[d % half]!
        const rotated = d < half ? -x[at + d + half]! : x[at + d - half]!
        out[at + d] = x[at + d]! * Math.cos(angle) + rotated * Math.sin(angle)
      }
    }
  }
  return out
}

/** The rotary frequencies of a head: 1 / θ^(2k/head_dim) for k < head_dim / 2. */
export const ropeFrequencies = (headDim: number, theta: number): Array<number> =>
  Array.from({ length: headDim / 2 }, (_, k) => 1 / theta ** ((2 * k) / headDim))
