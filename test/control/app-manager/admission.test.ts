import { afterEach, describe, expect, it, vi } from "vitest"
import { Admission, type AdmissionOutcome, unlimitedAdmission } from "../../../src/control/app-manager/Admission.js"

const outcomes = (admission: Admission, count: number) => {
  const seen: Array<AdmissionOutcome | undefined> = Array.from({ length: count }, () => undefined)
  const leave = seen.map((_, index) => admission.enter((outcome) => (seen[index] = outcome)))
  return { seen, leave }
}

const release = (outcome: AdmissionOutcome | undefined) => {
  if (outcome?._tag !== "Admitted") throw new Error(`not admitted: ${outcome?._tag}`)
  outcome.release()
}

describe("Admission", () => {
  afterEach(() => {
    vi.useRealTimers()
  })

  it("admits everything when unlimited", () => {
    const { seen } = outcomes(new Admission(unlimitedAdmission), 100)
    expect(seen.every((outcome) => outcome?._tag === "Admitted")).toBe(true)
  })

  it("runs maxConcurrency, queues maxQueue in arrival order, and refuses the rest at once", () => {
    const admission = new Admission({ maxConcurrency: 2, maxQueue: 2, queueTimeoutMs: 1_000 })
    const { seen } = outcomes(admission, 5)
    expect(seen.map((outcome) => outcome?._tag)).toEqual(["Admitted", "Admitted", undefined, undefined, "Overloaded"])
    expect([admission.inFlight, admission.queued]).toEqual([2, 2])
    release(seen[1])
    expect(seen[2]?._tag).toBe("Admitted")
    expect(seen[3]).toBeUndefined()
    release(seen[1])
    expect(admission.inFlight).toBe(2)
    release(seen[0])
    expect(seen[3]?._tag).toBe("Admitted")
    release(seen[2])
    release(seen[3])
    expect([admission.inFlight, admission.queued]).toEqual([0, 0])
  })

  it("refuses a request that waited queueTimeoutMs, and forgets one whose client left", () => {
    vi.useFakeTimers()
    const admission = new Admission({ maxConcurrency: 1, maxQueue: 2, queueTimeoutMs: 500 })
    const { seen, leave } = outcomes(admission, 3)
    leave[2]!()
    expect(admission.queued).toBe(1)
    vi.advanceTimersByTime(499)
    expect(seen[1]).toBeUndefined()
    vi.advanceTimersByTime(1)
    expect(seen[1]).toEqual({ _tag: "TimedOut", waitedMs: 500 })
    expect(seen[2]).toBeUndefined()
    release(seen[0])
    expect([admission.inFlight, admission.queued]).toEqual([0, 0])
  })

  it("keeps a queued request waiting under a queue timeout past a timer's range, rather than refusing it at once", () => {
    vi.useFakeTimers()
    const admission = new Admission({ maxConcurrency: 1, maxQueue: 1, queueTimeoutMs: 2 ** 31 })
    expect(admission.limits.queueTimeoutMs).toBe(2 ** 31 - 1)
    const { seen } = outcomes(admission, 2)
    vi.advanceTimersByTime(60_000)
    expect(seen[1]).toBeUndefined()
    release(seen[0])
    expect(seen[1]?._tag).toBe("Admitted")
  })

  it("refuses at once rather than queueing without end when its counts are not numbers", () => {
    const admission = new Admission({ maxConcurrency: Number.NaN, maxQueue: Number.NaN, queueTimeoutMs: 1_000 })
    const { seen } = outcomes(admission, 2)
    expect(seen.map((outcome) => outcome?._tag)).toEqual(["Admitted", "Overloaded"])
    release(seen[0])
  })
})
