import { getEventListeners } from "node:events"
import { describe, expect, it } from "vitest"
import { eitherSignal } from "../../../src/control/executor-calls/EitherSignal.js"

describe("eitherSignal", () => {
  it("aborts when either source aborts, and then listens to neither", () => {
    for (const which of [0, 1]) {
      const sources = [new AbortController(), new AbortController()]
      const either = eitherSignal(sources[0]!.signal, sources[1]!.signal)
      expect(either.signal.aborted).toBe(false)
      sources[which]!.abort()
      expect(either.signal.aborted).toBe(true)
      expect(getEventListeners(sources[1 - which]!.signal, "abort")).toHaveLength(0)
    }
  })

  it("is aborted at once when a source already is", () => {
    const aborted = new AbortController()
    aborted.abort()
    expect(eitherSignal(new AbortController().signal, aborted.signal).signal.aborted).toBe(true)
  })

  it("leaves nothing on a long-lived source once disposed, however many calls it served", () => {
    const executor = new AbortController()
    for (let call = 0; call < 1_000; call++) {
      const request = new AbortController()
      const either = eitherSignal(request.signal, executor.signal)
      either.dispose()
    }
    expect(getEventListeners(executor.signal, "abort")).toHaveLength(0)
    executor.abort()
  })
})
