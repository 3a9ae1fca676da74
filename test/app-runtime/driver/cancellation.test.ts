import { describe, expect, it } from "vitest"
import { Cancellation, watchSignal } from "../../../src/app-runtime/driver/Cancellation.js"
import { SendWindow } from "../../../src/app-runtime/driver/StreamWindow.js"

describe("Cancellation", () => {
  it("calls each listener once when aborted, and not one that was removed", () => {
    const cancellation = new Cancellation()
    const calls: Array<string> = []
    const listener = () => calls.push("kept")
    cancellation.onAbort(listener)
    cancellation.onAbort(listener)
    const remove = cancellation.onAbort(() => calls.push("removed"))
    remove()
    expect(cancellation.aborted).toBe(false)
    cancellation.abort()
    cancellation.abort()
    expect(cancellation.aborted).toBe(true)
    expect(calls).toEqual(["kept", "kept"])
    cancellation.onAbort(() => calls.push("late"))
    expect(calls).toEqual(["kept", "kept"])
  })

  it("gives a signal that aborts with it, made before or after the abort", () => {
    const early = new Cancellation()
    const signal = early.signal
    expect(early.signal).toBe(signal)
    let heard = 0
    signal.addEventListener("abort", () => heard++)
    expect(signal.aborted).toBe(false)
    early.abort()
    expect(signal.aborted).toBe(true)
    expect(heard).toBe(1)

    const late = new Cancellation()
    late.abort()
    expect(late.signal.aborted).toBe(true)
  })

  it("releases a send window's waiter when the request is cancelled", async () => {
    const window = new SendWindow(1)
    window.sent(1)
    const cancellation = new Cancellation()
    const opened = window.opened(cancellation)
    cancellation.abort()
    await expect(opened).resolves.toBeUndefined()
  })

  it("lets a send window's waiter go once room is acknowledged, and stops watching the cancellation", async () => {
    const window = new SendWindow(1)
    window.sent(1)
    const controller = new AbortController()
    let listeners = 0
    const watch = watchSignal(controller.signal)
    const counted = {
      get aborted() {
        return watch.aborted
      },
      onAbort(listener: () => void) {
        listeners++
        const remove = watch.onAbort(listener)
        return () => {
          listeners--
          remove()
        }
      }
    }
    const opened = window.opened(counted)
    expect(listeners).toBe(1)
    window.acknowledged(1)
    await expect(opened).resolves.toBeUndefined()
    expect(listeners).toBe(0)
    controller.abort()
    expect(await window.opened(watchSignal(controller.signal))).toBeUndefined()
  })
})
