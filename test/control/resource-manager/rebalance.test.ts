import { describe, expect, it } from "vitest"
import {
  ceilingOf,
  decideMove,
  defaultRebalancePolicy,
  planMoves,
  type RebalanceTask
} from "../../../src/control/resource-manager/Rebalance.js"

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

const policy = { ...defaultRebalancePolicy, cooldownMs: 10_000 }

describe("rebalancing policy without profiles: which device moves next, by load", () => {
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
      from: ["encoder-b"],
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

  it("grows on free devices only where one node has all of an executor's", () => {
    const llm = task("llm", 1, 6, { devicesPerExecutor: 2 })
    // Two free devices, one on each node: no executor of two fits on them.
    expect(
      planMoves({ now: 0, freeDevices: 2, freeByNode: [1, 1], tasks: [llm, task("encoder", 1, 1)] }, policy)
    ).toEqual([])
    // Two on one node: it grows there.
    expect(
      planMoves({ now: 0, freeDevices: 3, freeByNode: [1, 2], tasks: [llm, task("encoder", 1, 1)] }, policy)
    ).toMatchObject([{ _tag: "Grow", task: "llm" }])
    // A donor's device joins one node's free device: a Take, with the donor named.
    expect(
      planMoves({ now: 0, freeDevices: 2, freeByNode: [1, 1], tasks: [llm, task("encoder", 2, 0.2)] }, policy)
    ).toMatchObject([{ _tag: "Take", from: ["encoder"], to: "llm" }])
    // One node: every free device is that node's, as before.
    expect(planMoves({ now: 0, freeDevices: 2, tasks: [llm, task("encoder", 1, 1)] }, policy)).toMatchObject([
      { _tag: "Grow", task: "llm" }
    ])
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
      from: ["encoder"]
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

/** A task whose profile says what one executor sustains. */
const profiled = (
  id: string,
  executors: number,
  rate: number,
  capacity: number,
  overrides: Partial<RebalanceTask> = {}
): RebalanceTask => task(id, executors, 0, { rate, capacity, maxExecutors: 100, ...overrides })

describe("rebalancing policy with profiles: the moves of a round, sized by rate and capacity", () => {
  it("sizes a bottleneck for the target utilisation in one round, on free devices", () => {
    // 30 calls/s against 4 per executor: 9.4 executors busy at 2; sized at 0.7 it needs 11.
    const moves = planMoves({ now: 0, freeDevices: 20, tasks: [profiled("llm", 2, 30, 4)] }, policy)
    expect(moves).toHaveLength(9)
    expect(moves.every((move) => move._tag === "Grow" && move.task === "llm")).toBe(true)
    expect(moves[0]!.reason).toBe(
      "llm is a bottleneck: 30.00 calls/s against 4.00 per executor (2 executor(s), utilisation 3.75); a free device takes it"
    )
  })

  it("takes from slack only down to the donor's own target, and only what the bottleneck needs", () => {
    const moves = planMoves(
      {
        now: 0,
        freeDevices: 1,
        tasks: [
          profiled("llm", 1, 10, 4, { devicesPerExecutor: 2 }),
          // 8 executors for 2 calls/s at 4 each: it keeps 1 (0.5 / 0.7), and can give 7.
          profiled("encoder", 8, 2, 4),
          // Busy enough to keep what it has.
          profiled("geri", 2, 5, 4)
        ]
      },
      policy
    )
    // llm needs ceil(10 / 2.8) = 4 executors: 3 more, 6 devices: the free one, then 5 of the encoder's.
    expect(moves.map((move) => move._tag)).toEqual(["Take", "Take", "Take"])
    expect(moves.flatMap((move) => (move._tag === "Take" ? move.from : []))).toEqual([
      "encoder",
      "encoder",
      "encoder",
      "encoder",
      "encoder"
    ])
    expect(moves.every((move) => move._tag === "Take" && move.to === "llm")).toBe(true)
    expect(moves[0]!.reason).toContain(
      "encoder has slack: 2.00 calls/s against 4.00 per executor (8 executor(s), utilisation 0.06)"
    )
  })

  it("serves the hottest bottleneck first when devices are short", () => {
    const moves = planMoves(
      { now: 0, freeDevices: 2, tasks: [profiled("a", 1, 3.6, 4), profiled("b", 1, 8, 4)] },
      policy
    )
    expect(moves).toEqual([
      expect.objectContaining({ _tag: "Grow", task: "b" }),
      expect.objectContaining({ _tag: "Grow", task: "b" })
    ])
  })

  it("has a dead band: between the thresholds nothing moves", () => {
    // Utilisation 0.8 (under 0.85) and 0.6 (over 0.5): neither a bottleneck nor slack.
    expect(
      planMoves({ now: 0, freeDevices: 0, tasks: [profiled("a", 1, 3.2, 4), profiled("b", 5, 12, 4)] }, policy)
    ).toEqual([])
  })

  it("settles: after its moves, the same load asks for none", () => {
    const before = { now: 0, freeDevices: 0, tasks: [profiled("llm", 1, 10, 4), profiled("encoder", 6, 2, 4)] }
    const moves = planMoves(before, policy)
    expect(moves).toHaveLength(3)
    const after = {
      now: 60_000,
      freeDevices: 0,
      tasks: [profiled("llm", 4, 10, 4, { changedAt: 0 }), profiled("encoder", 3, 2, 4, { changedAt: 0 })]
    }
    expect(planMoves(after, policy)).toEqual([])
  })

  it("lends an overloaded task executors a busy task can spare, never making that one a bottleneck", () => {
    // llm: 20 calls/s against 4 per executor on 2: overloaded (utilisation 2.5). encoder: 20 calls/s
    // against 4 on 8 executors (0.63): no slack under 0.5, but it stays under 0.85 × 0.95 on 7.
    const tasks = [profiled("llm", 2, 20, 4), profiled("encoder", 8, 20, 4)]
    const moves = planMoves({ now: 0, freeDevices: 0, tasks }, policy)
    expect(moves).toEqual([expect.objectContaining({ _tag: "Take", from: ["encoder"], to: "llm" })])
    expect(moves[0]!.reason).toContain("encoder has executors to spare: 20.00 calls/s against 4.00 per executor")
    // A task that is only busy (not past what it sustains) gets no spare executors, only slack.
    expect(planMoves({ now: 0, freeDevices: 0, tasks: [profiled("llm", 2, 7.2, 4), tasks[1]!] }, policy)).toEqual([])
  })

  it("falls back on load for a task whose profile shows no capacity", () => {
    const moves = planMoves(
      {
        now: 0,
        freeDevices: 1,
        tasks: [task("llm", 1, 6, { rate: 50, capacity: undefined }), profiled("encoder", 1, 0, 4)]
      },
      policy
    )
    expect(moves).toEqual([expect.objectContaining({ _tag: "Grow", task: "llm" })])
    expect(moves[0]!.reason).toContain("6.00 calls in flight per executor (above 2)")
  })
})

describe("rebalancing policy: executors that did not raise throughput", () => {
  it("does not grow a task past the executors its profile showed no gain beyond", () => {
    // One executor sustained 100 calls/s and two sustained 95 (on a machine whose cores were full).
    const llm = profiled("llm", 1, 200, 100, {
      sustained: [
        [1, 100],
        [2, 95]
      ]
    })
    expect(planMoves({ now: 0, freeDevices: 4, tasks: [llm] }, policy)).toEqual([])
    // Without that measurement it would grow.
    expect(planMoves({ now: 0, freeDevices: 4, tasks: [{ ...llm, sustained: [[1, 100]] }] }, policy)).toHaveLength(2)
    // A gain under minGain (10%) does not count; one over it does.
    expect(
      ceilingOf(
        [
          [1, 100],
          [2, 109]
        ],
        0.1
      )?.executors
    ).toBe(1)
    expect(
      ceilingOf(
        [
          [1, 100],
          [2, 130],
          [3, 131]
        ],
        0.1
      )?.executors
    ).toBe(2)
    expect(ceilingOf([[1, 100]], 0.1)).toBeUndefined()
  })

  it("gives back the executors past that point, with the measurement as its reason", () => {
    const llm = profiled("llm", 3, 200, 50, {
      sustained: [
        [1, 100],
        [2, 104],
        [3, 98]
      ]
    })
    const moves = planMoves({ now: 0, freeDevices: 0, tasks: [llm] }, policy)
    expect(moves).toEqual([
      {
        _tag: "Release",
        task: "llm",
        reason:
          "llm gains nothing from its 3 executors: 1 executor(s) sustained 100.00 calls/s and 2 sustained 104.00; one goes back to the pool"
      },
      expect.objectContaining({ _tag: "Release", task: "llm" })
    ])
    // The devices it gives go to a bottleneck in the same round.
    const withBottleneck = planMoves({ now: 0, freeDevices: 0, tasks: [llm, profiled("encoder", 1, 10, 4)] }, policy)
    expect(withBottleneck.map((move) => move._tag)).toEqual(["Release", "Release", "Grow", "Grow"])
  })
})

describe("rebalancing policy on shared CPU devices: a bottleneck gets a core its calm neighbours leave idle", () => {
  // Two cores, five tasks: each device holds some of them, and none is free.
  const cpuDevices = [
    { node: "n", id: "cpu:0", tasks: ["encoder", "llm"] },
    { node: "n", id: "cpu:1", tasks: ["painter", "tones", "audio"] }
  ]
  const onCpu = (id: string, executors: number, meanLoad: number, sharing = executors) =>
    task(id, executors, meanLoad, { mayShare: true, sharing })

  it("grows a bottleneck onto a CPU device it does not hold where every task is calm", () => {
    const moves = planMoves(
      {
        now: 0,
        freeDevices: 0,
        cpuDevices,
        tasks: [
          onCpu("encoder", 1, 1),
          onCpu("llm", 1, 6),
          onCpu("painter", 1, 0),
          onCpu("tones", 1, 0.2),
          onCpu("audio", 1, 0)
        ]
      },
      policy
    )
    expect(moves).toEqual([
      {
        _tag: "Share",
        task: "llm",
        node: "n",
        devices: ["cpu:1"],
        reason:
          "llm is a bottleneck: 6.00 calls in flight per executor (above 2); no device is free or taken from slack, and cpu:1 holds only calm tasks (painter, tones, audio): it shares it"
      }
    ])
  })

  it("leaves a device alone while a task on it is busy, and never shares a GPU task onto a CPU", () => {
    const busy = { now: 0, freeDevices: 0, cpuDevices }
    const tasks = [onCpu("encoder", 1, 1), onCpu("llm", 1, 6), onCpu("tones", 1, 0.2), onCpu("audio", 1, 0)]
    // The painter is not a bottleneck, but it is not calm either: its core is in use.
    expect(planMoves({ ...busy, tasks: [...tasks, onCpu("painter", 1, 0.8)] }, policy)).toEqual([])
    const onGpu = task("llm", 1, 6, { sharing: 0 })
    expect(planMoves({ ...busy, tasks: [onCpu("encoder", 1, 1), onGpu, onCpu("painter", 1, 0)] }, policy)).toEqual([])
  })

  it("gives back an executor on a shared device once the task has slack, never its last", () => {
    const tasks = [onCpu("encoder", 1, 0), onCpu("llm", 2, 0.2), onCpu("painter", 1, 0), onCpu("tones", 1, 0)]
    expect(planMoves({ now: 0, freeDevices: 0, cpuDevices, tasks }, policy)).toEqual([
      {
        _tag: "Unshare",
        task: "llm",
        reason: "llm has slack: 0.10 per executor (below 0.5); an executor it runs on a shared device goes back"
      }
    ])
    // One executor, on a shared device: it stays.
    expect(planMoves({ now: 0, freeDevices: 0, cpuDevices, tasks: [onCpu("llm", 1, 0)] }, policy)).toEqual([])
    // Settles: back at one executor, the same load asks for nothing.
    const after = tasks.map((entry) => (entry.id === "llm" ? onCpu("llm", 1, 0.2) : entry))
    expect(planMoves({ now: 0, freeDevices: 0, cpuDevices, tasks: after }, policy)).toEqual([])
  })

  it("takes from a donor only an executor that holds its devices alone: a shared one frees none", () => {
    // The encoder has two executors with slack, both on shared devices; the painter is busy.
    const tasks = [onCpu("encoder", 2, 0), onCpu("llm", 1, 6, 1), onCpu("painter", 1, 0.8)]
    const moves = planMoves({ now: 0, freeDevices: 0, cpuDevices, tasks }, policy)
    expect(moves.map((move) => move._tag)).toEqual(["Unshare"])
    // With one executor on a device of its own, that one is taken.
    const alone = [onCpu("encoder", 2, 0, 1), onCpu("llm", 1, 6, 1), onCpu("painter", 1, 0.8)]
    expect(planMoves({ now: 0, freeDevices: 0, tasks: alone }, policy).map((move) => move._tag)).toEqual(["Take"])
  })
})
