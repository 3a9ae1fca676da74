import { describe, expect, it, vi } from "vitest"
import {
  type IdleControl,
  type IdlePhase,
  IdleRelease,
  idleReleaseAfterS
} from "../../../src/control/task-manager/IdleRelease.js"

/** A stand-in for the resource manager: each release and start waits until the test settles it. */
class Control implements IdleControl {
  readonly calls: Array<"release" | "start"> = []
  private settle: Array<{ readonly kind: "release" | "start"; readonly done: (error?: Error) => void }> = []
  private heard: Array<() => void> = []

  release = (_taskId: string) => this.called("release").then(() => true)
  start = (_taskId: string) => this.called("start")

  private called(kind: "release" | "start") {
    this.calls.push(kind)
    for (const wake of this.heard.splice(0)) wake()
    return new Promise<void>((resolve, reject) =>
      this.settle.push({ kind, done: (error) => (error === undefined ? resolve() : reject(error)) })
    )
  }

  /** Resolves once `kind` was asked for `count` times in all. */
  async asked(kind: "release" | "start", count = 1) {
    while (this.calls.filter((call) => call === kind).length < count)
      await new Promise<void>((wake) => this.heard.push(wake))
  }

  /** Ends the oldest release or start under way, failing it with `error` when given. */
  finish(error?: Error) {
    this.settle.shift()!.done(error)
  }
}

const tracked = (control: Control, afterS = 0.01) => {
  const phases: Array<IdlePhase> = []
  const idle = new IdleRelease(
    "encoder-t",
    afterS,
    () => control,
    (phase) => phases.push(phase)
  )
  return { idle, phases }
}

/** Lets the promises settled so far run their callbacks. */
const settled = () => new Promise((resolve) => setImmediate(resolve))

describe("IdleRelease: a task's executors released when idle and started again by a call", () => {
  it("releases once no call has wanted the executors for the idle time, and not while one does", async () => {
    const control = new Control()
    const { idle, phases } = tracked(control)
    idle.started()
    expect(idle.enter()).toBeUndefined()
    idle.leave()
    await control.asked("release")
    expect(idle.phase).toBe("releasing")
    control.finish()
    await settled()
    expect(idle.phase).toBe("released")
    expect(phases).toEqual(["releasing", "released"])
    expect(idle.stats().releases).toBe(1)
  })

  it("starts the executors once for the calls that arrive while they are released, and counts the cold start", async () => {
    const control = new Control()
    const { idle } = tracked(control)
    idle.started()
    await control.asked("release")
    control.finish()
    await settled()
    const waits = [idle.enter(), idle.enter(), idle.enter()]
    expect(waits.every((wait) => wait !== undefined)).toBe(true)
    await control.asked("start")
    control.finish()
    await Promise.all(waits)
    expect(control.calls).toEqual(["release", "start"])
    expect(idle.phase).toBe("running")
    expect(idle.stats()).toMatchObject({ coldStarts: { count: 1 }, coldStartsFailed: 0 })
    expect(idle.stats().lastColdStartS).toBeGreaterThanOrEqual(0)
    // While they are in flight, nothing is released; once all are done, the idle time counts again.
    for (const _ of waits) idle.leave()
    await control.asked("release", 2)
  })

  it("makes a call that arrives during a release wait for the release, then for a start", async () => {
    const control = new Control()
    const { idle, phases } = tracked(control)
    idle.started()
    await control.asked("release")
    const wait = idle.enter()!
    expect(idle.phase).toBe("starting")
    control.finish()
    await control.asked("start")
    control.finish()
    await wait
    expect(phases).toEqual(["releasing", "starting", "running"])
    idle.leave()
  })

  it("fails the waiting calls when a start fails, and tries again on the next call", async () => {
    const control = new Control()
    const { idle } = tracked(control)
    idle.started()
    await control.asked("release")
    control.finish()
    await settled()
    const first = [idle.enter()!, idle.enter()!]
    await control.asked("start")
    control.finish(new Error("no device is free"))
    for (const wait of first)
      await expect(wait).rejects.toThrow(/could not start its executors again: no device is free/)
    for (const _ of first) idle.leave()
    expect(idle.phase).toBe("released")
    const again = idle.enter()!
    await control.asked("start", 2)
    control.finish()
    await again
    expect(idle.stats()).toMatchObject({ coldStartsFailed: 1, coldStarts: { count: 1 } })
    idle.leave()
  })

  it("keeps the executors with an idle time of 0, and begins nothing once the task is going", () => {
    vi.useFakeTimers()
    try {
      const control = new Control()
      const kept = tracked(control, 0).idle
      kept.started()
      kept.enter()
      kept.leave()
      const going = tracked(control).idle
      going.started()
      going.stop()
      vi.runAllTimers()
      expect(control.calls).toEqual([])
    } finally {
      vi.useRealTimers()
    }
  })

  it("takes the task's own idle time from its config, else the serve default", () => {
    expect(idleReleaseAfterS({ model: "m", idleReleaseS: 30 }, 60)).toBe(30)
    expect(idleReleaseAfterS({ model: "m", idleReleaseS: 0 }, 60)).toBe(0)
    expect(idleReleaseAfterS({ model: "m" }, 60)).toBe(60)
  })
})
