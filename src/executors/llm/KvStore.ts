import { kvBlockTokens } from "./Limits.js"
import type { CacheArray } from "./PastCache.js"

/**
 * The KV cache of a decoder rewritten onto a shared cache (SharedCacheRewrite.ts), owned by the
 * runner: per cache tensor (each layer's key and value) one buffer [rows, heads, width, headDim].
 * Each request holds a row, its positions at the row's start; a run reads the first rows (a
 * decode step: the batch's; a prompt's piece: its own row) as they lie, with no copy, and the
 * step's new keys and values are written into them. The buffers grow in blocks of positions
 * and in doubled rows, which are the only times rows are copied whole, besides a row moved when
 * the batch's order changes (a request leaves, or joins the decoding rows). They never grow past
 * `maxBytes`: ahead of it they grow only by what their rows need now, and what would need more is
 * refused (the engine admits requests by the same bytes, so it is not asked to).
 */
export class KvStore {
  private buffers: Array<CacheArray>
  private rowCapacity = 0
  /** Positions each row has room for. */
  width = 0
  /** The most positions a row has asked room for since the longest left: what a narrower width must keep. */
  private needed = 0
  /** Row i's holder. */
  private readonly holders: Array<string> = []
  private readonly rowOf = new Map<string, number>()

  constructor(
    private readonly tensors: number,
    private readonly heads: number,
    private readonly headDim: number,
    private readonly half: boolean,
    /** Positions the width grows by. */
    private readonly block = kvBlockTokens,
    /** The most bytes the buffers may take together. */
    readonly maxBytes = Number.POSITIVE_INFINITY
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
    if (this.holders.length === this.rowCapacity) {
      const rows = this.holders.length + 1
      // Near the budget, a row more fits by giving back the width the rows held do not need.
      const width =
        rows * this.width * this.positionBytes <= this.maxBytes
          ? this.width
          : Math.max(this.blocks(this.needed), this.blocksWithin(rows))
      this.resize(this.rowsWithin(Math.max(4, this.rowCapacity * 2), width, rows), width)
    }
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
      this.needed = 0
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
    this.needed = Math.max(this.needed, positions)
    if (positions <= this.width) return
    const least = this.blocks(positions)
    const wanted = Math.max(least, this.blocks(Math.ceil(this.width * 1.5)))
    const width = Math.max(least, Math.min(wanted, this.blocksWithin(Math.max(1, this.rowCapacity))))
    this.resize(this.rowsWithin(this.rowCapacity, width, Math.max(1, this.holders.length)), width)
  }

  /**
   * Gives back room the rows no longer need: once the longest request has left, the width
   * shrinks to the longest left (in blocks) when it is under half of it, and the rows' room to
   * twice the rows held when they are under a quarter of it.
   */
  fit(positions: number): void {
    this.needed = positions
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

  /** Bytes one position of one row takes in all the buffers. */
  private get positionBytes(): number {
    return this.tensors * this.heads * this.headDim * (this.half ? 2 : 4)
  }

  private blocks(positions: number): number {
    return Math.ceil(positions / this.block) * this.block
  }

  /** The widest whole blocks `rows` rows may have within `maxBytes`. */
  private blocksWithin(rows: number): number {
    return Math.floor(this.maxBytes / (rows * this.positionBytes) / this.block) * this.block
  }

  /** `wanted` rows of `width`, or as many as `maxBytes` holds, but never fewer than `least`. */
  private rowsWithin(wanted: number, width: number, least: number): number {
    if (width === 0) return wanted
    const most = Math.floor(this.maxBytes / (width * this.positionBytes))
    return Math.max(least, Math.min(wanted, most))
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
    const bytes = rows * width * this.positionBytes
    if (bytes > this.maxBytes)
      throw new Error(
        `the KV cache would take ${bytes} bytes for ${rows} request(s) of ${width} positions, past its budget of ${this.maxBytes}`
      )
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
