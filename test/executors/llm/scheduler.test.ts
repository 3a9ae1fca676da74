import { describe, expect, it } from "vitest"
import { gatherRows, rightAlignedMask } from "../../../src/executors/llm/PastCache.js"
import { ContinuousScheduler } from "../../../src/executors/llm/Scheduler.js"

/** A position is a byte and a block, so that bytes read as positions. */
const kvCache = { rowBytes: 100, bytesPerPosition: 1, blockTokens: 1 }
const limits = { lanes: 1, maxRunning: 8, kvCache, maxQueuedRequests: 10 }

describe("ContinuousScheduler", () => {
  it("lets requests join at step boundaries and keeps the ones already running", () => {
    const scheduler = new ContinuousScheduler(limits)
    scheduler.enqueue("a", 10)
    expect(scheduler.admit(0)).toEqual(["a"])
    scheduler.enqueue("b", 10)
    scheduler.enqueue("c", 10)
    expect(scheduler.running(0)).toEqual(["a"])
    expect(scheduler.admit(0)).toEqual(["b", "c"])
    expect(scheduler.running(0)).toEqual(["a", "b", "c"])
    expect(scheduler.admit(0)).toEqual([])
  })

  it("holds waiting requests while the KV cache budget is used up, oldest first, and admits them as others finish", () => {
    const scheduler = new ContinuousScheduler(limits)
    scheduler.enqueue("big", 70)
    scheduler.enqueue("large", 40)
    scheduler.enqueue("small", 5)
    // "small" would fit, but it does not overtake "large".
    expect(scheduler.admit(0)).toEqual(["big"])
    expect(scheduler.stats).toEqual({ waiting: 2, running: 1, usedTokens: 70, reservedBytes: 70, budgetBytes: 100 })
    expect(scheduler.release("big")).toEqual({ _tag: "Running", lane: 0 })
    expect(scheduler.stats.usedTokens).toBe(0)
    expect(scheduler.admit(0)).toEqual(["large", "small"])
    // Two rows as wide as the longer: 80 bytes.
    expect(scheduler.stats).toEqual({ waiting: 0, running: 2, usedTokens: 45, reservedBytes: 80, budgetBytes: 100 })
  })

  it("caps a batch at maxRunning", () => {
    const scheduler = new ContinuousScheduler({ ...limits, maxRunning: 2 })
    for (const id of ["a", "b", "c"]) scheduler.enqueue(id, 1)
    expect(scheduler.admit(0)).toEqual(["a", "b"])
    scheduler.release("a")
    expect(scheduler.admit(0)).toEqual(["c"])
  })

  it("refuses a request when the queue is full, and one that needs more cache than a device has", () => {
    const scheduler = new ContinuousScheduler({ ...limits, maxQueuedRequests: 2 })
    expect(scheduler.enqueue("a", 10)._tag).toBe("Queued")
    scheduler.admit(0)
    expect(scheduler.enqueue("b", 10)._tag).toBe("Queued")
    expect(scheduler.enqueue("c", 10)._tag).toBe("QueueFull")
    expect(scheduler.enqueue("d", 101)).toEqual({ _tag: "TooLarge", neededBytes: 101, budgetBytes: 100 })
    scheduler.release("a")
    expect(scheduler.enqueue("c", 10)._tag).toBe("Queued")
  })

  it("drops a cancelled waiting request, and frees a cancelled running one's cache", () => {
    const scheduler = new ContinuousScheduler(limits)
    scheduler.enqueue("a", 60)
    scheduler.enqueue("b", 60)
    scheduler.admit(0)
    expect(scheduler.placement("b")).toEqual({ _tag: "Waiting" })
    expect(scheduler.release("b")).toEqual({ _tag: "Waiting" })
    expect(scheduler.release("a")).toEqual({ _tag: "Running", lane: 0 })
    expect(scheduler.release("a")).toBeUndefined()
    expect(scheduler.stats).toEqual({ waiting: 0, running: 0, usedTokens: 0, reservedBytes: 0, budgetBytes: 100 })
  })

  it("spreads requests over devices, each with its own batch and budget", () => {
    const scheduler = new ContinuousScheduler({ ...limits, lanes: 2 })
    for (const id of ["a", "b", "c", "d"]) scheduler.enqueue(id, 30)
    // Lane 0 takes one, then leaves the next to the emptier lane 1, which takes two.
    expect(scheduler.admit(0)).toEqual(["a"])
    expect(scheduler.admit(1)).toEqual(["b", "c"])
    expect(scheduler.admit(0)).toEqual(["d"])
    expect(scheduler.running(1)).toEqual(["b", "c"])
    expect(scheduler.stats).toEqual({ waiting: 0, running: 4, usedTokens: 120, reservedBytes: 120, budgetBytes: 200 })
  })

  it("counts the bytes as the KV store holds them: every row as wide as the longest, in whole blocks", () => {
    const scheduler = new ContinuousScheduler({
      ...limits,
      kvCache: { rowBytes: 1024, bytesPerPosition: 4, blockTokens: 16 }
    })
    // 100 positions take 7 blocks of 16: 448 bytes alone, 896 beside another row.
    scheduler.enqueue("long", 100)
    scheduler.enqueue("short", 10)
    scheduler.enqueue("third", 10)
    expect(scheduler.admit(0)).toEqual(["long", "short"])
    // A third row would make 3 × 448 = 1344 bytes, though its positions alone would fit.
    expect(scheduler.stats).toMatchObject({ usedTokens: 110, reservedBytes: 896 })
    scheduler.release("long")
    expect(scheduler.admit(0)).toEqual(["third"])
    expect(scheduler.stats).toMatchObject({ reservedBytes: 2 * 64 })
    // One that cannot fit alone says how many bytes it needs.
    expect(scheduler.enqueue("huge", 257)).toEqual({ _tag: "TooLarge", neededBytes: 17 * 16 * 4, budgetBytes: 1024 })
  })
})

describe("the batch KV cache layout", () => {
  /** A past of one tensor [rows, heads = 1, width, headDim = 1] holding each row's values right-aligned. */
  const past = (rows: ReadonlyArray<ReadonlyArray<number>>, width: number) => {
    const data = new Float32Array(rows.length * width)
    rows.forEach((values, row) => data.set(values, row * width + width - values.length))
    return { tensors: [data], width }
  }

  it("gathers requests from different pasts into one, right-aligned, zero-padded", () => {
    const running = past(
      [
        [1, 2, 3],
        [4, 5]
      ],
      4
    )
    const joined = past([[7], [8, 9]], 2)
    const gathered = gatherRows(
      [
        { past: joined, row: 1, length: 2 },
        { past: running, row: 0, length: 3 },
        { past: joined, row: 0, length: 1 }
      ],
      1,
      1
    )
    expect(gathered.width).toBe(3)
    expect([...gathered.tensors[0]!]).toEqual([0, 8, 9, 1, 2, 3, 0, 0, 7])
  })

  it("keeps every head's positions together", () => {
    // [1 row, 2 heads, width 3, headDim 2], the request's last 2 positions in use.
    const data = Float32Array.from({ length: 12 }, (_, i) => i)
    const gathered = gatherRows([{ past: { tensors: [data, data], width: 3 }, row: 0, length: 2 }], 2, 2)
    expect(gathered.width).toBe(2)
    expect([...gathered.tensors[1]!]).toEqual([2, 3, 4, 5, 8, 9, 10, 11])
  })

  it("masks the padding before each row's positions", () => {
    expect([...rightAlignedMask([3, 1, 4], 4)].map(Number)).toEqual([0, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1])
  })
})
