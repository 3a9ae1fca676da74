/**
 * What a task manager learns of its executors online, call by call: how long calls take at each
 * load level, per executor count (the throughput–latency curve a resource manager weighs devices
 * by), how many calls come in, and how deep the executors' own queues run.
 *
 * A call's load level is the number of calls the task had in flight when it began, itself
 * included. By Little's law a level L served at a mean latency W gives L / W calls per second: the
 * curve's throughput. Levels are grouped by powers of two (1, 2, 3–4, 5–8, ...). Each group keeps
 * its count and the latencies of its latest calls (bounded), so that the percentiles follow the
 * task as it is now, and a curve holds only the calls of the last `curveWindowMs` (ten minutes by
 * default): a throughput measured under a load mix long gone does not decide for the one now.
 * Everything here is plain data and a clock passed in: no I/O, no timers.
 */

/** Latencies kept per (executor count, load group): enough for a p99, bounded in memory. */
const latenciesKept = 512
/** The window of the recent rate and of the queue depth. */
export const recentWindowMs = 60_000
/** How long a call counts in the curves, by default. */
export const curveWindowMs = 600_000
/** A curve's counts are kept in this many slices of its window, so that old calls leave it a slice at a time. */
const curveSlices = 10

export interface CallSample {
  /** When the call ended, ms on the caller's clock. */
  readonly endedAt: number
  readonly latencyMs: number
  /** Calls in flight in the task when it began, itself included. */
  readonly level: number
  /** Executors the task had when it began. */
  readonly executors: number
  readonly ok: boolean
}

export interface CurvePoint {
  /** The load group: levels from `levelFrom` to `levelTo`. */
  readonly levelFrom: number
  readonly levelTo: number
  /** The mean level of the calls measured in the group. */
  readonly meanLevel: number
  /** Calls of the group in the window (to the nearest slice of it). */
  readonly calls: number
  readonly p50Ms: number
  readonly p95Ms: number
  readonly p99Ms: number
  readonly meanMs: number
  /** meanLevel / mean latency: calls per second the task sustains at this load (Little's law). */
  readonly callsPerSecond: number
}

export interface ProfileCurve {
  readonly executors: number
  readonly points: ReadonlyArray<CurvePoint>
}

export interface ProfileSummary {
  readonly calls: number
  readonly failed: number
  readonly recent: {
    readonly windowSeconds: number
    readonly calls: number
    readonly callsPerSecond: number
    readonly p50Ms: number
    readonly p99Ms: number
  }
  /** Calls waiting or running in the executors, as their health reports said, over the window. */
  readonly queueDepth: { readonly mean: number; readonly max: number; readonly reports: number }
  readonly curves: ReadonlyArray<ProfileCurve>
}

/** The load group of a level: 1, 2, then (2^(k-1), 2^k]. */
export const levelGroup = (level: number): readonly [number, number] => {
  if (level <= 1) return [1, 1]
  const to = 2 ** Math.ceil(Math.log2(level))
  return [to / 2 + 1, to]
}

/** Nearest-rank percentile of sorted values (NaN of none). */
const percentile = (sorted: ReadonlyArray<number>, p: number) =>
  sorted.length === 0 ? Number.NaN : sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1))]!

const round = (value: number, digits = 2) => (Number.isFinite(value) ? Number(value.toFixed(digits)) : value)

interface Slice {
  /** The slice's index: its calls ended in [index × slice, (index + 1) × slice). */
  readonly index: number
  calls: number
  levelSum: number
}

interface Group {
  /** Calls and their levels by slice of the window, oldest first. */
  readonly slices: Array<Slice>
  /** The latest calls' [endedAt, latencyMs], a ring of `latenciesKept`. */
  readonly latencies: Array<readonly [number, number]>
  next: number
}

export class TaskProfile {
  private readonly sliceMs: number

  /**
   * `startedAt`: when measuring began, on the clock `record` and `summary` are given. `windowMs`:
   * how long a call counts in the curves (Infinity: for good, as in a recording).
   */
  constructor(
    private readonly startedAt: number,
    private readonly windowMs: number = curveWindowMs
  ) {
    this.sliceMs = windowMs / curveSlices
  }

  private calls = 0
  private failed = 0
  /** (executors, load group's upper level) → group. */
  private readonly groups = new Map<string, Group>()
  /** The calls of the recent window, oldest first: [endedAt, latencyMs]. */
  private readonly recentCalls: Array<readonly [number, number]> = []
  /** [at, depth, looks]: `looks` of an executor's health watch saw `depth` calls in it. */
  private readonly queueReports: Array<readonly [number, number, number]> = []

  record(sample: CallSample): void {
    this.calls++
    this.trim(this.recentCalls, sample.endedAt)
    if (!sample.ok) {
      this.failed++
      return
    }
    this.recentCalls.push([sample.endedAt, sample.latencyMs])
    const [, to] = levelGroup(sample.level)
    const key = `${sample.executors}/${to}`
    const group = this.groups.get(key) ?? { slices: [], latencies: [], next: 0 }
    this.groups.set(key, group)
    const index = Number.isFinite(this.sliceMs) ? Math.floor(sample.endedAt / this.sliceMs) : 0
    let slice = group.slices[group.slices.length - 1]
    if (slice === undefined || slice.index < index) {
      slice = { index, calls: 0, levelSum: 0 }
      group.slices.push(slice)
      while (group.slices[0]!.index <= index - curveSlices - 1) group.slices.shift()
    }
    slice.calls++
    slice.levelSum += sample.level
    const entry = [sample.endedAt, sample.latencyMs] as const
    if (group.latencies.length < latenciesKept) group.latencies.push(entry)
    else group.latencies[group.next] = entry
    group.next = (group.next + 1) % latenciesKept
  }

