import { readFileSync } from "node:fs"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  adminHeaders,
  invoke,
  registerRaw,
  removeStateDir,
  repoRoot,
  runCli,
  type RunningPlatform,
  startPlatform
} from "../support/platform.js"

const gated = join(repoRoot, "test", "fixtures", "apps", "gated.ts")
const hold = (ms: number) => JSON.stringify({ holdMs: ms })

/** Whether a request to the app has begun running (its app's summary counts it in flight). */
const appSummary = async (url: string, appId: string) => {
  const { apps } = (await (await fetch(`${url}/app/list`)).json()) as {
    apps: Array<{ id: string; inFlight: number; queued: number; admission?: Record<string, number> }>
  }
  return apps.find((app) => app.id === appId)!
}

const until = async (check: () => Promise<boolean>) => {
  for (let tries = 0; tries < 200; tries++) {
    if (await check()) return
    await new Promise((resolve) => setTimeout(resolve, 25))
  }
  throw new Error("the condition never held")
}

describe("admission control: an app's maxConcurrency and maxQueue", () => {
  let platform: RunningPlatform

  beforeAll(async () => {
    platform = await startPlatform({ args: ["--devices", "cpu:0"] })
    const registered = await runCli(["app", "register", gated], { CORNSERVE_GATEWAY_URL: platform.url })
    expect(registered.code, registered.stderr).toBe(0)
    const overridden = await registerRaw(platform.url, {
      name: "gated_short_queue",
      source: readFileSync(gated, "utf8"),
      admission: { queueTimeoutMs: 300 }
    })
    expect(overridden.text).toContain("event: final")
  })

  afterAll(async () => {
    await platform?.stop()
    await removeStateDir(platform.stateDir)
  })

  it("runs one request, queues the next, and answers 429 with Retry-After to a third at once", async () => {
    const first = invoke(platform.url, "gated", hold(1_500))
    await until(async () => (await appSummary(platform.url, "gated")).inFlight === 1)
    const second = invoke(platform.url, "gated", hold(0))
    await until(async () => (await appSummary(platform.url, "gated")).queued === 1)

    const third = await invoke(platform.url, "gated", hold(0))
    expect(third.status).toBe(429)
    expect(third.headers.get("retry-after")).toBe("1")
    expect(((await third.json()) as { error: { code: string } }).error.code).toBe("AppOverloaded")
    // The refused request did not run: the first is still the only one in flight.
    expect(await appSummary(platform.url, "gated")).toMatchObject({ inFlight: 1, queued: 1 })

    expect((await first).status).toBe(200)
    const queued = await second
    expect(queued.status).toBe(200)
    expect(await queued.json()).toEqual({ held: 0 })
    expect(await appSummary(platform.url, "gated")).toMatchObject({
      inFlight: 0,
      queued: 0,
      admission: { maxConcurrency: 1, maxQueue: 1, queueTimeoutMs: 60_000 }
    })

    const metrics = await (await fetch(`${platform.url}/metrics`, { headers: adminHeaders() })).text()
    expect(metrics).toContain('cornserve_requests_shed_total{app="gated",reason="app_overloaded"} 1')
    expect(metrics).toContain('cornserve_request_errors_total{app="gated",code="AppOverloaded"} 1')
    expect(metrics).toContain('cornserve_request_duration_seconds_count{app="gated",status="200"} 2')
    expect(metrics).toContain('cornserve_request_duration_seconds_count{app="gated",status="429"} 1')
  })

  it("answers 503 with Retry-After to a request that waited longer than the queue timeout set at registration", async () => {
    expect((await appSummary(platform.url, "gated_short_queue")).admission).toEqual({
      maxConcurrency: 1,
      maxQueue: 1,
      queueTimeoutMs: 300
    })
    const first = invoke(platform.url, "gated_short_queue", hold(2_000))
    await until(async () => (await appSummary(platform.url, "gated_short_queue")).inFlight === 1)
    const waited = await invoke(platform.url, "gated_short_queue", hold(0))
    expect(waited.status).toBe(503)
    expect(waited.headers.get("retry-after")).toBe("1")
    expect(((await waited.json()) as { error: { code: string } }).error.code).toBe("QueueTimeout")
    expect((await first).status).toBe(200)
    expect(await (await fetch(`${platform.url}/metrics`, { headers: adminHeaders() })).text()).toContain(
      'cornserve_requests_shed_total{app="gated_short_queue",reason="queue_timeout"} 1'
    )
  })

  it("frees the place of a queued request whose client went away", async () => {
    const first = invoke(platform.url, "gated", hold(1_000))
    await until(async () => (await appSummary(platform.url, "gated")).inFlight === 1)
    const client = new AbortController()
    const abandoned = fetch(`${platform.url}/app/invoke/gated`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: hold(0),
      signal: client.signal
    }).catch(() => undefined)
    await until(async () => (await appSummary(platform.url, "gated")).queued === 1)
    client.abort()
    await abandoned
    await until(async () => (await appSummary(platform.url, "gated")).queued === 0)
    // Its place is free: another request queues instead of being refused.
    const next = invoke(platform.url, "gated", hold(0))
    expect((await first).status).toBe(200)
    expect((await next).status).toBe(200)
  })

  it("keeps the settings given at registration across a restart", async () => {
    const stateDir = platform.stateDir
    await platform.stop()
    platform = await startPlatform({ args: ["--devices", "cpu:0"], stateDir })
    const restored = async () =>
      (
        (await (await fetch(`${platform.url}/app/list`)).json()) as {
          apps: Array<{ id: string; admission?: Record<string, number> }>
        }
      ).apps.find((app) => app.id === "gated_short_queue")?.admission
    await until(async () => (await restored()) !== undefined)
    expect(await restored()).toEqual({ maxConcurrency: 1, maxQueue: 1, queueTimeoutMs: 300 })
  })

  it("refuses at registration an app whose admission settings are not whole numbers", async () => {
    const source = readFileSync(gated, "utf8").replace("maxConcurrency: 1", "maxConcurrency: 0")
    const refused = await registerRaw(platform.url, { name: "gated_bad", source })
    expect(refused.text).toContain("admission.maxConcurrency")
  })
})
