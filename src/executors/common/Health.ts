/** The health an executor reports: the contract between its router and the task manager watching it. */

/** What an executor says of its health, on `/health` and on each line of `/health/watch`. */
export type HealthReport =
  | { readonly status: "ready"; readonly workers: number; readonly inFlight: number }
  | { readonly status: "starting" }
  | { readonly status: "unhealthy"; readonly reason: string }

/**
 * How often `/health/watch` looks at the executor's health. The control plane holds one such stream
 * per executor instead of asking `/health` over and over: a request written from the gateway's event
 * loop costs it far more than a line read (on loopback the kernel delivers a write in the writer's
 * own time), and those writes were what stalled app requests now and then.
 *
 * A look writes a line only when the report differs from the last line, or when the last line is
 * `healthKeepaliveMs` old: an idle executor writes one line every few seconds rather than four a
 * second, which on an idle platform with a dozen executors was most of the CPU it used.
 */
export const healthWatchPeriodMs = 250

/**
 * The longest an executor's health watch stays silent while nothing changes: well inside the 30 s
 * after which the control plane counts a silent executor as wedged.
 */
export const healthKeepaliveMs = 5_000

/**
 * The lines of one `/health/watch` stream: given a report at each look, the line to write, or
 * `undefined` when the look has nothing new to say.
 */
export const healthLines = (now: () => number = Date.now) => {
  let last: string | undefined
  let lastAt = 0
  return (report: HealthReport): string | undefined => {
    const line = JSON.stringify(report)
    const at = now()
    if (line === last && at - lastAt < healthKeepaliveMs) return undefined
    last = line
    lastAt = at
    return `${line}\n`
  }
}
