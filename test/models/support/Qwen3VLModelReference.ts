import type { Qwen3VLTextWeights, Qwen3VLVisionWeights } from "../../../src/models/architectures/Qwen3VL.js"
import type { GridThw } from "../../../src/models/Qwen2VLProcessor.js"
import { add, gelu, layerNorm, linear } from "../../../src/models/reference/Numeric.js"
import { argmax, attend, geluTanh, rmsNorm } from "./ReferenceLayers.js"

/** rotate_half(x) · sin + x · cos over each head of `headDim` in a row, with that row's cos and sin. */
const rotateRow = (
  row: Float64Array,
  cos: ArrayLike<number>,
  sin: ArrayLike<number>,
  headDim: number
): Float64Array => {
  const half = headDim / 2
  const out = new Float64Array(row.length)
  for (let start = 0; start < row.length; start += headDim) {
    for (let i = 0; i < headDim; i++) {
      const other = i < half ? -row[start + i + half]! : row[start + i - half]!
      out[start + i] = row[start + i]! * cos[i]! + other * sin[i]!
    }
  }
  return out
}

/** torch.linspace(start, end, steps). */
const linspace = (start: number, end: number, steps: number): Array<number> =>
  steps === 1 ? [start] : Array.from({ length: steps }, (_, i) => start + ((end - start) * i) / (steps - 1))

/** Merge-block order of one frame's h × w row-major cells: view(h/m, m, w/m, m).permute(0, 2, 1, 3). */
const mergeOrder = (h: number, w: number, merge: number): Array<number> => {
  const order: Array<number> = []
  for (let blockRow = 0; blockRow < h / merge; blockRow++)
    for (let blockColumn = 0; blockColumn < w / merge; blockColumn++)
      for (let r = 0; r < merge; r++)
        for (let c = 0; c < merge; c++) order.push((blockRow * merge + r) * w + blockColumn * merge + c)
  return order
}

/** fast_pos_embed_interpolate: [patches, hidden] for the images of `grids`, in processor order. */
const interpolatedPositions = (w: Qwen3VLVisionWeights, grids: ReadonlyArray<GridThw>): Array<Float64Array> => {
  const hidden = w.config.hiddenSize
  const side = Math.round(Math.sqrt(w.config.numPositionEmbeddings))
  const embedding = (index: number) => w.posEmbed.data.subarray(index * hidden, (index + 1) * hidden)
  const out: Array<Float64Array> = []
  for (const [t, h, width] of grids) {
    const hIndices = linspace(0, side - 1, h)
    const wIndices = linspace(0, side - 1, width)
    const cells: Array<Float64Array> = []
    for (const y of hIndices) {
      for (const x of wIndices) {
        const [y0, x0] = [Math.floor(y), Math.floor(x)]
        const [y1, x1] = [Math.min(y0 + 1, side - 1), Math.min(x0 + 1, side - 1)]
        const [dy, dx] = [y - y0, x - x0]
        const cell = new Float64Array(hidden)
        for (const [index, weight] of [
          [y0 * side + x0, (1 - dy) * (1 - dx)],
          [y0 * side + x1, (1 - dy) * dx],
          [y1 * side + x0, dy * (1 - dx)],
          [y1 * side + x1, dy * dx]
        ] as const) {
          const row = embedding(index)
          for (let i = 0; i < hidden; i++) cell[i]! += weight * row[i]!
        }
        cells.push(cell)
      }
    }
    const order = mergeOrder(h, width, w.config.spatialMergeSize)
    for (let frame = 0; frame < t; frame++) for (const cell of order) out.push(cells[cell]!)
  }
  return out
}

/** image_features [patches / merge², out hidden] of pixel_values [patches, C·T·P·P] for the images of `grids`. */
export const referenceQwen3VLVisionFeatures = (
  w: Qwen3VLVisionWeights,
  pixelValues: Float32Array,
  grids: ReadonlyArray<GridThw>
): Float64Array => {
  const { config } = w
  const hidden = config.hiddenSize
  const merge = config.spatialMergeSize
  const patches = pixelValues.length / w.patchEmbed.weight.rows
  const positions = interpolatedPositions(w, grids)
  let x = linear(Float64Array.from(pixelValues), patches, w.patchEmbed)
  positions.forEach((row, p) => {
    for (let i = 0; i < hidden; i++) x[p * hidden + i]! += row[i]!
  })

  // rot_pos_emb: each patch's (row, column) in merge-block order, angles (row·f, column·f) twice.
  const headDim = hidden / config.heads
  const frequencies = Array.from({ length: headDim / 4 }, (_, k) => 1 / 10000 ** ((2 * k) / (headDim / 2)))
  const cos: Array<Array<number>> = []
  const sin: Array<Array<number>> = []
  const frameOf: Array<number> = []
  let frame = 0
  for (const [t, h, width] of grids) {
    const order = mergeOrder(h, width, merge)
    for (let f = 0; f < t; f++, frame++) {
      for (const cell of order) {
        const [row, column] = [Math.floor(cell / width), cell % width]
        const half = [...frequencies.map((q) => row * q), ...frequencies.map((q) => column * q)]
        cos.push([...half, ...half].map(Math.cos))
        sin.push([...half, ...half].map(Math.sin))
        frameOf.push(frame)
      }
    }
  }

  const rotateAll = (rows: Float64Array) => {
    const out = new Float64Array(rows.length)
    for (let p = 0; p < patches; p++)
      out.set(rotateRow(rows.subarray(p * hidden, (p + 1) * hidden), cos[p]!, sin[p]!, headDim), p * hidden)
    return out
  }
  for (const block of w.blocks) {
    const qkv = linear(layerNorm(x, patches, block.norm1), patches, block.qkv)
    const part = (which: number) => {
      const out = new Float64Array(patches * hidden)
      for (let p = 0; p < patches; p++)
        out.set(qkv.subarray(p * 3 * hidden + which * hidden, p * 3 * hidden + (which + 1) * hidden), p * hidden)
      return out
    }
    const attended = attend(
      rotateAll(part(0)),
      rotateAll(part(1)),
      part(2),
      { heads: config.heads, kvHeads: config.heads, headDim },
      (q, k) => frameOf[q] === frameOf[k]
    )
    x = add(x, linear(attended, patches, block.proj))
    const up = linear(layerNorm(x, patches, block.norm2), patches, block.fc1).map(geluTanh)
    x = add(x, linear(up, patches, block.fc2))
  }
  // The merger: LayerNorm per patch, merge² consecutive patches as one row, fc1, GELU, fc2.
  const merged = layerNorm(x, patches, w.merger.norm)
  const rows = patches / merge ** 2
  return linear(linear(merged, rows, w.merger.fc1).map(gelu), rows, w.merger.fc2)
}

