import { describe, expect, it } from "vitest"
import { BusyClock } from "../../src/metrics/BusyClock.js"

describe("BusyClock", () => {
  it("counts overlapping activities once", () => {
    const clock = new BusyClock()
    clock.enter(0)
    clock.enter(5)
    clock.leave(10)
    clock.leave(20)
    expect(clock.busyMs(30)).toBe(20)
  })

  it("leaves out the gaps between activities and counts one still running up to now", () => {
    const clock = new BusyClock()
    clock.enter(0)
    clock.leave(10)
    clock.enter(50)
    expect(clock.busyMs(55)).toBe(15)
    clock.leave(60)
    expect(clock.busyMs(100)).toBe(20)
  })

  it("ignores a leave without an enter", () => {
    const clock = new BusyClock()
    clock.leave(5)
    clock.enter(10)
    clock.leave(15)
    expect(clock.busyMs(20)).toBe(5)
  })
})
