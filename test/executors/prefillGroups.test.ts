import { describe, expect, it } from "vitest"
import { prefillGroups } from "../../src/executors/llm/PrefillGroups.js"

/** What a grouping costs under the model PrefillGroups uses. */
const cost = (lengths: ReadonlyArray<number>, groups: ReadonlyArray<ReadonlyArray<number>>, runCost: number) =>
  groups.reduce((sum, group) => sum + runCost + group.length * Math.max(...group.map((index) => lengths[index]!)), 0)

describe("prefillGroups", () => {
  it("keeps prompts of like lengths in one run", () => {
    expect(prefillGroups([40, 41, 39, 40], 32)).toEqual([[2, 0, 3, 1]])
    expect(prefillGroups([7], 32)).toEqual([[0]])
    expect(prefillGroups([], 32)).toEqual([])
  })

  it("runs a short prompt apart from a long one when padding it would cost more than a run", () => {
    expect(prefillGroups([2000, 20], 32)).toEqual([[1], [0]])
    // The padding of the short one (30 positions) is less than a run (32): one run.
    expect(prefillGroups([50, 20], 32)).toEqual([[1, 0]])
  })

  it("splits the prompts, shortest first, at the cuts that cost least", () => {
    const lengths = [70, 51, 39, 60, 48, 47, 59]
    const groups = prefillGroups(lengths, 32)
    expect(groups).toEqual([
      [2, 5, 4, 1],
      [6, 3, 0]
    ])
    expect(cost(lengths, groups, 32)).toBe(478)
    expect(cost(lengths, [[2, 5, 4, 1, 6, 3, 0]], 32)).toBe(522)
  })

  it("finds the least cost among every split of the sorted prompts, using each prompt once", () => {
    let seed = 7
    const next = () => {
      seed = (seed * 1103515245 + 12345) % 2 ** 31
      return seed / 2 ** 31
    }
    for (let trial = 0; trial < 200; trial++) {
      const lengths = Array.from({ length: 1 + Math.floor(next() * 7) }, () => 1 + Math.floor(next() * 300))
      const runCost = Math.floor(next() * 100)
      const groups = prefillGroups(lengths, runCost)
      expect(groups.flat().sort((a, b) => a - b)).toEqual(lengths.map((_, index) => index))
      // Every split of the sorted order into contiguous runs, by brute force.
      const sorted = lengths.map((_, index) => index).sort((a, b) => lengths[a]! - lengths[b]! || a - b)
      let least = Number.POSITIVE_INFINITY
      for (let cuts = 0; cuts < 2 ** (sorted.length - 1); cuts++) {
        const split: Array<Array<number>> = [[sorted[0]!]]
        for (let i = 1; i < sorted.length; i++) {
          if (cuts & (1 << (i - 1))) split.push([])
          split[split.length - 1]!.push(sorted[i]!)
        }
        least = Math.min(least, cost(lengths, split, runCost))
      }
      expect(cost(lengths, groups, runCost)).toBe(least)
    }
  })
})
