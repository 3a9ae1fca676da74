import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import { Effect, Fiber } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import { watchHealth } from "../../../src/control/task-manager/HealthWatch.js"
import { healthKeepaliveMs, healthLines, healthWatchPeriodMs } from "../../../src/executors/common/Health.js"

/**
 * An executor's health watch writes a line only when its report changes or goes stale; the control
 * plane counts the looks it left out as reports of the last depth it heard, so a task's queue depth
 * means what it meant when every look wrote a line.
 */

describe("healthLines: what one /health/watch stream writes", () => {
  it("writes the first report, then only changes, and the same report again once it is stale", () => {
    let now = 0
    const lineOf = healthLines(() => now)
    const idle = { status: "ready", workers: 1, inFlight: 0 } as const
    const busy = { status: "ready", workers: 1, inFlight: 2 } as const
    const looks: Array<string | undefined> = []
    for (const report of [idle, idle, idle, busy, busy, idle]) {
      looks.push(lineOf(report))
      now += healthWatchPeriodMs
    }
    expect(looks).toEqual([
      `${JSON.stringify(idle)}\n`,
      undefined,
      undefined,
      `${JSON.stringify(busy)}\n`,
      undefined,
      `${JSON.stringify(idle)}\n`
    ])
    // The last line went at the sixth look.
    const lastLineAt = 5 * healthWatchPeriodMs
    now = lastLineAt + healthKeepaliveMs - 1
    expect(lineOf(idle)).toBeUndefined()
    now = lastLineAt + healthKeepaliveMs
    expect(lineOf(idle)).toBe(`${JSON.stringify(idle)}\n`)
    expect(lineOf({ status: "unhealthy", reason: "worker 0 exited" })).toBe(
      `${JSON.stringify({ status: "unhealthy", reason: "worker 0 exited" })}\n`
    )
  })
})

describe("watchHealth: looks an executor left out count as reports of its last depth", () => {
  let server: Http.Server | undefined
  afterEach(async () => {
    server?.closeAllConnections()
    await new Promise((resolve) => server?.close(resolve))
  })

  it("fills in the silent looks between two lines with the first line's depth", async () => {
    let write: (line: object) => void = () => undefined
    server = Http.createServer((_, response) => {
      response.writeHead(200, { "content-type": "application/x-ndjson" })
      write = (line) => response.write(`${JSON.stringify(line)}\n`)
      write({ status: "ready", workers: 1, inFlight: 3 })
    })
    await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve))
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
    const heard: Array<[number, number]> = []
    const health: Array<boolean> = []
    const fiber = Effect.runFork(
      watchHealth(
        { devices: [], url: () => url, restart: () => undefined },
        { health: (healthy) => health.push(healthy), queue: (inFlight, looks) => heard.push([inFlight, looks]) },
        undefined,
        30_000
      )
    )
    const until = async (condition: () => boolean) => {
      while (!condition()) await new Promise((resolve) => setTimeout(resolve, 10))
    }
    await until(() => heard.length === 1)
    const firstHeardAt = Date.now()
    // Four looks' time with nothing new, then a change.
    await new Promise((resolve) => setTimeout(resolve, 4 * healthWatchPeriodMs))
    write({ status: "ready", workers: 1, inFlight: 0 })
    await until(() => heard.length === 3)
    const looksBetween = Math.round((Date.now() - firstHeardAt) / healthWatchPeriodMs) - 1
    expect(heard[0]).toEqual([3, 1])
    expect(heard[1]![0]).toBe(3)
    // At least the three silent looks; more only if this process ran late.
    expect(heard[1]![1]).toBeGreaterThanOrEqual(3)
    expect(heard[1]![1]).toBeLessThanOrEqual(looksBetween + 1)
    expect(heard[2]).toEqual([0, 1])
    expect(health).toEqual([true, true])
    // A report that is not ready starts the count afresh: no looks are filled in across it.
    write({ status: "starting" })
    await until(() => health.length === 3)
    write({ status: "ready", workers: 1, inFlight: 1 })
    await until(() => heard.length === 4)
    expect(heard[3]).toEqual([1, 1])
    await Effect.runPromise(Fiber.interrupt(fiber))
  })
})
