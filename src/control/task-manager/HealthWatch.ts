import * as Http from "node:http"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import { type HealthReport, healthWatchPeriodMs } from "../../executors/common/Health.js"
import type { Executor } from "./ExecutorKinds.js"

/**
 * How long an executor's health watch may stay silent before the executor counts as wedged. Its
 * process exiting ends the stream, and an executor that finds itself unhealthy says so, both at
 * once; silence alone means only that its router's event loop is not running, which on a busy
 * host (or a stopped process) lasts seconds and ends by itself. The executor stays in rotation
 * meanwhile: its requests wait for it rather than being refused.
 */
export class ExecutorWedgedAfter extends Context.Reference<ExecutorWedgedAfter>()("cornserve/ExecutorWedgedAfter", {
  defaultValue: () => 30_000
}) {}

/**
 * Follows one executor's `/health/watch` stream until it ends: each line sets the executor's health
 * (`heard.health`) and, while it is ready, tells its calls in flight (`heard.queue`);
 * the stream ending (the executor gone or restarting) takes it out of rotation until a new watch
 * sees it ready. A slow executor (lines late, its event loop starved) stays in rotation; one silent
 * for `wedgedAfterMs` (see ExecutorWedgedAfter) is wedged and restarted, as is one that reports
 * itself unhealthy.
 */
export const watchHealth = (
  executor: Executor,
  heard: {
    readonly health: (healthy: boolean) => void
    readonly queue: (inFlight: number, looks: number) => void
  },
  secret: string | undefined,
  wedgedAfterMs: number
) =>
  Effect.async<void>((resume) => {
    const url = executor.url()
    if (url === undefined) {
      heard.health(false)
      resume(Effect.void)
      return
    }
    let silence: NodeJS.Timeout | undefined
    const listen = () => {
      clearTimeout(silence)
      silence = setTimeout(() => {
        heard.health(false)
        executor.restart(`its health watch was silent for ${wedgedAfterMs / 1000} s`)
      }, wedgedAfterMs)
    }
    // The executor writes a line only when its report changes or goes stale (Health.ts): the looks
    // in between saw the last ready line's depth, and count as reports of it.
    let lastReady: { readonly inFlight: number; readonly at: number } | undefined
    const heardQueue = (inFlight: number) => {
      const at = Date.now()
      const leftOut = lastReady === undefined ? 0 : Math.round((at - lastReady.at) / healthWatchPeriodMs) - 1
      if (lastReady !== undefined && leftOut > 0) heard.queue(lastReady.inFlight, leftOut)
      heard.queue(inFlight, 1)
      lastReady = { inFlight, at }
    }
    let ended = false
    const end = () => {
      if (ended) return
      ended = true
      clearTimeout(silence)
      heard.health(false)
      request.destroy()
      resume(Effect.void)
    }
    const headers = secret === undefined ? {} : { authorization: `Bearer ${secret}` }
    const request = Http.get(`${url}/health/watch`, { agent: false, headers }, (response) => {
      if (response.statusCode !== 200) return end()
      response.setEncoding("utf8")
      let pending = ""
      response.on("data", (text: string) => {
        pending += text
        for (let newline = pending.indexOf("\n"); newline >= 0; newline = pending.indexOf("\n")) {
          const line = pending.slice(0, newline)
          pending = pending.slice(newline + 1)
          let report: Partial<HealthReport> & { readonly reason?: string }
          try {
            report = JSON.parse(line) as typeof report
          } catch {
            continue
          }
          listen()
          heard.health(report.status === "ready")
          if (report.status === "ready" && typeof report.inFlight === "number") heardQueue(report.inFlight)
          else lastReady = undefined
          if (report.status === "unhealthy") executor.restart(report.reason ?? "it reported itself unhealthy")
        }
      })
      response.once("end", end)
      response.once("error", end)
    })
    request.once("error", end)
    request.once("close", end)
    // Silence counts from the request: an executor that takes the connection but never answers is wedged too.
    listen()
    return Effect.sync(() => {
      ended = true
      clearTimeout(silence)
      request.destroy()
    })
  })
