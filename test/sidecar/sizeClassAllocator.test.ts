import { describe, expect, it } from "vitest"
import { SizeClassAllocator } from "../../src/sidecar/SizeClassAllocator.js"

const KiB = 1024
const MiB = 1024 * KiB

/** A deterministic pseudo-random sequence (mulberry32), so a failure replays exactly. */
const random = (seed: number) => () => {
  seed = (seed + 0x6d2b79f5) | 0
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed)
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296
}

describe("SizeClassAllocator", () => {
  it("rounds a request up to its power-of-two class, at least the minimum block", () => {
    const allocator = new SizeClassAllocator(64 * MiB)
    expect(allocator.blockBytes(1)).toBe(4 * KiB)
    expect(allocator.blockBytes(4 * KiB)).toBe(4 * KiB)
    expect(allocator.blockBytes(4 * KiB + 1)).toBe(8 * KiB)
    expect(allocator.blockBytes(7 * MiB)).toBe(8 * MiB)
    expect(allocator.blockBytes(64 * MiB)).toBe(64 * MiB)
    expect(allocator.blockBytes(64 * MiB + 1)).toBeUndefined()
  })

  it("aligns every block to its size and never overlaps two live blocks", () => {
    const allocator = new SizeClassAllocator(16 * MiB)
    const sizes = [5000, 4096, 1 * MiB, 3 * MiB, 100, 70 * KiB, 2 * MiB + 1]
    const blocks = sizes.map((bytes) => {
      const offset = allocator.allocate(bytes)!
      const size = allocator.sizeAt(offset)!
      expect(offset % size).toBe(0)
      expect(size).toBeGreaterThanOrEqual(bytes)
      return { offset, size }
    })
    const sorted = [...blocks].sort((a, b) => a.offset - b.offset)
    for (let i = 1; i < sorted.length; i++)
      expect(sorted[i]!.offset).toBeGreaterThanOrEqual(sorted[i - 1]!.offset + sorted[i - 1]!.size)
    expect(allocator.usedBytes).toBe(blocks.reduce((sum, block) => sum + block.size, 0))
    expect(allocator.allocationCount).toBe(sizes.length)
  })

  it("says no when full and yes again once a block is freed", () => {
    const allocator = new SizeClassAllocator(8 * MiB)
    const first = allocator.allocate(4 * MiB)!
    const second = allocator.allocate(4 * MiB)!
    expect(allocator.allocate(1)).toBeUndefined()
    expect(allocator.largestFreeBytes).toBe(0)
    expect(allocator.release(first)).toBe(4 * MiB)
    expect(allocator.allocate(3 * MiB)).toBe(first)
    allocator.release(second)
    expect(allocator.largestFreeBytes).toBe(4 * MiB)
  })

  it("merges freed buddies back into the whole arena", () => {
    const allocator = new SizeClassAllocator(1 * MiB)
    const offsets = Array.from({ length: 256 }, () => allocator.allocate(4 * KiB)!)
    expect(allocator.allocate(1)).toBeUndefined()
    // Free in an order that leaves no two buddies free until the end.
    for (const offset of offsets.filter((_, i) => i % 2 === 0)) allocator.release(offset)
    expect(allocator.largestFreeBytes).toBe(4 * KiB)
    for (const offset of offsets.filter((_, i) => i % 2 === 1)) allocator.release(offset)
    expect(allocator.usedBytes).toBe(0)
    expect(allocator.largestFreeBytes).toBe(1 * MiB)
    expect(allocator.allocate(1 * MiB)).toBe(0)
  })

  it("uses all of an arena whose size is not a power of two, without merging across its parts", () => {
    const allocator = new SizeClassAllocator(96 * MiB + 5000)
    expect(allocator.capacityBytes).toBe(96 * MiB + 4096)
    expect(allocator.largestBlockBytes).toBe(64 * MiB)
    const big = allocator.allocate(64 * MiB)!
    const middle = allocator.allocate(32 * MiB)!
    const small = allocator.allocate(4096)!
    expect([big, middle, small]).toEqual([0, 64 * MiB, 96 * MiB])
    expect(allocator.allocate(1)).toBeUndefined()
    allocator.release(middle)
    allocator.release(small)
    // 32 MiB and 4 KiB are not buddies: they stay two blocks.
    expect(allocator.largestFreeBytes).toBe(32 * MiB)
    expect(allocator.allocate(64 * MiB)).toBeUndefined()
  })

  it("caps blocks at the maximum size (one mapped segment)", () => {
    const allocator = new SizeClassAllocator(40 * MiB, { maxBlockBytes: 16 * MiB })
    expect(allocator.largestBlockBytes).toBe(16 * MiB)
    expect(allocator.blockBytes(16 * MiB + 1)).toBeUndefined()
    expect([allocator.allocate(16 * MiB), allocator.allocate(16 * MiB), allocator.allocate(8 * MiB)]).toEqual([
      0,
      16 * MiB,
      32 * MiB
    ])
  })

  it("handles offsets beyond 32 bits", () => {
    const allocator = new SizeClassAllocator(2 ** 34, { minBlockBytes: 2 ** 30, maxBlockBytes: 2 ** 31 })
    const offsets = Array.from({ length: 16 }, () => allocator.allocate(2 ** 30)!)
    expect(Math.max(...offsets)).toBe(2 ** 34 - 2 ** 30)
    for (const offset of offsets) allocator.release(offset)
    expect(allocator.largestFreeBytes).toBe(2 ** 31)
    expect(allocator.usedBytes).toBe(0)
  })

  it("refuses bad sizes and unknown frees", () => {
    expect(() => new SizeClassAllocator(1000)).toThrow(/at least one/)
    expect(() => new SizeClassAllocator(MiB, { minBlockBytes: 3000 })).toThrow(/powers of two/)
    const allocator = new SizeClassAllocator(MiB)
    expect(() => allocator.allocate(0)).toThrow(/> 0/)
    expect(() => allocator.release(4096)).toThrow(/no block/)
  })

  it("keeps its accounting through a long random mix of allocations and frees", () => {
    const next = random(42)
    const allocator = new SizeClassAllocator(64 * MiB)
    const live = new Map<number, number>()
    for (let step = 0; step < 10_000; step++) {
      if (live.size > 0 && next() < 0.45) {
        const offsets = [...live.keys()]
        const offset = offsets[Math.floor(next() * offsets.length)]!
        allocator.release(offset)
        live.delete(offset)
      } else {
        const bytes = 1 + Math.floor(next() ** 3 * 8 * MiB)
        const offset = allocator.allocate(bytes)
        if (offset !== undefined) {
          expect(live.has(offset)).toBe(false)
          live.set(offset, allocator.sizeAt(offset)!)
        }
      }
    }
    const blocks = [...live.entries()].sort((a, b) => a[0] - b[0])
    for (let i = 1; i < blocks.length; i++)
      expect(blocks[i]![0]).toBeGreaterThanOrEqual(blocks[i - 1]![0] + blocks[i - 1]![1])
    expect(allocator.usedBytes).toBe(blocks.reduce((sum, [, size]) => sum + size, 0))
    for (const offset of live.keys()) allocator.release(offset)
    expect(allocator.usedBytes).toBe(0)
    expect(allocator.largestFreeBytes).toBe(64 * MiB)
  })
})
