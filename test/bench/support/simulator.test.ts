import { describe, expect, it } from "vitest"
import {
  capacityOfTask,
  defaultSimPolicy,
  devicesOf,
  evenSplit,
  proportionalSplit,
  type Scenario,
  type SimTaskSpec,
  searchStaticSplit,
  simulate
} from "../../../bench/support/Simulator.js"

const spec = (id: string, overrides: Partial<SimTaskSpec> = {}): SimTaskSpec => ({
  id,
  devicesPerExecutor: 1,
  maxBatch: 8,
  baseMs: 100,
  perItemMs: 50,
  minExecutors: 1,
  maxExecutors: 100,
  startupMs: 2_000,
  ...overrides
})

/** Two chains on three tasks; the load moves from the first chain to the second. */
const scenario: Scenario = {
  devices: 20,
  tasks: [
    spec("encoder", { maxBatch: 16, baseMs: 20, perItemMs: 5 }),
    spec("llm", { devicesPerExecutor: 2, maxBatch: 32, baseMs: 200, perItemMs: 20 }),
    spec("geri")
  ],
  apps: [
    { id: "see", stages: ["encoder", "llm"], targetMs: 3_000 },
    { id: "paint", stages: ["llm", "geri"], targetMs: 3_000 }
  ],
  phases: [
    { name: "seeing", durationMs: 60_000, rates: { see: 100, paint: 5 }, bursts: [] },
    {
      name: "painting",
      durationMs: 60_000,
      rates: { see: 5, paint: 100 },
      bursts: [{ app: "paint", atMs: 20_000, durationMs: 5_000, factor: 1.2 }]
    }
  ],
  queuePerExecutor: 32,
  seed: 1
}

describe("the resource simulator", () => {
  it("reads each task's capacity from its profile curve as the live policy does: a full batch per service time", () => {
    // 8 calls per 100 + 8 × 50 ms.
    expect(capacityOfTask(spec("x"))).toBeCloseTo(16)
  })

  it("is deterministic, and accounts for every request", () => {
    const split = proportionalSplit(scenario, scenario.phases[0]!)
    const first = simulate(scenario, { split })
    expect(simulate(scenario, { split })).toEqual(first)
    for (const phase of first.phases) {
      expect(phase.requests).toBeGreaterThan(0)
      expect(phase.good + phase.refused).toBeLessThanOrEqual(phase.requests)
    }
    const lost = Object.values(first.tasks).reduce((sum, task) => sum + task.lost, 0)
    const requests = first.phases.reduce((sum, phase) => sum + phase.requests, 0)
    const good = first.phases.reduce((sum, phase) => sum + phase.good, 0)
    expect(good + lost).toBe(requests)
  })

  it("serves a phase whole with a split sized for it, and misses with one sized for another phase", () => {
    const forSeeing = proportionalSplit(scenario, scenario.phases[0]!)
    expect(devicesOf(scenario, forSeeing)).toBeLessThanOrEqual(scenario.devices)
    const run = simulate(scenario, { split: forSeeing })
    expect(run.phases[0]!.goodput).toBe(1)
    expect(run.phases[1]!.goodput).toBeLessThan(0.9)
  })

  it("under the policy, moves devices to the new bottleneck and keeps nearly all of the goodput", () => {
    const run = simulate(scenario, { split: evenSplit(scenario), policy: defaultSimPolicy(1_000) })
    expect(run.moves).toBeGreaterThan(0)
    // Painting: the generator holds more executors than it started with, the encoder fewer.
    expect(run.meanSplit[1]!.geri!).toBeGreaterThan(evenSplit(scenario).geri!)
    expect(run.meanSplit[1]!.encoder!).toBeLessThan(run.meanSplit[0]!.encoder! + 1)
    const fixed = simulate(scenario, { split: evenSplit(scenario) })
    for (const [index, phase] of run.phases.entries()) {
      expect(phase.good).toBeGreaterThanOrEqual(fixed.phases[index]!.good)
      expect(phase.goodput).toBeGreaterThan(0.9)
    }
  })

  it("searches static splits no worse than where it starts", () => {
    const start = proportionalSplit(scenario, scenario.phases[1]!)
    const found = searchStaticSplit(scenario, 1, { evaluations: 8 })
    expect(found.evaluations).toBeLessThanOrEqual(8)
    expect(devicesOf(scenario, found.split)).toBeLessThanOrEqual(scenario.devices)
    expect(found.result.good).toBeGreaterThanOrEqual(simulate(scenario, { phases: [1], split: start }).phases[0]!.good)
  })

  it("gives back executors that added nothing: a task whose executors share two executors' worth", () => {
    // 100 calls/s per executor, but never more than two executors' worth at once; 400 calls/s arrive.
    const shared: Scenario = {
      devices: 12,
      tasks: [
        spec("cpu", { maxBatch: 1, baseMs: 10, perItemMs: 0, startupMs: 500, effectiveExecutors: 2 }),
        spec("other")
      ],
      apps: [
        { id: "busy", stages: ["cpu"], targetMs: 1_000 },
        { id: "quiet", stages: ["other"], targetMs: 1_000 }
      ],
      phases: [
        { name: "first", durationMs: 30_000, rates: { busy: 400, quiet: 1 }, bursts: [] },
        { name: "then", durationMs: 30_000, rates: { busy: 400, quiet: 1 }, bursts: [] }
      ],
      queuePerExecutor: 32,
      seed: 3
    }
    const split = { cpu: 3, other: 1 }
    const run = simulate(shared, { split, policy: defaultSimPolicy(1_000) })
    // It grew for the load, saw that three executors and six sustained the same, and gave three back.
    expect(run.released).toBe(3)
    expect(run.meanSplit[1]!.cpu!).toBeCloseTo(3, 5)
    // Executors that each add their own are never given back.
    const linear = simulate(
      { ...shared, tasks: [spec("cpu", { maxBatch: 1, baseMs: 10, perItemMs: 0, startupMs: 500 }), spec("other")] },
      { split, policy: defaultSimPolicy(1_000) }
    )
    expect(linear.released).toBe(0)
    expect(linear.meanSplit[1]!.cpu!).toBeGreaterThan(5)
  })
})
