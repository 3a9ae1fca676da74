import type { Gemma3TextWeights, Gemma3VisionWeights } from "../../../src/models/architectures/Gemma3.js"
import { add, layerNorm, linear } from "../../../src/models/reference/Numeric.js"
import { attend, geluTanh, referenceGreedy, rmsNorm, rotate, siglipHiddenStates } from "./ReferenceLayers.js"

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
    let x = siglipHiddenStates(w, image)
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
    const normed = rmsNorm(pooled, w.softEmbeddingNorm, config.layerNormEps, 1)
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
    const normed = rmsNorm(x, layer.inputNorm, epsilon, 1)
    const headsOf = (projected: Float64Array, norm: Float32Array, count: number) =>
      rotate(rmsNorm(projected, norm, epsilon, 1), count * headDim, headDim, positions, frequencies)
    const attended = attend(
      headsOf(linear(normed, rows, layer.q), layer.qNorm, heads),
      headsOf(linear(normed, rows, layer.k), layer.kNorm, kvHeads),
      linear(normed, rows, layer.v),
      shape,
      (query, key) => key <= query && (!sliding || key > query - config.slidingWindow)
    )
    x = add(x, rmsNorm(linear(attended, rows, layer.o), layer.postAttentionNorm, epsilon, 1))
    const feedforwardInput = rmsNorm(x, layer.preFeedforwardNorm, epsilon, 1)
    const gate = linear(feedforwardInput, rows, layer.gate).map(geluTanh)
    const up = linear(feedforwardInput, rows, layer.up)
    const mlp = linear(
      gate.map((value, j) => value * up[j]!),
      rows,
      layer.down
    )
    x = add(x, rmsNorm(mlp, layer.postFeedforwardNorm, epsilon, 1))
  })
  return rmsNorm(x, w.norm, epsilon, 1)
}

/** The decoder's logits [sequence, vocab]. */
export const referenceGemma3Logits = (
  w: Gemma3TextWeights,
  embeds: Float64Array,
  positions: ReadonlyArray<number>
): Float64Array => linear(referenceGemma3HiddenStates(w, embeds, positions), positions.length, { weight: w.lmHead })

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
): Array<number> =>
  referenceGreedy({
    hidden: w.config.hiddenSize,
    lmHead: w.lmHead,
    embed: (ids) => referenceGemma3Embeddings(w, ids),
    hiddenStates: (embeds, positions) => referenceGemma3HiddenStates(w, embeds, positions),
    firstPosition: 1,
    prompt,
    media: { tokenId: imageTokenId, features: imageFeatures },
    steps
  })
