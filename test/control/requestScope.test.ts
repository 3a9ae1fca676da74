import { describe, expect, it } from "vitest"
import { RequestScope } from "../../src/control/RequestScope.js"

type Outcome = "ok" | "failed" | "unused" | "unavailable"

/** A stand-in lease: records each release with its outcome. */
const lease = () => {
  const releases: Array<Outcome> = []
  return { releases, release: (outcome: Outcome) => void releases.push(outcome) }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/** An abort signal that counts the listeners it has, to see that none is left behind. */
const countedSignal = () => {
  const controller = new AbortController()
  let listeners = 0
  const add = controller.signal.addEventListener.bind(controller.signal)
  const remove = controller.signal.removeEventListener.bind(controller.signal)
  controller.signal.addEventListener = ((...args: Parameters<typeof add>) => {
    listeners++
    add(...args)
  }) as typeof add
  controller.signal.removeEventListener = ((...args: Parameters<typeof remove>) => {
    listeners--
    remove(...args)
  }) as typeof remove
  return { controller, listeners: () => listeners }
}

describe("RequestScope: what a request holds, given back exactly once", () => {
  it("on success: a lease released early with its outcome is not released again when the scope closes", () => {
    const scope = new RequestScope()
    const first = lease()
    const second = lease()
    const releaseFirst = scope.hold(first.release, "failed")
    const releaseSecond = scope.hold(second.release, "failed")
    releaseFirst("ok")
    releaseFirst("failed")
    releaseSecond("unused")
    scope.close()
    expect(first.releases).toEqual(["ok"])
    expect(second.releases).toEqual(["unused"])
  })

  it("on failure: closing gives back what is still held, with the close's outcome, the last registered first", () => {
    const scope = new RequestScope()
    const order: Array<string> = []
    const held = lease()
    scope.defer(() => order.push("first"))
    scope.hold((outcome: Outcome) => {
      order.push("lease")
      held.release(outcome)
    }, "failed")
    scope.defer(() => order.push("last"))
    scope.close()
    expect(order).toEqual(["last", "lease", "first"])
    expect(held.releases).toEqual(["failed"])
  })

  it("on abort: the listener runs once, and closing removes it so that no listener is left", () => {
    const scope = new RequestScope()
    const { controller, listeners } = countedSignal()
    let aborted = 0
    scope.onAbort(controller.signal, () => {
      aborted++
      scope.close()
    })
    const held = lease()
    scope.hold(held.release, "failed")
    expect(listeners()).toBe(1)
    controller.abort()
    controller.abort()
    scope.close()
    expect(aborted).toBe(1)
    expect(held.releases).toEqual(["failed"])
    expect(listeners()).toBe(0)
  })

  it("removes an abort listener when its handle is called, once, though the scope closes after", () => {
    const scope = new RequestScope()
    const { controller, listeners } = countedSignal()
    let aborted = 0
    const stopListening = scope.onAbort(controller.signal, () => aborted++)
    stopListening()
    stopListening()
    scope.close()
    controller.abort()
    expect(aborted).toBe(0)
    expect(listeners()).toBe(0)
  })

  it("is closed once: a second close gives nothing back again", () => {
    const scope = new RequestScope()
    let cleanups = 0
    const held = lease()
    scope.defer(() => cleanups++)
    scope.hold(held.release, "unused")
    scope.close()
    scope.close()
    expect(scope.closed).toBe(true)
    expect(cleanups).toBe(1)
    expect(held.releases).toEqual(["unused"])
  })

  it("gives back at once what is registered after it closed", () => {
    const scope = new RequestScope()
    scope.close()
    const held = lease()
    let cleanups = 0
    const release = scope.hold(held.release, "unused")
    scope.defer(() => cleanups++)
    release("ok")
    expect(held.releases).toEqual(["unused"])
    expect(cleanups).toBe(1)
  })

  it("fires a timer unless it is cleared by its handle or by the close", async () => {
    const scope = new RequestScope()
    const fired: Array<string> = []
    scope.timeout(5, () => fired.push("kept"))
    const clear = scope.timeout(5, () => fired.push("cleared"))
    clear()
    const other = new RequestScope()
    other.timeout(5, () => fired.push("closed"))
    other.close()
    await sleep(30)
    scope.close()
    expect(fired).toEqual(["kept"])
  })

  it("runs every cleanup when one throws, and throws the first error once all ran", () => {
    const scope = new RequestScope()
    const held = lease()
    scope.hold(held.release, "failed")
    scope.defer(() => {
      throw new Error("first")
    })
    scope.defer(() => {
      throw new Error("second")
    })
    expect(() => scope.close()).toThrow("second")
    expect(held.releases).toEqual(["failed"])
    expect(() => scope.close()).not.toThrow()
  })
})
