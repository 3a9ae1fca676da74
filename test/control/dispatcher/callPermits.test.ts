import { describe, expect, it } from "vitest"
import { CallPermits } from "../../../src/control/dispatcher/CallPermits.js"

const never = new AbortController().signal
const settled = async <A>(promise: Promise<A>) => {
  let done = false
  void promise.then(
    () => (done = true),
    () => (done = true)
  )
  await new Promise((resolve) => setTimeout(resolve, 10))
  return done
}

describe("an app's limit on its calls per task", () => {
  it("lets `limit` graphs of an app hold a task, the next waits for one to end, in arrival order", async () => {
    const permits = new CallPermits()
    const first = await permits.acquire("a", ["enc", "llm"], 2, never)
    const second = await permits.acquire("a", ["enc"], 2, never)
    expect(permits.inFlight("a", "enc")).toBe(2)
    const third = permits.acquire("a", ["enc"], 2, never)
    const fourth = permits.acquire("a", ["enc"], 2, never)
    expect(await settled(third)).toBe(false)
    // Other apps and other tasks are not held back.
    await permits.acquire("b", ["enc"], 2, never)
    await permits.acquire("a", ["llm"], 2, never)
    second()
    second() // a release is idempotent
    expect(await settled(third)).toBe(true)
    expect(await settled(fourth)).toBe(false)
    first()
    expect(await settled(fourth)).toBe(true)
    expect(permits.inFlight("a", "enc")).toBe(2)
  })

  it("counts a task once per graph, however many invocations it has of it", async () => {
    const permits = new CallPermits()
    const release = await permits.acquire("a", ["enc", "enc", "llm"], 1, never)
    expect(permits.inFlight("a", "enc")).toBe(1)
    release()
    expect(permits.inFlight("a", "enc")).toBe(0)
  })

  it("gives back what a cancelled wait took, and no two graphs wait for each other", async () => {
    const permits = new CallPermits()
    const holder = await permits.acquire("a", ["llm"], 1, never)
    const cancel = new AbortController()
    // Takes enc, then waits for llm: cancelled, it gives enc back.
    const waiting = permits.acquire("a", ["llm", "enc"], 1, cancel.signal)
    expect(await settled(waiting)).toBe(false)
    expect(permits.inFlight("a", "enc")).toBe(1)
    cancel.abort(new Error("client gone"))
    await expect(waiting).rejects.toThrow("client gone")
    expect(permits.inFlight("a", "enc")).toBe(0)
    // Tasks are taken in one order whatever the graph's: [llm, enc] and [enc, llm] cannot deadlock.
    holder()
    const one = await permits.acquire("a", ["llm", "enc"], 1, never)
    const two = permits.acquire("a", ["enc", "llm"], 1, never)
    one()
    expect(await settled(two)).toBe(true)
  })
})
