import type {
  LlavaOnevisionTextWeights,
  LlavaOnevisionVisionWeights
} from "../../../src/models/architectures/LlavaOnevision.js"
import { add, gelu, layerNorm, linear, patchEmbedding, softmaxInPlace } from "../../../src/models/reference/Numeric.js"

/**
 * LLaVA-OneVision computed in float64 with plain loops, from the definitions in transformers'
 * modeling_siglip.py, modeling_llava_onevision.py and modeling_qwen2.py rather than from the ONNX
 * graphs: SiglipVisionModel's hidden_states[-1] (embeddings, then each SiglipEncoderLayer:
 * LayerNorm, multi-head attention, residual, LayerNorm, fc1, gelu_pytorch_tanh, fc2, residual; no
 * post_layernorm), LlavaOnevisionMultiModalProjector (linear_1, GELU, linear_2), and Qwen2 without a
 * cache: Qwen2RMSNorm, q, k and v with biases, rotary positions (rotate_half), grouped-query causal
 * attention scaled by head_dim^-½, a SiLU-gated MLP, the final norm and lm_head.
 *
 * Rows are flat row-major Float64Arrays.
 */

/** gelu_pytorch_tanh. */
const geluTanh = (x: number): number => 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x ** 3)))

const silu = (x: number): number => x / (1 + Math.exp(-x))

/** Qwen2RMSNorm over rows of `weight.length`: x · rsqrt(mean(x²) + ε) · w. */
const rmsNorm = (x: Float64Array, weight: Float32Array, epsilon: number): Float64Array => {
  const width = weight.length
  const y = new Float64Array(x.length)
  for (let start = 0; start < x.length; start += width) {
    let squares = 0
    for (let i = 0; i < width; i++) squares += x[start + i]! ** 2
    const scale = 1 / Math.sqrt(squares / width + epsilon)
    for (let i = 0; i < width; i++) y[start + i] = x[start + i]! * scale * weight[i]!
  }
  return y
}

/**
 * Softmax attention of query rows [sequence, heads·headDim] over key and value rows [total,
 * kvHeads·headDim], scaled by headDim^-½; query head h reads KV head ⌊h / (heads / kvHeads)⌋ and
 * the keys `visible` allows.
 */
