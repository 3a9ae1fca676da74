import { describe, expect, it } from "vitest"
import { FairTags, shareOfHeaders } from "../../../src/executors/common/FairShare.js"
import { Scheduler } from "../../../src/executors/common/Scheduler.js"
import { ContinuousScheduler } from "../../../src/executors/llm/Scheduler.js"

const item = (key = "image") => ({ key, payload: undefined })
const a = { app: "a", weight: 1 }
const b = { app: "b", weight: 1 }

describe("weighted fair queuing between apps on a shared task", () => {
  it("puts a request of an app that sends little ahead of a flood from another (batch engine)", () => {
    const scheduler = new Scheduler<undefined>({ maxBatchSize: 4, maxBatchDelayMs: 0, maxQueuedRequests: 1000 })
    for (let index = 0; index < 64; index++) scheduler.enqueue(`a${index}`, [item()], 0, a)
    scheduler.enqueue("b0", [item()], 0, b)
    const first = scheduler.next(0)
    expect(first._tag).toBe("Batch")
    // FIFO would run b0 after 64 of a's: fair queuing runs it in the first batch.
    expect(first._tag === "Batch" && first.items.map((scheduled) => scheduled.requestId)).toEqual([
      "a0",
      "b0",
      "a1",
      "a2"
    ])
    // b's next request, sent while a's flood is still queued, is again in the next batch.
    scheduler.enqueue("b1", [item()], 0, b)
    const second = scheduler.next(0)
    expect(second._tag === "Batch" && second.items.map((scheduled) => scheduled.requestId)).toContain("b1")
  })

  it("shares by weight, and keeps arrival order within an app and when nobody names one", () => {
    const scheduler = new Scheduler<undefined>({ maxBatchSize: 1, maxBatchDelayMs: 0, maxQueuedRequests: 1000 })
    for (let index = 0; index < 6; index++) {
      scheduler.enqueue(`heavy${index}`, [item()], 0, { app: "heavy", weight: 2 })
      scheduler.enqueue(`light${index}`, [item()], 0, { app: "light", weight: 1 })
    }
    const order: Array<string> = []
    for (let step = 0; step < 9; step++) {
      const decision = scheduler.next(0)
      if (decision._tag !== "Batch") break
      order.push(decision.items[0]!.requestId)
      scheduler.complete(decision.items)
    }
    // Twice as many of the app of weight 2 as of the other, each app in its own order.
    expect(order.filter((id) => id.startsWith("heavy"))).toEqual([
      "heavy0",
      "heavy1",
      "heavy2",
      "heavy3",
      "heavy4",
      "heavy5"
    ])
    expect(order.filter((id) => id.startsWith("light"))).toEqual(["light0", "light1", "light2"])

    const fifo = new Scheduler<undefined>({ maxBatchSize: 8, maxBatchDelayMs: 0, maxQueuedRequests: 1000 })
    for (const id of ["x", "y", "z"]) fifo.enqueue(id, [item(), item()], 0)
    const batch = fifo.next(0)
    expect(batch._tag === "Batch" && batch.items.map((scheduled) => scheduled.requestId)).toEqual([
      "x",
      "x",
      "y",
      "y",
      "z",
      "z"
    ])
  })

  it("admits an LLM request of an app that sends little ahead of a flood from another", () => {
    const scheduler = new ContinuousScheduler({
      lanes: 1,
      maxRunning: 2,
      kvCache: { rowBytes: 10_000, bytesPerPosition: 1, blockTokens: 1 },
      maxQueuedRequests: 1000
    })
    for (let index = 0; index < 32; index++) scheduler.enqueue(`a${index}`, 10, a)
    expect(scheduler.admit(0)).toEqual(["a0", "a1"])
    scheduler.enqueue("b0", 10, b)
    scheduler.release("a0")
    scheduler.release("a1")
    // Its turn comes with the next two free places, not after the 30 of a's that wait.
    expect(scheduler.admit(0)).toEqual(["a2", "b0"])
  })

  it("forgets the tags of apps that fell behind the virtual time", () => {
    const tags = new FairTags()
    expect(tags.tag(a, 1)).toBe(1)
    expect(tags.tag(a, 1)).toBe(2)
    tags.served(2)
    // An app idle since then starts from the virtual time, not from zero: no credit for idling.
    expect(tags.tag(b, 1)).toBe(3)
  })

  it("reads the app and weight the dispatcher sends, refusing malformed ones", () => {
    expect(shareOfHeaders({ "x-cornserve-app": "chat", "x-cornserve-app-weight": "2.5" })).toEqual({
      app: "chat",
      weight: 2.5
    })
    expect(shareOfHeaders({})).toEqual({ app: "", weight: 1 })
    expect(shareOfHeaders({ "x-cornserve-app": "x".repeat(500), "x-cornserve-app-weight": "-1" })).toEqual({
      app: "",
      weight: 1
    })
    expect(shareOfHeaders({ "x-cornserve-app-weight": "1e9" }).weight).toBe(1000)
  })
})
