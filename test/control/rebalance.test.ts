import { describe, expect, it } from "vitest"
import { decideMove, type RebalanceTask } from "../../src/control/resource-manager/Rebalance.js"

const task = (
  id: string,
  executors: number,
  meanLoad: number,
  overrides: Partial<RebalanceTask> = {}
): RebalanceTask => ({
  id,
  executors,
  devicesPerExecutor: 1,
  minExecutors: 1,
  maxExecutors: 8,
  meanLoad,
  changedAt: undefined,
  ...overrides
})

const policy = { high: 2, low: 0.5, cooldownMs: 10_000 }

describe("rebalancing policy: which device moves next", () => {
  it("grows a bottleneck on a free device", () => {
    const move = decideMove({ now: 0, freeDevices: 1, tasks: [task("llm", 1, 6), task("encoder", 1, 1)] }, policy)
    expect(move).toEqual({
      _tag: "Grow",
      task: "llm",
      reason: "llm is a bottleneck: 6.00 calls in flight per executor (above 2); a free device takes it"
    })
  })

  it("takes a device from the task with the most slack when none is free", () => {
    const move = decideMove(
      {
        now: 0,
        freeDevices: 0,
        tasks: [task("llm", 1, 5), task("encoder-a", 3, 1.2), task("encoder-b", 2, 0.2), task("geri", 1, 0)]
      },
      policy
    )
    // geri has the least pressure, but it is at its minimum of one executor.
    expect(move).toEqual({
      _tag: "Take",
      from: "encoder-b",
      to: "llm",
      reason:
        "llm is a bottleneck: 5.00 calls in flight per executor (above 2); encoder-b has slack: 0.10 per executor (below 0.5)"
    })
  })

  it("serves the widest bottleneck first", () => {
    const move = decideMove(
      { now: 0, freeDevices: 1, tasks: [task("a", 2, 5), task("b", 1, 4), task("c", 4, 9)] },
      policy
    )
    expect(move).toMatchObject({ _tag: "Grow", task: "b" })
  })

  it("does nothing between the watermarks: hysteresis", () => {
    expect(
      decideMove({ now: 0, freeDevices: 3, tasks: [task("llm", 1, 2), task("encoder", 2, 1.5)] }, policy)
    ).toBeUndefined()
    // A bottleneck with no donor below the low watermark and no free device stays as it is.
    expect(
      decideMove({ now: 0, freeDevices: 0, tasks: [task("llm", 1, 9), task("encoder", 2, 1.5)] }, policy)
    ).toBeUndefined()
  })

  it("leaves a task alone during its cooldown, as donor and as receiver", () => {
    const justGrown = task("llm", 2, 10, { changedAt: 5_000 })
    expect(decideMove({ now: 10_000, freeDevices: 1, tasks: [justGrown] }, policy)).toBeUndefined()
    expect(decideMove({ now: 15_000, freeDevices: 1, tasks: [justGrown] }, policy)).toMatchObject({ _tag: "Grow" })
    const justShrunk = task("encoder", 2, 0, { changedAt: 9_000 })
    expect(decideMove({ now: 10_000, freeDevices: 0, tasks: [task("llm", 1, 9), justShrunk] }, policy)).toBeUndefined()
  })

  it("keeps within each task's bounds", () => {
    expect(
      decideMove({ now: 0, freeDevices: 2, tasks: [task("llm", 3, 30, { maxExecutors: 3 })] }, policy)
    ).toBeUndefined()
    expect(
      decideMove(
        { now: 0, freeDevices: 0, tasks: [task("llm", 1, 9), task("encoder", 2, 0, { minExecutors: 2 })] },
        policy
      )
    ).toBeUndefined()
  })

  it("moves only devices enough for one executor of the bottleneck", () => {
    const wide = task("llm", 1, 9, { devicesPerExecutor: 2 })
    expect(decideMove({ now: 0, freeDevices: 1, tasks: [wide, task("encoder", 2, 0)] }, policy)).toMatchObject({
      _tag: "Take",
      from: "encoder"
    })
    expect(decideMove({ now: 0, freeDevices: 0, tasks: [wide, task("encoder", 2, 0)] }, policy)).toBeUndefined()
  })

  it("is a function of its input, and settles: after the move the state asks for none", () => {
    const before = { now: 0, freeDevices: 0, tasks: [task("llm", 1, 4), task("encoder", 2, 0.4)] }
    expect(decideMove(before, policy)).toEqual(decideMove(before, policy))
    const after = {
      now: 1_000,
      freeDevices: 0,
      tasks: [task("llm", 2, 4, { changedAt: 0 }), task("encoder", 1, 0.4, { changedAt: 0 })]
    }
    expect(decideMove(after, policy)).toBeUndefined()
    expect(decideMove({ ...after, now: 20_000 }, policy)).toBeUndefined()
  })
})
