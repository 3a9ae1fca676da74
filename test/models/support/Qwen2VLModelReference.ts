import type { Qwen2VLTextWeights, Qwen2VLVisionWeights } from "../../../src/models/architectures/Qwen2VL.js"
import type { GridThw } from "../../../src/models/Qwen2VLProcessor.js"
import type { LayerNormWeights, LinearWeights } from "../../../src/models/Weights.js"

/**
 * Qwen2-VL computed in float64 with plain loops, from the definitions in transformers'
 * modeling_qwen2_vl.py rather than from the ONNX graphs: the vision tower's rot_pos_emb
 * (arange, reshape into merge blocks, permute), attention within each cu_seqlens frame, the patch
 * merger; and the decoder with apply_multimodal_rotary_pos_emb, without a cache.
 */

type Rows = Array<Float64Array>

const linear = (x: Rows, w: LinearWeights): Rows =>
  x.map((row) => {
    const { rows, cols, data } = w.weight
    const out = new Float64Array(cols)
    for (let c = 0; c < cols; c++) out[c] = w.bias?.[c] ?? 0
    for (let r = 0; r < rows; r++) {
      const value = row[r]!
      for (let c = 0; c < cols; c++) out[c]! += value * data[r * cols + c]!
    }
    return out
  })

const layerNorm = (x: Rows, w: LayerNormWeights): Rows =>
  x.map((row) => {
    const mean = row.reduce((a, b) => a + b, 0) / row.length
    const variance = row.reduce((a, b) => a + (b - mean) ** 2, 0) / row.length
    const scale = 1 / Math.sqrt(variance + w.epsilon)
    return row.map((value, i) => (value - mean) * scale * w.gamma[i]! + w.beta[i]!)
  })

const rmsNorm = (x: Rows, weight: Float32Array, epsilon: number): Rows =>
  x.map((row) => {
    const scale = 1 / Math.sqrt(row.reduce((a, b) => a + b * b, 0) / row.length + epsilon)
    return row.map((value, i) => value * scale * weight[i]!)
  })

const add = (a: Rows, b: Rows): Rows => a.map((row, i) => row.map((value, j) => value + b[i]![j]!))

const map = (x: Rows, f: (value: number) => number): Rows => x.map((row) => row.map(f))

const erf = (x: number): number => {
  // Abramowitz–Stegun 7.1.26 is too coarse here; a series/continued fraction pair is exact to double precision.
  const z = Math.abs(x)
  if (z < 3) {
    let sum = z
    let term = z
    for (let n = 1; n < 100; n++) {
      term *= (-z * z) / n
      sum += term / (2 * n + 1)
    }
    return Math.sign(x) * ((2 / Math.sqrt(Math.PI)) * sum)
  }
  let fraction = 0
  for (let n = 60; n >= 1; n--) fraction = n / 2 / (z + fraction)
  return Math.sign(x) * (1 - Math.exp(-z * z) / Math.sqrt(Math.PI) / (z + fraction))
}

/** rotate_half(x) · sin + x · cos over one head's vector. */
const rotate = (x: Float64Array, cos: ArrayLike<number>, sin: ArrayLike<number>): Float64Array => {
  const half = x.length / 2
  return x.map((value, i) => value * cos[i]! + (i < half ? -x[i + half]! : x[i - half]!) * sin[i]!)
}

const softmaxAttention = (
  query: Float64Array,
  keys: ReadonlyArray<Float64Array>,
  values: ReadonlyArray<Float64Array>
): Float64Array => {
  const scale = 1 / Math.sqrt(query.length)
  const scores = keys.map((key) => key.reduce((a, k, i) => a + k * query[i]!, 0) * scale)
  const top = Math.max(...scores)
  const weights = scores.map((s) => Math.exp(s - top))
  const total = weights.reduce((a, b) => a + b, 0)
  const out = new Float64Array(query.length)
  values.forEach((value, j) => {
    for (let i = 0; i < out.length; i++) out[i]! += (weights[j]! / total) * value[i]!
  })
  return out
}

const slice = (row: Float64Array, head: number, headDim: number) => row.subarray(head * headDim, (head + 1) * headDim)

