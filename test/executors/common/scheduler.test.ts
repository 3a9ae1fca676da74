import { describe, expect, it } from "vitest"
import { type Decision, Scheduler } from "../../../src/executors/common/Scheduler.js"

const limits = { maxBatchSize: 4, maxBatchDelayMs: 0, maxQueuedRequests: 8 }
const items = (...keys: Array<string>) => keys.map((key, index) => ({ key, payload: `${key}${index}` }))
const batchOf = (decision: Decision<string>) => {
  if (decision._tag !== "Batch") throw new Error(`expected a batch, got ${decision._tag}`)
  return decision
}
const ids = (decision: Decision<string>) => batchOf(decision).items.map((item) => `${item.requestId}:${item.index}`)

describe("Scheduler", () => {
  it("batches items of one key in FIFO order across requests", () => {
    const scheduler = new Scheduler<string>(limits)
    scheduler.enqueue("a", items("image", "image"), 0)
    scheduler.enqueue("b", items("image"), 1)
    const decision = scheduler.next(10)
    expect(batchOf(decision).key).toBe("image")
    expect(ids(decision)).toEqual(["a:0", "a:1", "b:0"])
    expect(batchOf(decision).items.map((item) => item.payload)).toEqual(["image0", "image1", "image0"])
  })

  it("stops a batch at the first item of another key, even if later items match again", () => {
    const scheduler = new Scheduler<string>(limits)
    scheduler.enqueue("a", items("image"), 0)
    scheduler.enqueue("b", items("audio"), 0)
    scheduler.enqueue("c", items("image"), 0)
    expect(ids(scheduler.next(0))).toEqual(["a:0"])
    expect(ids(scheduler.next(0))).toEqual(["b:0"])
    expect(ids(scheduler.next(0))).toEqual(["c:0"])
    expect(scheduler.next(0)._tag).toBe("Idle")
  })

  it("caps a batch at maxBatchSize and continues with the rest", () => {
    const scheduler = new Scheduler<string>({ ...limits, maxBatchSize: 2 })
    scheduler.enqueue("a", items("image", "image", "image"), 0)
    expect(ids(scheduler.next(0))).toEqual(["a:0", "a:1"])
    expect(ids(scheduler.next(0))).toEqual(["a:2"])
  })

  it("never schedules an item twice while it runs", () => {
    const scheduler = new Scheduler<string>(limits)
    scheduler.enqueue("a", items("image"), 0)
    scheduler.next(0)
    expect(scheduler.next(0)._tag).toBe("Idle")
  })

  it("completes a request only when all its items are done", () => {
    const scheduler = new Scheduler<string>({ ...limits, maxBatchSize: 1 })
    scheduler.enqueue("a", items("image", "image"), 0)
    const first = batchOf(scheduler.next(0))
    expect(scheduler.complete(first.items)).toEqual([])
    const second = batchOf(scheduler.next(0))
    expect(scheduler.complete(second.items)).toEqual(["a"])
    expect(scheduler.size).toBe(0)
  })

  it("a request with items of two keys finishes after both batches", () => {
    const scheduler = new Scheduler<string>(limits)
    scheduler.enqueue("mixed", items("image", "audio"), 0)
    const images = batchOf(scheduler.next(0))
    const audio = batchOf(scheduler.next(0))
    expect([images.key, audio.key]).toEqual(["image", "audio"])
    expect(scheduler.complete(audio.items)).toEqual([])
    expect(scheduler.complete(images.items)).toEqual(["mixed"])
  })

  it("waits up to maxBatchDelayMs for a fuller batch, then runs what it has", () => {
    const scheduler = new Scheduler<string>({ ...limits, maxBatchDelayMs: 10 })
    scheduler.enqueue("a", items("image"), 100)
    expect(scheduler.next(104)).toEqual({ _tag: "Wait", ms: 6 })
    scheduler.enqueue("b", items("image"), 105)
    expect(scheduler.next(106)).toEqual({ _tag: "Wait", ms: 4 })
    expect(ids(scheduler.next(110))).toEqual(["a:0", "b:0"])
  })

  it("does not wait when the batch is already full, or when the next item has another key", () => {
    const full = new Scheduler<string>({ ...limits, maxBatchSize: 1, maxBatchDelayMs: 1_000 })
    full.enqueue("a", items("image"), 0)
    expect(ids(full.next(0))).toEqual(["a:0"])

    const blocked = new Scheduler<string>({ ...limits, maxBatchDelayMs: 1_000 })
    blocked.enqueue("a", items("image"), 0)
    blocked.enqueue("b", items("audio"), 0)
    expect(ids(blocked.next(0))).toEqual(["a:0"])
  })

  it("refuses requests beyond maxQueuedRequests, and accepts again once one completes", () => {
    const scheduler = new Scheduler<string>({ ...limits, maxQueuedRequests: 2 })
    expect(scheduler.enqueue("a", items("image"), 0)).toBe(true)
    expect(scheduler.enqueue("b", items("image"), 0)).toBe(true)
    expect(scheduler.enqueue("c", items("image"), 0)).toBe(false)
    scheduler.complete(batchOf(scheduler.next(0)).items)
    expect(scheduler.enqueue("c", items("image"), 0)).toBe(true)
  })

  it("drops a removed request's queued items", () => {
    const scheduler = new Scheduler<string>(limits)
    scheduler.enqueue("a", items("image"), 0)
    scheduler.enqueue("b", items("image"), 0)
    expect(scheduler.remove("a")).toBe(true)
    expect(ids(scheduler.next(0))).toEqual(["b:0"])
    expect(scheduler.remove("nobody")).toBe(false)
  })
})
