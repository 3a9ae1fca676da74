import { describe, expect, it } from "vitest"
import {
  capacityOf,
  levelGroup,
  recentWindowMs,
  sustainedOf,
  TaskProfile
} from "../../../src/control/task-manager/TaskProfile.js"

describe("TaskProfile: a task's calls as a throughput–latency curve", () => {
  it("groups load levels by powers of two", () => {
    expect([1, 2, 3, 4, 5, 8, 9, 16, 17].map(levelGroup)).toEqual([
      [1, 1],
      [2, 2],
      [3, 4],
      [3, 4],
      [5, 8],
      [5, 8],
      [9, 16],
      [9, 16],
      [17, 32]
    ])
  })

  it("gives each executor count its curve: percentiles per load group and calls/s by Little's law", () => {
    const profile = new TaskProfile(0)
    // One executor: alone a call takes 10 ms; four at a time, 40 ms each.
    for (let i = 0; i < 100; i++)
      profile.record({ endedAt: 1_000 + i, latencyMs: 10, level: 1, executors: 1, ok: true })
    for (let i = 0; i < 100; i++)
      profile.record({ endedAt: 2_000 + i, latencyMs: i < 99 ? 40 : 400, level: 4, executors: 1, ok: true })
    // Two executors: four at a time, 20 ms each.
    for (let i = 0; i < 50; i++) profile.record({ endedAt: 3_000 + i, latencyMs: 20, level: 4, executors: 2, ok: true })
    profile.record({ endedAt: 3_100, latencyMs: 5, level: 1, executors: 2, ok: false })

    const summary = profile.summary(10_000)

    expect(summary.calls).toBe(251)
    expect(summary.failed).toBe(1)
    expect(summary.curves.map((curve) => curve.executors)).toEqual([1, 2])
    const [one, two] = summary.curves
    expect(one!.points).toEqual([
      {
        levelFrom: 1,
        levelTo: 1,
        meanLevel: 1,
        calls: 100,
        p50Ms: 10,
        p95Ms: 10,
        p99Ms: 10,
        meanMs: 10,
        callsPerSecond: 100
      },
      {
        levelFrom: 3,
        levelTo: 4,
        meanLevel: 4,
        calls: 100,
        p50Ms: 40,
        p95Ms: 40,
        p99Ms: 40,
        meanMs: 43.6,
        callsPerSecond: 91.74
      }
    ])
    expect(two!.points).toEqual([expect.objectContaining({ levelTo: 4, calls: 50, p50Ms: 20, callsPerSecond: 200 })])
  })

  it("reports the rate and latency of the last minute, and the executors' queue depth", () => {
    const profile = new TaskProfile(0)
    profile.record({ endedAt: 1_000, latencyMs: 999, level: 1, executors: 1, ok: true })
    const late = recentWindowMs + 30_000
    for (let i = 0; i < 30; i++)
      profile.record({ endedAt: late + i, latencyMs: 5 + i, level: 1, executors: 1, ok: true })
    profile.observeQueue(9, 1_000)
    profile.observeQueue(1, late)
    profile.observeQueue(3, late + 250)

    const summary = profile.summary(late + 1_000)

    // The call of a minute and a half ago is out of the window; the curve keeps it.
    expect(summary.recent).toEqual({ windowSeconds: 60, calls: 30, callsPerSecond: 0.5, p50Ms: 19, p99Ms: 34 })
    expect(summary.queueDepth).toEqual({ mean: 2, max: 3, reports: 2 })
    expect(summary.curves[0]!.points[0]!.calls).toBe(31)
  })

  it("weighs a queue report by the looks it stands for", () => {
    const profile = new TaskProfile(0)
    // An idle executor's line stands for the seven looks that saw nothing new, then a busy look.
    profile.observeQueue(0, 1_000, 7)
    profile.observeQueue(4, 1_250)
    expect(profile.summary(1_500).queueDepth).toEqual({ mean: 0.5, max: 4, reports: 8 })
  })

  it("keeps a bounded number of latencies per group: the percentiles follow the latest calls", () => {
    const profile = new TaskProfile(0)
    for (let i = 0; i < 2_000; i++)
      profile.record({ endedAt: i, latencyMs: i < 1_000 ? 100 : 1, level: 1, executors: 1, ok: true })
    const [point] = profile.summary(2_000).curves[0]!.points
    expect(point!.calls).toBe(2_000)
    expect(point!.p99Ms).toBe(1)
  })

  it("forgets calls older than its window: a curve follows the load of the last minutes", () => {
    const profile = new TaskProfile(0, 100_000)
    // Level 8 at 50 calls/s, long ago; then levels 1 and 2 only, recently.
    for (let i = 0; i < 40; i++)
      profile.record({ endedAt: 1_000 + i, latencyMs: 160, level: 8, executors: 1, ok: true })
    for (const level of [1, 2])
      for (let i = 0; i < 40; i++)
        profile.record({ endedAt: 150_000 + level * 100 + i, latencyMs: 10, level, executors: 1, ok: true })
    const points = profile.summary(160_000).curves[0]!.points
    expect(points.map((point) => [point.levelTo, point.calls])).toEqual([
      [1, 40],
      [2, 40]
    ])
    // The whole curve leaves once its calls are all out of the window; the call counts stay.
    const later = profile.summary(300_000)
    expect(later.curves).toEqual([])
    expect(later.calls).toBe(120)
    // A profile kept for good (a recording) forgets nothing.
    const kept = new TaskProfile(0, Number.POSITIVE_INFINITY)
    kept.record({ endedAt: 1, latencyMs: 5, level: 1, executors: 1, ok: true })
    expect(kept.summary(1e12).curves[0]!.points[0]!.calls).toBe(1)
  })

  it("answers an empty profile before any call", () => {
    const summary = new TaskProfile(0).summary(5_000)
    expect(summary).toMatchObject({ calls: 0, failed: 0, curves: [], queueDepth: { mean: 0, max: 0, reports: 0 } })
    expect(summary.recent.calls).toBe(0)
    expect(summary.recent.callsPerSecond).toBe(0)
  })

  it("reads what executors sustain only from curves that went past saturation", () => {
    const profile = new TaskProfile(0)
    // One executor: 40 calls at each level 1, 2, 4, 8 taking 10, 20, 40, 80 ms: 100 calls/s from
    // level 1 on, saturated. Two executors: 10 ms at levels 1 and 2: still rising, not saturated.
    let t = 0
    for (const [level, latencyMs] of [
      [1, 10],
      [2, 20],
      [4, 40],
      [8, 80]
    ] as const)
      for (let i = 0; i < 40; i++) profile.record({ endedAt: ++t, latencyMs, level, executors: 1, ok: true })
    for (const level of [1, 2])
      for (let i = 0; i < 40; i++) profile.record({ endedAt: ++t, latencyMs: 10, level, executors: 2, ok: true })
    // Three executors: throughput still rising at the highest load, by 8% (under 10%): saturated.
    for (const [level, latencyMs] of [
      [1, 10],
      [2, 10],
      [4, 18.5]
    ] as const)
      for (let i = 0; i < 40; i++) profile.record({ endedAt: ++t, latencyMs, level, executors: 3, ok: true })
    const summary = profile.summary(t)
    expect(sustainedOf(summary)).toEqual([
      { executors: 1, callsPerSecond: 100, calls: 160 },
      { executors: 3, callsPerSecond: 216.22, calls: 120 }
    ])
    expect(capacityOf(summary)).toBe(100)
    expect(capacityOf(new TaskProfile(0).summary(0))).toBeUndefined()
  })
})
