import { describe, expect, it } from "vitest"
import { blockKeys, PrefixCache } from "../../../src/executors/llm/PrefixCache.js"
import type { PastData } from "../../../src/executors/llm/PastCache.js"
import type { PromptInput } from "../../../src/executors/llm/protocol.js"

const geometry = { tensors: 4, heads: 2, headDim: 3, half: false }
const B = 4
const prompt = (ids: ReadonlyArray<number>, media: PromptInput["media"] = []): PromptInput => ({
  inputIds: Int32Array.from(ids),
  media
})
const image = (value: number) => ({
  kind: "pixel_values" as const,
  data: new Float32Array(12).fill(value),
  shape: [1, 3, 2, 2]
})

/** A past of one prompt's positions, right-aligned in row `row` of a batch of 2, whose value at (tensor, head, position, i) is recognisable. */
const pastOf = (length: number, width: number, row: number): PastData => {
  const tensors = Array.from({ length: geometry.tensors }, (_, t) => {
    const data = new Float32Array(2 * geometry.heads * width * geometry.headDim).fill(-1)
    for (let h = 0; h < geometry.heads; h++)
      for (let p = 0; p < length; p++)
        for (let i = 0; i < geometry.headDim; i++)
          data[((row * geometry.heads + h) * width + width - length + p) * geometry.headDim + i] =
            t * 1000 + h * 100 + p + i / 10
    return data
  })
  return { tensors, width }
}

describe("PrefixCache", () => {
  it("keys whole blocks, chained: equal prefixes share keys, a change changes every key after it", () => {
    const a = blockKeys(prompt([1, 2, 3, 4, 5, 6, 7, 8, 9]), B)
    const b = blockKeys(prompt([1, 2, 3, 4, 5, 6, 7, 8, 10, 11]), B)
    const c = blockKeys(prompt([0, 2, 3, 4, 5, 6, 7, 8]), B)
    expect(a).toHaveLength(2)
    expect(b).toEqual(a)
    expect(c[0]).not.toBe(a[0])
    expect(c[1]).not.toBe(a[1])
  })

  it("keys a block by its media's content: the same placeholders with another image do not match", () => {
    const ids = [9, 9, 9, 9, 1, 2, 3, 4]
    const red = blockKeys(prompt(ids, [{ start: 0, rows: 4, input: image(1) }]), B)
    const blue = blockKeys(prompt(ids, [{ start: 0, rows: 4, input: image(2) }]), B)
    const red2 = blockKeys(prompt(ids, [{ start: 0, rows: 4, input: image(1) }]), B)
    expect(blue[0]).not.toBe(red[0])
    expect(blue[1]).not.toBe(red[1])
    expect(red2).toEqual(red)
  })

  it("gives back the positions it was given, from a padded row of a batch", () => {
    const cache = new PrefixCache(B, 1 << 20, geometry)
    const keys = blockKeys(prompt([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]), B)
    cache.insert(keys, { past: pastOf(10, 13, 1), row: 1, length: 10 })
    expect(cache.lookup(keys, 2)).toBe(2)
    const read = cache.read(keys, 2)
    expect(read.width).toBe(8)
    const expected = pastOf(8, 8, 0)
    // Row 0 of a batch of 2 holds what row 0 of the read holds.
    read.tensors.forEach((tensor, t) => expect(tensor).toEqual(expected.tensors[t]!.subarray(0, tensor.length)))
    expect(cache.stats).toMatchObject({ lookups: 1, hits: 1, hitTokens: 8, blocks: 2 })
  })

  it("leaves at least `limit` blocks out, and counts a miss", () => {
    const cache = new PrefixCache(B, 1 << 20, geometry)
    const keys = blockKeys(prompt([1, 2, 3, 4, 5, 6, 7, 8]), B)
    cache.insert(keys, { past: pastOf(8, 8, 0), row: 0, length: 8 })
    expect(cache.lookup(keys, 1)).toBe(1)
    expect(cache.lookup(blockKeys(prompt([2, 2, 3, 4, 5]), B), 1)).toBe(0)
    expect(cache.stats).toMatchObject({ lookups: 2, hits: 1, hitTokens: 4 })
  })

  it("holds within its bound under a flood of distinct prompts, evicting chains from their ends", () => {
    const bytesPerBlock = geometry.tensors * geometry.heads * B * geometry.headDim * 4
    const cache = new PrefixCache(B, 10 * bytesPerBlock, geometry)
    const shared = blockKeys(prompt([5, 5, 5, 5, 1, 1, 1, 1, 2, 2, 2, 2]), B)
    cache.insert(shared, { past: pastOf(12, 12, 0), row: 0, length: 12 })
    for (let i = 0; i < 500; i++) {
      const ids = Array.from({ length: 12 }, (_, p) => i * 100 + p)
      cache.insert(blockKeys(prompt(ids), B), { past: pastOf(12, 12, 0), row: 0, length: 12 })
      expect(cache.stats.bytes).toBeLessThanOrEqual(10 * bytesPerBlock)
      // The shared prompt is asked for now and then: its head stays, its tail goes first.
      if (i % 2 === 0) cache.lookup(shared, 3)
    }
    expect(cache.stats.blocks).toBe(10)
    expect(cache.stats.evictions).toBe(3 + 500 * 3 - 10)
    expect(cache.lookup(shared, 3)).toBeGreaterThanOrEqual(1)
  })

  it("keeps nothing when a block is larger than its bound", () => {
    const cache = new PrefixCache(B, 10, geometry)
    const keys = blockKeys(prompt([1, 2, 3, 4]), B)
    cache.insert(keys, { past: pastOf(4, 4, 0), row: 0, length: 4 })
    expect(cache.stats.blocks).toBe(0)
  })
})