  /**
   * An executor's health report said `depth` calls were in it at `at`; `looks` counts the reports it
   * stands for (an idle executor writes one line where its watch looked several times and saw the same).
   */
  observeQueue(depth: number, at: number, looks = 1): void {
    this.trim(this.queueReports, at)
    this.queueReports.push([at, depth, looks])
  }

  summary(now: number): ProfileSummary {
    this.trim(this.recentCalls, now)
    this.trim(this.queueReports, now)
    const recent = this.recentCalls.map(([, latency]) => latency).sort((a, b) => a - b)
    const spanMs = Math.min(recentWindowMs, Math.max(1, now - this.startedAt))
    const looks = this.queueReports.reduce((sum, [, , count]) => sum + count, 0)
    const depthSum = this.queueReports.reduce((sum, [, depth, count]) => sum + depth * count, 0)
    const curves = new Map<number, Array<CurvePoint>>()
    const since = now - this.windowMs
    for (const [key, group] of this.groups) {
      // The slices the window reaches, and the latencies in it: a group with none has left the curve.
      const slices = group.slices.filter((slice) => (slice.index + 1) * this.sliceMs > since)
      const calls = slices.reduce((sum, slice) => sum + slice.calls, 0)
      const sorted = group.latencies
        .flatMap(([endedAt, latency]) => (endedAt >= since ? [latency] : []))
        .sort((a, b) => a - b)
      if (calls === 0 || sorted.length === 0) continue
      const [executors, to] = key.split("/").map(Number) as [number, number]
      const [from] = levelGroup(to)
      const meanMs = sorted.reduce((sum, value) => sum + value, 0) / sorted.length
      const meanLevel = slices.reduce((sum, slice) => sum + slice.levelSum, 0) / calls
      const points = curves.get(executors) ?? []
      curves.set(executors, points)
      points.push({
        levelFrom: from,
        levelTo: to,
        meanLevel: round(meanLevel),
        calls,
        p50Ms: round(percentile(sorted, 0.5)),
        p95Ms: round(percentile(sorted, 0.95)),
        p99Ms: round(percentile(sorted, 0.99)),
        meanMs: round(meanMs),
        callsPerSecond: round(meanLevel / (meanMs / 1000))
      })
    }
    return {
      calls: this.calls,
      failed: this.failed,
      recent: {
        windowSeconds: recentWindowMs / 1000,
        calls: recent.length,
        callsPerSecond: round(recent.length === 0 ? 0 : recent.length / (spanMs / 1000)),
        p50Ms: round(percentile(recent, 0.5)),
        p99Ms: round(percentile(recent, 0.99))
      },
      queueDepth: {
        mean: round(looks === 0 ? 0 : depthSum / looks),
        max: this.queueReports.reduce((max, [, depth]) => Math.max(max, depth), 0),
        reports: looks
      },
      curves: [...curves]
        .sort(([a], [b]) => a - b)
        .map(([executors, points]) => ({
          executors,
          points: points.sort((a, b) => a.levelTo - b.levelTo)
        }))
    }
  }

  /** Drops entries older than the window. */
  private trim(entries: Array<readonly [number, ...Array<number>]>, now: number) {
    let stale = 0
    while (stale < entries.length && entries[stale]![0] < now - recentWindowMs) stale++
    if (stale > 0) entries.splice(0, stale)
  }
}

/** Calls a curve's point must have measured to count towards a capacity. */
const capacityCalls = 20

/**
 * What the task sustained at each executor count its profile measured to saturation: the best
 * throughput of a curve whose highest load group raised throughput by less than 10% over the group
 * below it. A curve whose throughput still rose at its top says nothing of what more load would
 * get.
 */
export const sustainedOf = (
  summary: Pick<ProfileSummary, "curves">
): ReadonlyArray<{ readonly executors: number; readonly callsPerSecond: number; readonly calls: number }> =>
  summary.curves.flatMap((curve) => {
    const points = curve.points.filter((point) => point.calls >= capacityCalls && point.callsPerSecond > 0)
    if (points.length < 2) return []
    const peak = points.reduce((top, point) => (point.callsPerSecond > top.callsPerSecond ? point : top))
    // Judged at the top of the curve: its highest load against the group below it.
    const [below, highest] = points.slice(-2) as [CurvePoint, CurvePoint]
    if (highest.callsPerSecond >= 1.1 * below.callsPerSecond) return []
    const calls = points.reduce((sum, point) => sum + point.calls, 0)
    return [{ executors: curve.executors, callsPerSecond: peak.callsPerSecond, calls }]
  })

/**
 * Calls per second one executor sustains, as a profile shows it: from the saturated curve with the
 * most calls, its throughput over its executors. Undefined when no curve shows saturation.
 */
export const capacityOf = (summary: Pick<ProfileSummary, "curves">): number | undefined => {
  const curves = sustainedOf(summary)
  if (curves.length === 0) return undefined
  const best = curves.reduce((top, curve) => (curve.calls > top.calls ? curve : top))
  return best.callsPerSecond / Math.max(1, best.executors)
}
