import type { Gemma3TextWeights, Gemma3VisionWeights } from "../../../src/models/architectures/Gemma3.js"
import { add, layerNorm, linear, patchEmbedding, softmaxInPlace } from "../../../src/models/reference/Numeric.js"

/**
 * Gemma 3 computed in float64 with plain loops, from the definitions in transformers'
 * modeling_gemma3.py and modeling_siglip.py rather than from the ONNX graphs: SigLIP's vision
 * tower and Gemma3MultiModalProjector (average pooling, Gemma3RMSNorm, projection), the scaled
 * token embedding, and the decoder without a cache: Gemma3RMSNorm's 1 + w, sandwich norms, q_norm
 * and k_norm before rotary positions, query_pre_attn_scalar, local and global rotary bases with
 * linear scaling on the global layers, and the sliding layers' mask over sequence indices
 * (tril(ones, -sliding_window) masked, the query itself in its window).
 *
 * Rows are flat row-major Float64Arrays.
 */

/** Gemma3RMSNorm over rows of `weight.length`: x · rsqrt(mean(x²) + ε) · (1 + w). */
const gemmaRmsNorm = (x: Float64Array, weight: Float32Array, epsilon: number): Float64Array => {
  const width = weight.length
  const y = new Float64Array(x.length)
  for (let start = 0; start < x.length; start += width) {
    let squares = 0
    for (let i = 0; i < width; i++) squares += x[start + i]! ** 2
    const scale = 1 / Math.sqrt(squares / width + epsilon)
    for (let i = 0; i < width; i++) y[start + i] = x[start + i]! * scale * (1 + weight[i]!)
  }
  return y
}

/** gelu_pytorch_tanh. */
const geluTanh = (x: number): number => 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x ** 3)))

/**
 * Softmax attention of query rows [sequence, heads·headDim] over key and value rows [total,
 * kvHeads·headDim]; query head h reads KV head ⌊h / (heads / kvHeads)⌋ and the keys `visible` allows.
 */
