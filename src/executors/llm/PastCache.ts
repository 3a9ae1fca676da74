/**
 * The layout of the decoder's KV cache for a batch of requests with different lengths. A past is
 * the decoder's past_key_values: per layer a key and a value tensor [batch, heads, width,
 * headDim]. Each request owns one row, and its positions are the *last* `length` columns of that
 * row: the columns before them are padding that the attention mask hides. Right-aligned rows let
 * every request's new token go into the same column, so a decode step is one decoder run; a row
 * only moves (`gatherRows`) when the batch changes.
 */

/** A cache tensor's data: float32, or float16 as its bit patterns. */
export type CacheArray = Float32Array | Uint16Array

/** One past: its tensors' data, in the decoder's input order, and its width. */
export interface PastData {
  readonly tensors: ReadonlyArray<CacheArray>
  readonly width: number
}

/** Where a request's cached positions lie. */
export interface CachedRow {
  readonly past: PastData
  readonly row: number
  readonly length: number
}

/**
 * A new past whose row i holds `rows[i]`'s positions, right-aligned, as wide as the longest of
 * them; padding is zero.
 */
export const gatherRows = (rows: ReadonlyArray<CachedRow>, heads: number, headDim: number): PastData => {
  const width = Math.max(0, ...rows.map((row) => row.length))
  const count = rows[0]?.past.tensors.length ?? 0
  const like = rows[0]?.past.tensors[0]
  const size = rows.length * heads * width * headDim
  const tensors: Array<CacheArray> = Array.from({ length: count }, () =>
    like instanceof Uint16Array ? new Uint16Array(size) : new Float32Array(size)
  )
  rows.forEach((source, target) => {
    const from = source.past.width - source.length
    const to = width - source.length
    for (let t = 0; t < count; t++) {
      const input = source.past.tensors[t]!
      const output = tensors[t]!
      for (let h = 0; h < heads; h++) {
        const read = ((source.row * heads + h) * source.past.width + from) * headDim
        output.set(input.subarray(read, read + source.length * headDim), ((target * heads + h) * width + to) * headDim)
      }
    }
  })
  return { tensors, width }
}

/** attention_mask [batch, total] for right-aligned rows: row i sees its last `visible[i]` columns. */
export const rightAlignedMask = (visible: ReadonlyArray<number>, total: number): BigInt64Array => {
  const mask = new BigInt64Array(visible.length * total)
  visible.forEach((count, row) => mask.fill(1n, (row + 1) * total - count, (row + 1) * total))
  return mask
}