/** Each patch's (row, column) in processor order, as rot_pos_emb lays out hpos_ids and wpos_ids. */
const patchPositions = (grids: ReadonlyArray<GridThw>, merge: number): Array<readonly [number, number]> => {
  const positions: Array<readonly [number, number]> = []
  for (const [t, h, w] of grids) {
    for (let frame = 0; frame < t; frame++)
      for (let blockRow = 0; blockRow < h / merge; blockRow++)
        for (let blockColumn = 0; blockColumn < w / merge; blockColumn++)
          for (let r = 0; r < merge; r++)
            for (let c = 0; c < merge; c++) positions.push([blockRow * merge + r, blockColumn * merge + c])
  }
  return positions
}

/** image_features of pixel_values [patches, C·T·P·P] for the images of `grids`. */
export const referenceVisionFeatures = (
  w: Qwen2VLVisionWeights,
  pixelValues: Float32Array,
  grids: ReadonlyArray<GridThw>
): Rows => {
  const { config } = w
  const width = w.patchEmbed.rows
  const patches = pixelValues.length / width
  let x: Rows = linear(
    Array.from({ length: patches }, (_, p) => Float64Array.from(pixelValues.subarray(p * width, (p + 1) * width))),
    { weight: w.patchEmbed }
  )
  const headDim = config.embedDim / config.heads
  // VisionRotaryEmbedding(head_dim / 2): frequencies 1/θ^(2k / (head_dim/2)).
  const frequencies = Array.from({ length: headDim / 4 }, (_, k) => 1 / 10000 ** ((2 * k) / (headDim / 2)))
  const angles = patchPositions(grids, config.spatialMergeSize).map(([row, column]) => {
    const half = [...frequencies.map((f) => row * f), ...frequencies.map((f) => column * f)]
    return [...half, ...half]
  })
  const cos = angles.map((a) => a.map(Math.cos))
  const sin = angles.map((a) => a.map(Math.sin))
  // cu_seqlens: one attention block per frame of h·w patches.
  const frameOf: Array<number> = []
  let frameIndex = 0
  for (const [t, h, w_] of grids)
    for (let f = 0; f < t; f++, frameIndex++) for (let i = 0; i < h * w_; i++) frameOf.push(frameIndex)

  for (const block of w.blocks) {
    const qkv = linear(layerNorm(x, block.norm1), block.qkv)
    const attended: Rows = qkv.map(() => new Float64Array(config.embedDim))
    for (let head = 0; head < config.heads; head++) {
      const part = (p: number, which: number) => slice(qkv[p]!, which * config.heads + head, headDim)
      const queries = qkv.map((_, p) => rotate(part(p, 0), cos[p]!, sin[p]!))
      const keys = qkv.map((_, p) => rotate(part(p, 1), cos[p]!, sin[p]!))
      const values = qkv.map((_, p) => part(p, 2))
      for (let p = 0; p < patches; p++) {
        const visible = keys.map((_, q) => q).filter((q) => frameOf[q] === frameOf[p])
        const out = softmaxAttention(
          queries[p]!,
          visible.map((q) => keys[q]!),
          visible.map((q) => values[q]!)
        )
        attended[p]!.set(out, head * headDim)
      }
    }
    x = add(x, linear(attended, block.proj))
    const hidden = map(linear(layerNorm(x, block.norm2), block.fc1), (v) => v / (1 + Math.exp(-1.702 * v)))
    x = add(x, linear(hidden, block.fc2))
  }
  const normed = layerNorm(x, w.merger.norm)
  const group = config.spatialMergeSize ** 2
  const merged = Array.from({ length: patches / group }, (_, i) => {
    const row = new Float64Array(config.embedDim * group)
    for (let j = 0; j < group; j++) row.set(normed[i * group + j]!, j * config.embedDim)
    return row
  })
  const activated = map(linear(merged, w.merger.fc1), (v) => 0.5 * v * (1 + erf(v / Math.SQRT2)))
  return linear(activated, w.merger.fc2)
}

/**
 * The decoder's logits [sequence, vocab] for one sequence of embeddings, all visible to each
 * other causally, at M-RoPE positions [3][sequence].
 */
export const referenceDecoderLogits = (
  w: Qwen2VLTextWeights,
  embeds: Rows,
  positions: ReadonlyArray<ReadonlyArray<number>>
): Rows => linear(referenceDecoderHiddenStates(w, embeds, positions), { weight: w.lmHead })