const attend = (
  queries: Float64Array,
  keys: Float64Array,
  values: Float64Array,
  shape: { readonly heads: number; readonly kvHeads: number; readonly headDim: number; readonly scale: number },
  visible: (query: number, key: number) => boolean
): Float64Array => {
  const { heads, kvHeads, headDim, scale } = shape
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

/** image_features [batch, mm_tokens_per_image, text hidden] of pixel_values [batch, 3, S, S]. */
export const referenceGemma3ImageFeatures = (
  w: Gemma3VisionWeights,
  pixelValues: ArrayLike<number>,
  batch: number
): Float64Array => {
  const { config } = w
  const size = config.imageSize
  const hidden = config.hiddenSize
  const grid = size / config.patchSize
  const patches = grid * grid
  const side = Math.sqrt(w.mmTokensPerImage)
  const pool = grid / side
  const textHidden = w.inputProjection.cols
  const imageLength = 3 * size * size
  const out = new Float64Array(batch * w.mmTokensPerImage * textHidden)
  for (let b = 0; b < batch; b++) {
    const image = Float64Array.from({ length: imageLength }, (_, i) => pixelValues[b * imageLength + i]!)
    let x: Float64Array = patchEmbedding(image, size, w.patch).map((value, i) => value + w.positions.data[i]!)
    for (const layer of w.layers) {
      const normed = layerNorm(x, patches, layer.norm1)
      const attended = attend(
        linear(normed, patches, layer.attention.query),
        linear(normed, patches, layer.attention.key),
        linear(normed, patches, layer.attention.value),
        {
          heads: layer.attention.heads,
          kvHeads: layer.attention.heads,
          headDim: hidden / layer.attention.heads,
          scale: (hidden / layer.attention.heads) ** -0.5
        },
        () => true
      )
      x = add(x, linear(attended, patches, layer.attention.output))
      const up = linear(layerNorm(x, patches, layer.norm2), patches, layer.mlp.up).map(geluTanh)
      x = add(x, linear(up, patches, layer.mlp.down))
    }
    x = layerNorm(x, patches, w.postLayerNorm)
    // AvgPool2d(pool) over the [hidden, grid, grid] planes, tokens in row-major order.
    const pooled = new Float64Array(w.mmTokensPerImage * hidden)
    for (let ty = 0; ty < side; ty++)
      for (let tx = 0; tx < side; tx++)
        for (let dy = 0; dy < pool; dy++)
          for (let dx = 0; dx < pool; dx++) {
            const patch = (ty * pool + dy) * grid + tx * pool + dx
            for (let c = 0; c < hidden; c++)
              pooled[(ty * side + tx) * hidden + c]! += x[patch * hidden + c]! / pool ** 2
          }
    const normed = gemmaRmsNorm(pooled, w.softEmbeddingNorm, config.layerNormEps)
    out.set(linear(normed, w.mmTokensPerImage, { weight: w.inputProjection }), b * w.mmTokensPerImage * textHidden)
  }
  return out
}

/** inputs_embeds [ids, hidden]: embedding rows times √hidden in float32, as Gemma3TextScaledWordEmbedding. */
export const referenceGemma3Embeddings = (w: Gemma3TextWeights, ids: ReadonlyArray<number>): Float64Array => {
  const hidden = w.config.hiddenSize
  const scale = Math.fround(Math.sqrt(hidden))
  const out = new Float64Array(ids.length * hidden)
  ids.forEach((id, row) => {
    for (let i = 0; i < hidden; i++) out[row * hidden + i] = w.embedTokens.data[id * hidden + i]! * scale
  })
  return out
}

/** rotate_half(x)·sin + x·cos of each head of each row, at angle position · inv_freq. */
const rotate = (
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

/**
 * The decoder's final norm output [sequence, hidden], what lm_head reads, for one sequence of
 * embeddings [sequence, hidden] at `positions`, each token seeing those before it (within the
 * window on sliding layers).
 */
const referenceGemma3HiddenStates = (
  w: Gemma3TextWeights,
  embeds: Float64Array,
  positions: ReadonlyArray<number>
): Float64Array => {
  const { config } = w
  const { heads, kvHeads, headDim, rmsNormEps: epsilon } = config
  const rows = positions.length
  const shape = { heads, kvHeads, headDim, scale: config.queryPreAttnScalar ** -0.5 }
  let x: Float64Array = Float64Array.from(embeds)
  w.layers.forEach((layer, i) => {
    const sliding = config.layerTypes[i] === "sliding_attention"
    const theta = sliding ? config.ropeLocalBaseFreq : config.ropeTheta
    const factor = sliding ? 1 : (config.ropeScaling?.factor ?? 1)
    const frequencies = Array.from({ length: headDim / 2 }, (_, k) => 1 / theta ** ((2 * k) / headDim) / factor)
    const normed = gemmaRmsNorm(x, layer.inputNorm, epsilon)
    const headsOf = (projected: Float64Array, norm: Float32Array, count: number) =>
      rotate(gemmaRmsNorm(projected, norm, epsilon), count * headDim, headDim, positions, frequencies)
    const attended = attend(
      headsOf(linear(normed, rows, layer.q), layer.qNorm, heads),
      headsOf(linear(normed, rows, layer.k), layer.kNorm, kvHeads),
      linear(normed, rows, layer.v),
      shape,
      (query, key) => key <= query && (!sliding || key > query - config.slidingWindow)
    )
    x = add(x, gemmaRmsNorm(linear(attended, rows, layer.o), layer.postAttentionNorm, epsilon))
    const feedforwardInput = gemmaRmsNorm(x, layer.preFeedforwardNorm, epsilon)
    const gate = linear(feedforwardInput, rows, layer.gate).map(geluTanh)
    const up = linear(feedforwardInput, rows, layer.up)
    const mlp = linear(
      gate.map((value, j) => value * up[j]!),
      rows,
      layer.down
    )
    x = add(x, gemmaRmsNorm(mlp, layer.postFeedforwardNorm, epsilon))
  })
  return gemmaRmsNorm(x, w.norm, epsilon)
}

/** The decoder's logits [sequence, vocab]. */
export const referenceGemma3Logits = (
  w: Gemma3TextWeights,
  embeds: Float64Array,
  positions: ReadonlyArray<number>
): Float64Array => linear(referenceGemma3HiddenStates(w, embeds, positions), positions.length, { weight: w.lmHead })

const argmax = (row: ArrayLike<number>): number => {
  let best = 0
  for (let i = 1; i < row.length; i++) if (row[i]! > row[best]!) best = i
  return best
}

/**
 * Greedy decoding with the float64 reference, as transformers.js runs Gemma 3: the prompt's
 * embeddings with `imageFeatures` rows [n, hidden] written over its image tokens in order,
 * positions counted from 1, the whole sequence recomputed at each step.
 */
export const referenceGemma3Greedy = (
  w: Gemma3TextWeights,
  prompt: ReadonlyArray<number>,
  imageTokenId: number,
  imageFeatures: Float64Array,
  steps: number
): Array<number> => {
  const hidden = w.config.hiddenSize
  const embeds = referenceGemma3Embeddings(w, prompt)
  let image = 0
  prompt.forEach((id, row) => {
    if (id !== imageTokenId) return
    embeds.set(imageFeatures.subarray(image * hidden, (image + 1) * hidden), row * hidden)
    image++
  })
  if (image * hidden !== imageFeatures.length) {
    throw new Error(`${image} image tokens for ${imageFeatures.length / hidden} feature rows`)
  }
  const tokens = [...prompt]
  let sequence: Float64Array = embeds
  const generated: Array<number> = []
  for (let step = 0; step < steps; step++) {
    const positions = tokens.map((_, i) => i + 1)
    const last = referenceGemma3HiddenStates(w, sequence, positions).subarray((tokens.length - 1) * hidden)
    const token = argmax(linear(last, 1, { weight: w.lmHead }))
    generated.push(token)
    tokens.push(token)
    const next = new Float64Array(sequence.length + hidden)
    next.set(sequence)
    next.set(referenceGemma3Embeddings(w, [token]), sequence.length)
    sequence = next
  }
  return generated
}
