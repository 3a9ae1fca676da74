import type { Pooling } from "../../models/TextEmbedding.js"

/**
 * How a text embedding model's token embeddings become one vector per input, and how inputs of
 * different lengths are grouped into padded runs. Pure functions over plain arrays: the worker
 * runs them on ONNX Runtime's output, the router on the vectors it answers with.
 */

/**
 * Row `row` of `hidden` ([rows, width, size], row-major), whose first `length` positions are its
 * tokens (the rest padding), pooled into one vector of `size`: the mean of its tokens, the first
 * ([CLS]), or the last (a decoder's end of sequence). Sums run in float64, as transformers.js's do.
 */
export const poolRow = (
  hidden: ArrayLike<number>,
  width: number,
  size: number,
  row: number,
  length: number,
  pooling: Pooling
): Float32Array => {
  const out = new Float32Array(size)
  const rowStart = row * width * size
  if (pooling !== "mean") {
    const at = rowStart + (pooling === "cls" ? 0 : length - 1) * size
    for (let i = 0; i < size; i++) out[i] = hidden[at + i]!
    return out
  }
  const sums = new Float64Array(size)
  for (let position = 0; position < length; position++) {
    const at = rowStart + position * size
    for (let i = 0; i < size; i++) sums[i]! += hidden[at + i]!
  }
  for (let i = 0; i < size; i++) out[i] = sums[i]! / length
  return out
}

/** `vector` scaled to unit length (L2), in place; a zero vector stays zero. */
export const normalizeInPlace = (vector: Float32Array): Float32Array => {
  let sum = 0
  for (const value of vector) sum += value * value
  const norm = Math.max(Math.sqrt(sum), 1e-12)
  for (let i = 0; i < vector.length; i++) vector[i] = vector[i]! / norm
  return vector
}

/** The first `dimensions` values of `vector`, normalized again when the model's vectors are (Matryoshka). */
export const cutDimensions = (vector: Float32Array, dimensions: number, normalize: boolean): Float32Array => {
  if (dimensions >= vector.length) return vector
  const cut = vector.slice(0, dimensions)
  return normalize ? normalizeInPlace(cut) : cut
}

/**
 * Inputs grouped into runs of one padded batch each: longest first, a run closed when one more
 * input would take its padded size (rows × its longest) over `maxTokens`, or when the next input is
 * under half its longest (beyond `shortLength`, below which padding costs less than another run).
 * Answers indices into `lengths`, in runs.
 */
export const paddedRuns = (
  lengths: ReadonlyArray<number>,
  maxTokens: number,
  shortLength = 16
): Array<Array<number>> => {
  const order = lengths.map((_, index) => index).sort((a, b) => lengths[b]! - lengths[a]! || a - b)
  const runs: Array<Array<number>> = []
  let run: Array<number> = []
  let width = 0
  for (const index of order) {
    const length = lengths[index]!
    const fits = (run.length + 1) * width <= maxTokens && (length * 2 >= width || width <= shortLength)
    if (run.length > 0 && !fits) {
      runs.push(run)
      run = []
    }
    if (run.length === 0) width = length
    run.push(index)
  }
  if (run.length > 0) runs.push(run)
  return runs
}
