import { Effect, Exit, Fiber } from "effect"
import { describe, expect, it } from "vitest"
import { runEngineLoops } from "../../../src/executors/common/EngineLoops.js"
import { Wakeup } from "../../../src/executors/common/Wakeup.js"

const settled = async (promise: Promise<unknown>): Promise<boolean> => {
  let done = false
  void promise.then(() => {
    done = true
  })
  await new Promise((resolve) => setImmediate(resolve))
  return done
}

describe("Wakeup", () => {
  it("wakeAll ends every wait pending at that moment, and a wake with nobody waiting is not kept", async () => {
    const wakeup = new Wakeup()
    wakeup.wakeAll()
    const first = wakeup.wait()
    const second = wakeup.wait(60_000)
    expect(await settled(first)).toBe(false)
    wakeup.wakeAll()
    expect(await settled(first)).toBe(true)
    expect(await settled(second)).toBe(true)
    expect(await settled(wakeup.wait())).toBe(false)
  })

  it("a wait ends on its timeout or its signal, and one whose signal aborted already ends at once", async () => {
    const wakeup = new Wakeup()
    await wakeup.wait(5)
    const controller = new AbortController()
    const waiting = wakeup.wait(undefined, controller.signal)
    expect(await settled(waiting)).toBe(false)
    controller.abort()
    expect(await settled(waiting)).toBe(true)
    expect(await settled(wakeup.wait(60_000, controller.signal))).toBe(true)
  })
})

describe("runEngineLoops", () => {
  it("a loop that throws fails the command and stops the other loops", async () => {
    let stoppedOther = false
    const exit = await Effect.runPromiseExit(
      runEngineLoops([
        async () => {
          throw new Error("socket broke")
        },
        (stop) =>
          new Promise<void>((resolve) =>
            stop.addEventListener("abort", () => {
              stoppedOther = true
              resolve()
            })
          )
      ])
    )
    expect(Exit.isFailure(exit) && String(exit.cause)).toMatch(/socket broke/)
    expect(stoppedOther).toBe(true)
  })

  it("interrupting the command aborts every loop's stop signal", async () => {
    const stopped: Array<number> = []
    const loop = (index: number) => (stop: AbortSignal) =>
      new Promise<void>((resolve) =>
        stop.addEventListener("abort", () => {
          stopped.push(index)
          resolve()
        })
      )
    const fiber = Effect.runFork(runEngineLoops([loop(0), loop(1)]))
    await new Promise((resolve) => setTimeout(resolve, 10))
    await Effect.runPromise(Fiber.interrupt(fiber))
    expect(stopped.sort()).toEqual([0, 1])
  })
})
