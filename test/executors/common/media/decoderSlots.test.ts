import { describe, expect, it } from "vitest"
import { DecoderSlots } from "../../../../src/executors/common/media/DecoderSlots.js"

const settled = async (promise: Promise<unknown>): Promise<boolean> => {
  let done = false
  void promise.then(
    () => (done = true),
    () => (done = true)
  )
  await new Promise((resolve) => setImmediate(resolve))
  return done
}

describe("DecoderSlots", () => {
  it("lets `size` run at once and the others in the order they asked, each as a turn is given back", async () => {
    const slots = new DecoderSlots(2)
    const order: Array<string> = []
    const take = (name: string) =>
      slots.take().then((giveBack) => {
        order.push(name)
        return giveBack
      })
    const first = await take("a")
    const second = await take("b")
    const third = take("c")
    const fourth = take("d")
    expect(await settled(third)).toBe(false)
    expect([slots.running, slots.waiting]).toEqual([2, 2])
    second()
    // Given back twice, a turn counts once: d still waits.
    second()
    const thirdBack = await third
    expect(await settled(fourth)).toBe(false)
    first()
    ;(await fourth)()
    thirdBack()
    expect(order).toEqual(["a", "b", "c", "d"])
    expect([slots.running, slots.waiting]).toEqual([0, 0])
  })

  it("drops from the line one whose signal aborts while it waits, with the signal's reason, and refuses an aborted one", async () => {
    const slots = new DecoderSlots(1)
    const held = await slots.take()
    const leaving = new AbortController()
    const left = slots.take(leaving.signal)
    const next = slots.take()
    leaving.abort(new Error("the request ended"))
    await expect(left).rejects.toThrow("the request ended")
    expect(slots.waiting).toBe(1)
    held()
    ;(await next)()
    expect(slots.running).toBe(0)
    await expect(slots.take(AbortSignal.abort(new Error("gone")))).rejects.toThrow("gone")
    expect([slots.running, slots.waiting]).toEqual([0, 0])
  })
})