/** The decoder's final hidden states [sequence, hidden] (the final norm's output, what lm_head reads). */
export const referenceDecoderHiddenStates = (
  w: Qwen2VLTextWeights,
  embeds: Rows,
  positions: ReadonlyArray<ReadonlyArray<number>>
): Rows => {
  const { config } = w
  const headDim = config.hiddenSize / config.heads
  const half = headDim / 2
  const frequencies = Array.from({ length: half }, (_, k) => 1 / config.ropeTheta ** ((2 * k) / headDim))
  // mrope_section doubled: chunk i of [s0, s1, s2, s0, s1, s2] takes axis i % 3.
  const axisOf: Array<number> = []
  for (const [i, width] of [...config.mropeSection, ...config.mropeSection].entries())
    for (let j = 0; j < width; j++) axisOf.push(i % 3)
  const angles = embeds.map((_, s) => axisOf.map((axis, d) => positions[axis]![s]! * frequencies[d % half]!))
  const cos = angles.map((a) => a.map(Math.cos))
  const sin = angles.map((a) => a.map(Math.sin))
  const group = config.heads / config.kvHeads

  let x = embeds
  for (const layer of w.layers) {
    const normed = rmsNorm(x, layer.inputNorm, config.rmsNormEps)
    const q = linear(normed, layer.q)
    const k = linear(normed, layer.k)
    const v = linear(normed, layer.v)
    const attended: Rows = x.map(() => new Float64Array(config.heads * headDim))
    for (let head = 0; head < config.heads; head++) {
      const kvHead = Math.floor(head / group)
      const keys = k.map((row, s) => rotate(slice(row, kvHead, headDim), cos[s]!, sin[s]!))
      const values = v.map((row) => slice(row, kvHead, headDim))
      for (let s = 0; s < x.length; s++) {
        const query = rotate(slice(q[s]!, head, headDim), cos[s]!, sin[s]!)
        attended[s]!.set(softmaxAttention(query, keys.slice(0, s + 1), values.slice(0, s + 1)), head * headDim)
      }
    }
    x = add(x, linear(attended, layer.o))
    const normed2 = rmsNorm(x, layer.postNorm, config.rmsNormEps)
    const gate = map(linear(normed2, layer.gate), (g) => g / (1 + Math.exp(-g)))
    const up = linear(normed2, layer.up)
    x = add(
      x,
      linear(
        gate.map((row, i) => row.map((g, j) => g * up[i]![j]!)),
        layer.down
      )
    )
  }
  return rmsNorm(x, w.norm, config.rmsNormEps)
}

/** Rows of the embedding table for `ids`. */
export const referenceEmbeddings = (w: Qwen2VLTextWeights, ids: ReadonlyArray<number>): Rows =>
  ids.map((id) =>
    Float64Array.from(w.embedTokens.data.subarray(id * w.config.hiddenSize, (id + 1) * w.config.hiddenSize))
  )

const argmax = (row: ArrayLike<number>): number => {
  let best = 0
  for (let i = 1; i < row.length; i++) if (row[i]! > row[best]!) best = i
  return best
}

/**
 * Greedy decoding with the float64 reference: the prompt's embeddings (vision features written
 * over its pad tokens, in order) at its M-RoPE positions [3 × prompt length], then each decoded
 * token at its index + `delta` on all three axes, recomputing the whole sequence at each step.
 */
export const referenceQwen2VLGreedy = (
  w: Qwen2VLTextWeights,
  prompt: ReadonlyArray<number>,
  pads: ReadonlySet<number>,
  features: ReadonlyArray<Float64Array>,
  positions: Int32Array,
  delta: number,
  steps: number
): Array<number> => {
  let feature = 0
  const embeds = referenceEmbeddings(w, prompt).map((row, i) => (pads.has(prompt[i]!) ? features[feature++]! : row))
  const axes = [0, 1, 2].map((axis) => Array.from(positions.subarray(axis * prompt.length, (axis + 1) * prompt.length)))
  const generated: Array<number> = []
  for (let step = 0; step < steps; step++) {
    const token = argmax(referenceDecoderLogits(w, embeds, axes).at(-1)!)
    generated.push(token)
    embeds.push(...referenceEmbeddings(w, [token]))
    for (const axis of axes) axis.push(embeds.length - 1 + delta)
  }
  return generated
}
