import type { CacheArray } from "./PastCache.js"

/**
 * The KV cache of a decoder rewritten onto a shared cache (SharedCacheRewrite.ts), owned by the
 * runner: per cache tensor (each layer's key and value) one buffer [rows, heads, width, headDim].
 * Each request holds a row, its positions at the row's start; a run reads the first rows (a
 * decode step: the batch's; a prompt's piece: its own row) as they lie, with no copy, and the
 * step's new keys and values are written into them. The buffers grow in blocks of positions
 * and in doubled rows, which are the only times rows are copied whole, besides a row moved when
 * the batch's order changes (a request leaves, or joins the decoding rows).
 */
export class KvStore {
  private buffers: Array<CacheArray>
  private rowCapacity = 0
  /** Positions each row has room for. */
  width = 0
  /** Row i's holder. */
  private readonly holders: Array<string> = []
  private readonly rowOf = new Map<string, number>()

  constructor(
    private readonly tensors: number,
    private readonly heads: number,
    private readonly headDim: number,
    private readonly half: boolean,
    /** Positions the width grows by. */
    private readonly block = 256
  ) {
    this.buffers = []
  }

  get rows(): number {
    return this.holders.length
  }

  /** Bytes the buffers take. */
  get bytes(): number {
    return this.buffers.reduce((sum, buffer) => sum + buffer.byteLength, 0)
  }

  row(id: string): number {
    const row = this.rowOf.get(id)
    if (row === undefined) throw new Error(`request ${id} holds no cache row`)
    return row
  }

  /** The requests holding rows. */
  get held(): ReadonlyArray<string> {
    return [...this.holders]
  }

  has(id: string): boolean {
    return this.rowOf.has(id)
  }

  /** A row for a request, after the others. */
  acquire(id: string): number {
    if (this.rowOf.has(id)) return this.rowOf.get(id)!
    if (this.holders.length === this.rowCapacity) this.resize(Math.max(4, this.rowCapacity * 2), this.width)
    this.holders.push(id)
    this.rowOf.set(id, this.holders.length - 1)
    return this.holders.length - 1
  }

  /** Frees a request's row; the last row moves into it. Empty, the buffers go. */
  release(id: string): void {
    const row = this.rowOf.get(id)
    if (row === undefined) return
    this.rowOf.delete(id)
    const last = this.holders.length - 1
    if (row !== last) {
      const moved = this.holders[last]!
      this.copyRow(last, row)
      this.holders[row] = moved
      this.rowOf.set(moved, row)
    }
    this.holders.pop()
    if (this.holders.length === 0) {
      this.buffers = []
      this.rowCapacity = 0
      this.width = 0
    }
  }

  /** Puts `ids` in rows 0 … n − 1, in order (a decode step reads them as one batch). */
  arrange(ids: ReadonlyArray<string>): void {
    ids.forEach((id, target) => {
      const row = this.row(id)
      if (row === target) return
      const other = this.holders[target]!
      this.swapRows(row, target)
      this.holders[target] = id
      this.holders[row] = other
      this.rowOf.set(id, target)
      this.rowOf.set(other, row)
    })
  }

  /**
   * Room for `positions` in every row. The width grows by half again at least, so that a row
   * that grows a position at a time copies the rows a logarithmic number of times.
   */
  ensureWidth(positions: number): void {
    if (positions <= this.width) return
    const needed = Math.max(positions, Math.ceil(this.width * 1.5))
    this.resize(this.rowCapacity, Math.ceil(needed / this.block) * this.block)
  }

  /**
   * Gives back room the rows no longer need: once the longest request has left, the width
   * shrinks to the longest left (in blocks) when it is under half of it, and the rows' room to
   * twice the rows held when they are under a quarter of it.
   */
  fit(positions: number): void {
    const width = Math.max(this.block, Math.ceil(positions / this.block) * this.block)
    const rows = Math.max(4, 2 * this.holders.length)
    const narrower = width * 2 <= this.width
    const fewer = rows * 2 <= this.rowCapacity && this.holders.length * 4 <= this.rowCapacity
    if (this.holders.length > 0 && (narrower || fewer))
      this.resize(fewer ? rows : this.rowCapacity, narrower ? width : this.width)
  }

  /** Tensor t's data for rows [from, from + count), [count, heads, width, headDim], as it lies. */
  view(t: number, from: number, count: number): CacheArray {
    const size = this.heads * this.width * this.headDim
    return this.buffers[t]!.subarray(from * size, (from + count) * size)
  }

  /**
   * Writes a run's new positions of tensor t: `data` is [batch, heads, count, headDim], its row
   * `batchRow` going to `row` at `position`.
   */
  write(t: number, row: number, position: number, data: CacheArray, batchRow: number, count: number): void {
    const { heads, headDim, width } = this
    const buffer = this.buffers[t]!
    const span = count * headDim
    for (let h = 0; h < heads; h++) {
      const from = (batchRow * heads + h) * span
      buffer.set(data.subarray(from, from + span), ((row * heads + h) * width + position) * headDim)
    }
  }

  /** Writes `length` positions of a dense past [1, heads, length, headDim] into a row's start. */
  writePast(tensors: ReadonlyArray<CacheArray>, row: number, length: number): void {
    tensors.forEach((data, t) => this.write(t, row, 0, data, 0, length))
  }

  /** The buffers, for the prefix cache to copy a row's blocks from. */
  get data(): ReadonlyArray<CacheArray> {
    return this.buffers
  }

  private rowSize(): number {
    return this.heads * this.width * this.headDim
  }

  private copyRow(from: number, to: number): void {
    const size = this.rowSize()
    for (const buffer of this.buffers) buffer.copyWithin(to * size, from * size, (from + 1) * size)
  }

  private swapRows(a: number, b: number): void {
    const size = this.rowSize()
    for (const buffer of this.buffers) {
      const held = buffer.slice(a * size, (a + 1) * size)
      buffer.copyWithin(a * size, b * size, (b + 1) * size)
      buffer.set(held, b * size)
    }
  }

  private resize(rows: number, width: number): void {
    const { heads, headDim } = this
    const old = this.buffers
    const oldWidth = this.width
    const size = rows * heads * width * headDim
    this.buffers = Array.from({ length: this.tensors }, (_, t) => {
      // Not zeroed: the attention reads only each row's own positions, all written before they are read.
      const bytes = Buffer.allocUnsafeSlow(size * (this.half ? 2 : 4))
      const next = this.half
        ? new Uint16Array(bytes.buffer, bytes.byteOffset, size)
        : new Float32Array(bytes.buffer, bytes.byteOffset, size)
      const previous = old[t]
      if (previous !== undefined) {
        const kept = Math.min(oldWidth, width) * headDim
        for (let row = 0; row < this.holders.length; row++)
          for (let h = 0; h < heads; h++) {
            const from = (row * heads + h) * oldWidth * headDim
            next.set(previous.subarray(from, from + kept), (row * heads + h) * width * headDim)
          }
      }
      return next
    })
    this.rowCapacity = rows
    this.width = width
  }
}
