/** The health an executor reports: the contract between its router and the task manager watching it. */

/** What an executor says of its health, on `/health` and on each line of `/health/watch`. */
export type HealthReport =
  | { readonly status: "ready"; readonly workers: number; readonly inFlight: number }
  | { readonly status: "starting" }
  | { readonly status: "unhealthy"; readonly reason: string }

/**
 * How often `/health/watch` reports. The control plane holds one such stream per executor instead of
 * asking `/health` over and over: a request written from the gateway's event loop costs it far more
 * than a line read (on loopback the kernel delivers a write in the writer's own time), and those
 * writes were what stalled app requests now and then.
 */
export const healthWatchPeriodMs = 250
