/**
 * Carves the arena into blocks whose sizes are powers of two (a buddy allocator).
 *
 * Why size classes: a tensor must sit in one contiguous block so that a receiver can view it in
 * place, and power-of-two blocks split and merge back in O(log n) without scanning, so the
 * arena does not fragment into unusable slivers however transfers of mixed sizes interleave. The
 * price is up to half a block of slack per tensor (a 5 MiB tensor takes an 8 MiB block).
 *
 * Pure: offsets only, no memory and no I/O, so it is tested with plain numbers.
 */

export interface AllocatorOptions {
  /** The smallest block; a power of two. Blocks are aligned to their size, so also the alignment. */
  readonly minBlockBytes?: number
  /** The largest block; a power of two. The arena is mapped in segments of this size. */
  readonly maxBlockBytes?: number
}

const defaultMinBlockBytes = 4096
const defaultMaxBlockBytes = 2 ** 31

const log2 = (value: number) => Math.log2(value)

const isPowerOfTwo = (value: number) =>
  Number.isSafeInteger(value) && value > 0 && 2 ** Math.round(log2(value)) === value

interface TopBlock {
  readonly offset: number
  readonly order: number
}

export class SizeClassAllocator {
  /** The bytes that blocks cover: the capacity rounded down to a whole number of minimum blocks. */
  readonly capacityBytes: number
  readonly largestBlockBytes: number
  private readonly minOrder: number
  /** Free blocks' offsets by order (log2 of the block size). */
  private readonly free: Array<Set<number>> = []
  /** Allocated blocks: offset → order. */
  private readonly allocated = new Map<number, number>()
  /** The arena split into the largest aligned blocks it holds, largest first; merging stops at these. */
  private readonly topBlocks: ReadonlyArray<TopBlock>
  private used = 0

  constructor(capacityBytes: number, options: AllocatorOptions = {}) {
    const minBlock = options.minBlockBytes ?? defaultMinBlockBytes
    const maxBlock = options.maxBlockBytes ?? defaultMaxBlockBytes
    if (!isPowerOfTwo(minBlock) || !isPowerOfTwo(maxBlock) || maxBlock < minBlock) {
      throw new RangeError(`block sizes must be powers of two with min ≤ max, got ${minBlock} and ${maxBlock}`)
    }
    if (!Number.isSafeInteger(capacityBytes) || capacityBytes < minBlock) {
      throw new RangeError(`the arena must hold at least one ${minBlock}-byte block, got ${capacityBytes} bytes`)
    }
    this.minOrder = log2(minBlock)
    const maxOrder = log2(maxBlock)
    for (let order = 0; order <= maxOrder; order++) this.free.push(new Set())
    // Largest first keeps every top block aligned to its own size, which buddy arithmetic needs.
    const topBlocks: Array<TopBlock> = []
    let offset = 0
    let remaining = Math.floor(capacityBytes / minBlock) * minBlock
    for (let order = maxOrder; order >= this.minOrder; order--) {
      while (remaining >= 2 ** order) {
        topBlocks.push({ offset, order })
        this.free[order]!.add(offset)
        offset += 2 ** order
        remaining -= 2 ** order
      }
    }
    this.topBlocks = topBlocks
    this.capacityBytes = offset
    this.largestBlockBytes = 2 ** topBlocks[0]!.order
  }

  /** The size of the block a request of `bytes` takes, or undefined when no block is that large. */
  blockBytes(bytes: number): number | undefined {
    const order = this.orderFor(bytes)
    return order === undefined ? undefined : 2 ** order
  }

  /** The offset of a block of at least `bytes`, or undefined when no free block is large enough now. */
  allocate(bytes: number): number | undefined {
    const order = this.orderFor(bytes)
    if (order === undefined) return undefined
    let found = order
    while (found < this.free.length && this.free[found]!.size === 0) found++
    if (found === this.free.length) return undefined
    const blocks = this.free[found]!
    const offset = blocks.values().next().value as number
    blocks.delete(offset)
    // Split: keep the lower half, free the upper half, until the block is the requested class.
    while (found > order) {
      found--
      this.free[found]!.add(offset + 2 ** found)
    }
    this.allocated.set(offset, order)
    this.used += 2 ** order
    return offset
  }

  /** Frees an allocated block; returns its size. Merges it with its buddy while the buddy is free. */
  release(offset: number): number {
    const order = this.allocated.get(offset)
    if (order === undefined) throw new RangeError(`no block is allocated at offset ${offset}`)
    this.allocated.delete(offset)
    this.used -= 2 ** order
    const topOrder = this.topOrderAt(offset)
    let merged = offset
    let mergedOrder = order
    while (mergedOrder < topOrder) {
      const size = 2 ** mergedOrder
      // Plain arithmetic rather than XOR: offsets may exceed 32 bits.
      const buddy = (merged / size) % 2 === 0 ? merged + size : merged - size
      if (!this.free[mergedOrder]!.delete(buddy)) break
      merged = Math.min(merged, buddy)
      mergedOrder++
    }
    this.free[mergedOrder]!.add(merged)
    return 2 ** order
  }

  /** The size of the block allocated at `offset`, or undefined when none is. */
  sizeAt(offset: number): number | undefined {
    const order = this.allocated.get(offset)
    return order === undefined ? undefined : 2 ** order
  }

  /** The smallest block: what a request of fewer bytes takes. */
  get minBlockBytes(): number {
    return 2 ** this.minOrder
  }

  get usedBytes(): number {
    return this.used
  }

  get allocationCount(): number {
    return this.allocated.size
  }

  /** The largest block that could be allocated now (0 when the arena is full). */
  get largestFreeBytes(): number {
    for (let order = this.free.length - 1; order >= this.minOrder; order--) {
      if (this.free[order]!.size > 0) return 2 ** order
    }
    return 0
  }

  private orderFor(bytes: number): number | undefined {
    if (!Number.isSafeInteger(bytes) || bytes <= 0)
      throw new RangeError(`an allocation is a whole number of bytes > 0, got ${bytes}`)
    if (bytes > this.largestBlockBytes) return undefined
    const order = Math.max(this.minOrder, Math.ceil(log2(bytes)))
    // Math.log2 may round 2^k + 1 down to k for very large k.
    return 2 ** order < bytes ? order + 1 : order
  }

  private topOrderAt(offset: number): number {
    let low = 0
    let high = this.topBlocks.length - 1
    while (low < high) {
      const middle = Math.ceil((low + high) / 2)
      if (this.topBlocks[middle]!.offset <= offset) low = middle
      else high = middle - 1
    }
    return this.topBlocks[low]!.order
  }
}