const attend = (
  queries: Float64Array,
  keys: Float64Array,
  values: Float64Array,
  shape: { readonly heads: number; readonly kvHeads: number; readonly headDim: number },
  visible: (query: number, key: number) => boolean
): Float64Array => {
  const { heads, kvHeads, headDim } = shape
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
        return dot / Math.sqrt(headDim)
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

/** image_features [images, patches, text hidden] of pixel_values [images, 3, S, S]. */
export const referenceLlavaOnevisionImageFeatures = (
  w: LlavaOnevisionVisionWeights,
  pixelValues: ArrayLike<number>,
  images: number
): Float64Array => {
  const { config } = w
  const size = config.imageSize
  const hidden = config.hiddenSize
  const patches = (size / config.patchSize) ** 2
  const textHidden = w.linear2.weight.cols
  const imageLength = 3 * size * size
  const out = new Float64Array(images * patches * textHidden)
  for (let b = 0; b < images; b++) {
    const image = Float64Array.from({ length: imageLength }, (_, i) => pixelValues[b * imageLength + i]!)
    let x: Float64Array = patchEmbedding(image, size, w.patch).map((value, i) => value + w.positions.data[i]!)
    for (const layer of w.layers) {
      const normed = layerNorm(x, patches, layer.norm1)
      const headDim = hidden / layer.attention.heads
      const attended = attend(
        linear(normed, patches, layer.attention.query),
        linear(normed, patches, layer.attention.key),
        linear(normed, patches, layer.attention.value),
        { heads: layer.attention.heads, kvHeads: layer.attention.heads, headDim },
        () => true
      )
      x = add(x, linear(attended, patches, layer.attention.output))
      const up = linear(layerNorm(x, patches, layer.norm2), patches, layer.mlp.up).map(geluTanh)
      x = add(x, linear(up, patches, layer.mlp.down))
    }
    const projected = linear(linear(x, patches, w.linear1).map(gelu), patches, w.linear2)
    out.set(projected, b * patches * textHidden)
  }
  return out
}

/** inputs_embeds [ids, hidden]: the embedding table's rows. */
export const referenceLlavaOnevisionEmbeddings = (
  w: LlavaOnevisionTextWeights,
  ids: ReadonlyArray<number>
): Float64Array => {
  const hidden = w.config.hiddenSize
  const out = new Float64Array(ids.length * hidden)
  ids.forEach((id, row) => {
    for (let i = 0; i < hidden; i++) out[row * hidden + i] = w.embedTokens.data[id * hidden + i]!
  })
  return out
}

/** rotate_half(x)·sin + x·cos of each head of each row, at angle position / θ^(2k/head_dim). */
const rotate = (
  x: Float64Array,
  width: number,
  headDim: number,
  positions: ReadonlyArray<number>,
  theta: number
): Float64Array => {
  const half = headDim / 2
  const out = new Float64Array(x.length)
  for (let s = 0; s < positions.length; s++) {
    for (let head = 0; head < width / headDim; head++) {
      const at = s * width + head * headDim
      for (let d = 0; d < headDim; d++) {
        const angle = positions[s]! / theta ** ((2 * (d % half)) / headDim)
        const rotated = d < half ? -x[at + d + half]! : x[at + d - half]!
        out[at + d] = x[at + d]! * Math.cos(angle) + rotated * Math.sin(angle)
      }
    }
  }
  return out
}

/** The final norm's output [sequence, hidden] of embeddings [sequence, hidden] at `positions`, causally. */
const referenceQwen2HiddenStates = (
  w: LlavaOnevisionTextWeights,
  embeds: Float64Array,
  positions: ReadonlyArray<number>
): Float64Array => {
  const { config } = w
  const { heads, kvHeads, rmsNormEps: epsilon, ropeTheta } = config
  const headDim = config.hiddenSize / heads
  const rows = positions.length
  let x: Float64Array = Float64Array.from(embeds)
  for (const layer of w.layers) {
    const normed = rmsNorm(x, layer.inputNorm, epsilon)
    const attended = attend(
      rotate(linear(normed, rows, layer.q), heads * headDim, headDim, positions, ropeTheta),
      rotate(linear(normed, rows, layer.k), kvHeads * headDim, headDim, positions, ropeTheta),
      linear(normed, rows, layer.v),
      { heads, kvHeads, headDim },
      (query, key) => key <= query
    )
    x = add(x, linear(attended, rows, layer.o))
    const normed2 = rmsNorm(x, layer.postNorm, epsilon)
    const gate = linear(normed2, rows, layer.gate).map(silu)
    const up = linear(normed2, rows, layer.up)
    x = add(
      x,
      linear(
        gate.map((value, j) => value * up[j]!),
        rows,
        layer.down
      )
    )
  }
  return rmsNorm(x, w.norm, epsilon)
}

/** The decoder's logits [sequence, vocab]. */
export const referenceLlavaOnevisionLogits = (
  w: LlavaOnevisionTextWeights,
  embeds: Float64Array,
  positions: ReadonlyArray<number>
): Float64Array => linear(referenceQwen2HiddenStates(w, embeds, positions), positions.length, { weight: w.lmHead })

const argmax = (row: ArrayLike<number>): number => {
  let best = 0
  for (let i = 1; i < row.length; i++) if (row[i]! > row[best]!) best = i
  return best
}

/**
 * Greedy decoding with the float64 reference, as transformers.js runs LLaVA-OneVision: the
 * prompt's embeddings with `imageFeatures` rows [n, hidden] written over its image tokens in order
 * (masked_scatter: as many tokens as rows), positions counted from 0, the whole sequence recomputed
 * at each step, stopping after `steps` tokens or at one of `stopTokens` (which is kept).
 */
export const referenceLlavaOnevisionGreedy = (
  w: LlavaOnevisionTextWeights,
  prompt: ReadonlyArray<number>,
  image: { readonly tokenId: number; readonly features: Float64Array },
  steps: number,
  stopTokens: ReadonlyArray<number> = []
): Array<number> => {
  const hidden = w.config.hiddenSize
  const embeds = referenceLlavaOnevisionEmbeddings(w, prompt)
  let row = 0
  prompt.forEach((id, at) => {
    if (id !== image.tokenId) return
    embeds.set(image.features.subarray(row * hidden, (row + 1) * hidden), at * hidden)
    row++
  })
  if (row * hidden !== image.features.length) {
    throw new Error(`${row} image tokens for ${image.features.length / hidden} feature rows`)
  }
  const tokens = [...prompt]
  let sequence: Float64Array = embeds
  const generated: Array<number> = []
  for (let step = 0; step < steps; step++) {
    const positions = tokens.map((_, i) => i)
    const last = referenceQwen2HiddenStates(w, sequence, positions).subarray((tokens.length - 1) * hidden)
    const token = argmax(linear(last, 1, { weight: w.lmHead }))
    generated.push(token)
    if (stopTokens.includes(token)) break
    tokens.push(token)
    const next = new Float64Array(sequence.length + hidden)
    next.set(sequence)
    next.set(referenceLlavaOnevisionEmbeddings(w, [token]), sequence.length)
    sequence = next
  }
  return generated
}
