import type {
  LlavaOnevisionTextWeights,
  LlavaOnevisionVisionWeights
} from "../../../src/models/architectures/LlavaOnevision.js"
import { add, gelu, linear } from "../../../src/models/reference/Numeric.js"
import {
  attend,
  referenceGreedy,
  rmsNorm,
  ropeFrequencies,
  rotate,
  silu,
  siglipHiddenStates
} from "./ReferenceLayers.js"

/** image_features [images, patches, text hidden] of pixel_values [images, 3, S, S]. */
export const referenceLlavaOnevisionImageFeatures = (
  w: LlavaOnevisionVisionWeights,
  pixelValues: ArrayLike<number>,
  images: number
): Float64Array => {
  const { config } = w
  const size = config.imageSize
  const _hidden = config.hiddenSize
  const patches = (size / config.patchSize) ** 2
  const textHidden = w.linear2.weight.cols
  const imageLength = 3 * size * size
  const out = new Float64Array(images * patches * textHidden)
  for (let b = 0; b < images; b++) {
    const image = Float64Array.from({ length: imageLength }, (_, i) => pixelValues[b * imageLength + i]!)
    const x = siglipHiddenStates(w, image)
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

/** The final norm's output [sequence, hidden] of embeddings [sequence, hidden] at `positions`, causally. */
const referenceQwen2HiddenStates = (
  w: LlavaOnevisionTextWeights,
  embeds: Float64Array,
  positions: ReadonlyArray<number>
): Float64Array => {
  const { config } = w
  const { heads, kvHeads, rmsNormEps: epsilon, ropeTheta } = config
  const headDim = config.hiddenSize / heads
  const frequencies = ropeFrequencies(headDim, ropeTheta)
  const rows = positions.length
  let x: Float64Array = Float64Array.from(embeds)
  for (const layer of w.layers) {
    const normed = rmsNorm(x, layer.inputNorm, epsilon)
    const attended = attend(
      rotate(linear(normed, rows, layer.q), heads * headDim, headDim, positions, frequencies),
      rotate(linear(normed, rows, layer.k), kvHeads * headDim, headDim, positions, frequencies),
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
): Array<number> =>
  referenceGreedy({
    hidden: w.config.hiddenSize,
    lmHead: w.lmHead,
    embed: (ids) => referenceLlavaOnevisionEmbeddings(w, ids),
    hiddenStates: (embeds, positions) => referenceQwen2HiddenStates(w, embeds, positions),
    prompt,
    media: image,
    steps,
    stopTokens
  })