/** The axis (0 t, 1 h, 2 w) of each rotary frequency: apply_interleaved_mrope's slices [dim : 3·section[dim] : 3]. */
const interleavedAxes = (half: number, section: readonly [number, number, number]): Array<number> => {
  const axes = new Array<number>(half).fill(0)
  for (const dim of [1, 2]) for (let k = dim; k < 3 * section[dim]!; k += 3) axes[k] = dim
  return axes
}

/** The decoder's final hidden states [sequence, hidden] for embeddings at M-RoPE positions [3][sequence], causally. */
export const referenceQwen3VLHiddenStates = (
  w: Qwen3VLTextWeights,
  embeds: Float64Array,
  positions: ReadonlyArray<ReadonlyArray<number>>
): Float64Array => {
  const { config } = w
  const { hiddenSize: hidden, heads, kvHeads, headDim } = config
  const length = embeds.length / hidden
  const half = headDim / 2
  const frequencies = Array.from({ length: half }, (_, k) => 1 / config.ropeTheta ** ((2 * k) / headDim))
  const axes = interleavedAxes(half, config.mropeSection)
  const angles = Array.from({ length }, (_, s) => {
    const freqs = frequencies.map((f, k) => positions[axes[k]!]![s]! * f)
    return [...freqs, ...freqs]
  })
  const cos = angles.map((a) => a.map(Math.cos))
  const sin = angles.map((a) => a.map(Math.sin))
  const rope = (rows: Float64Array, width: number) => {
    const out = new Float64Array(rows.length)
    for (let s = 0; s < length; s++)
      out.set(rotateRow(rows.subarray(s * width, (s + 1) * width), cos[s]!, sin[s]!, headDim), s * width)
    return out
  }

  let x = embeds
  for (const layer of w.layers) {
    const normed = rmsNorm(x, layer.inputNorm, config.rmsNormEps)
    const q = rope(rmsNorm(linear(normed, length, layer.q), layer.qNorm, config.rmsNormEps), heads * headDim)
    const k = rope(rmsNorm(linear(normed, length, layer.k), layer.kNorm, config.rmsNormEps), kvHeads * headDim)
    const v = linear(normed, length, layer.v)
    const attended = attend(q, k, v, { heads, kvHeads, headDim }, (query, key) => key <= query)
    x = add(x, linear(attended, length, layer.o))
    const normed2 = rmsNorm(x, layer.postNorm, config.rmsNormEps)
    const gate = linear(normed2, length, layer.gate).map((g) => g / (1 + Math.exp(-g)))
    const up = linear(normed2, length, layer.up)
    x = add(
      x,
      linear(
        gate.map((g, i) => g * up[i]!),
        length,
        layer.down
      )
    )
  }
  return rmsNorm(x, w.norm, config.rmsNormEps)
}

/** The decoder's logits [sequence, vocab]. */
export const referenceQwen3VLLogits = (
  w: Qwen3VLTextWeights,
  embeds: Float64Array,
  positions: ReadonlyArray<ReadonlyArray<number>>
): Float64Array =>
  linear(referenceQwen3VLHiddenStates(w, embeds, positions), embeds.length / w.config.hiddenSize, {
    weight: w.lmHead
  })

/**
 * Greedy decoding with the float64 reference: the prompt's embeddings (vision features, rows of
 * `features`, written over its pad tokens in order) at its M-RoPE positions [3 × prompt length],
 * then each decoded token at its index + `delta` on all three axes, recomputing the whole sequence
 * at each step.
 */
export const referenceQwen3VLGreedy = (
  w: Qwen3VLTextWeights,
  prompt: ReadonlyArray<number>,
  pad: number,
  features: Float64Array,
  positions: Int32Array,
  delta: number,
  steps: number
): Array<number> => {
  const { hiddenSize: hidden, vocabSize } = w.config
  const tokens = [...prompt]
  const axes = [0, 1, 2].map((axis) => Array.from(positions.subarray(axis * prompt.length, (axis + 1) * prompt.length)))
  const generated: Array<number> = []
  for (let step = 0; step < steps; step++) {
    const embeds = new Float64Array(tokens.length * hidden)
    let feature = 0
    tokens.forEach((token, i) => {
      const row =
        i < prompt.length && token === pad
          ? features.subarray(feature++ * hidden, feature * hidden)
          : w.embedTokens.data.subarray(token * hidden, (token + 1) * hidden)
      embeds.set(row, i * hidden)
    })
    const logits = referenceQwen3VLLogits(w, embeds, axes)
    const token = argmax(logits.subarray((tokens.length - 1) * vocabSize, tokens.length * vocabSize))
    generated.push(token)
    tokens.push(token)
    for (const axis of axes) axis.push(tokens.length - 1 + delta)
  }
  return generated
}
