import { describe, expect, it } from "vitest"
import { KvStore } from "../../../src/executors/llm/KvStore.js"

/** One cache tensor of one head of one value: a position of a row is 4 bytes (float32). */
const store = (maxBytes?: number) => new KvStore(1, 1, 1, false, 4, maxBytes)

describe("KvStore", () => {
  it("grows its rows and width ahead of need when nothing bounds it", () => {
    const unbounded = store()
    unbounded.acquire("a")
    unbounded.ensureWidth(5)
    // Four rows at first, two blocks of 4 positions wide.
    expect(unbounded.bytes).toBe(4 * 8 * 4)
  })

  it("never grows past its budget: near it, rows and width grow only by what is held", () => {
    // 96 bytes: 24 positions of rows.
    const bounded = store(96)
    bounded.acquire("a")
    bounded.ensureWidth(10)
    // Four rows of 12 would be 192 bytes: it keeps to what fits (two rows of 12).
    expect(bounded.bytes).toBeLessThanOrEqual(96)
    expect(bounded.width).toBe(12)
    bounded.acquire("b")
    bounded.ensureWidth(12)
    expect(bounded.bytes).toBeLessThanOrEqual(96)
    expect(bounded.rows).toBe(2)
  })

  it("gives back the width a request that left needed, and refuses what the budget cannot hold", () => {
    const bounded = store(96)
    for (const id of ["a", "b"]) {
      bounded.acquire(id)
      bounded.ensureWidth(4)
    }
    bounded.acquire("long")
    bounded.ensureWidth(8)
    expect(bounded.bytes).toBe(3 * 8 * 4)
    bounded.release("long")
    bounded.fit(4)
    for (const id of ["c", "d"]) {
      bounded.acquire(id)
      bounded.ensureWidth(4)
    }
    expect(bounded.rows).toBe(4)
    expect(bounded.bytes).toBeLessThanOrEqual(96)
    expect(() => bounded.ensureWidth(40)).toThrow(/past its budget of 96/)
  })
})
