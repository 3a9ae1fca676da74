import { readFileSync } from "node:fs"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  adminHeaders,
  eventually,
  invoke,
  registerRaw,
  removeStateDir,
  repoRoot,
  type RunningPlatform,
  startPlatform
} from "../support/platform.js"

const fixture = (name: string) => readFileSync(join(repoRoot, "test", "fixtures", "apps", `${name}.ts`), "utf8")
const helloSource = readFileSync(join(repoRoot, "examples", "hello.ts"), "utf8")

/** The platform's bound on an app's answers, small so that what a flooding app may write at once stays light. */
const maxResponseBytes = 1024 * 1024

/** How much slower than its baseline an answer may come under attack: generous, the machine may be loaded. */
const slack = (baselineMs: number) => Math.max(3_000, 20 * baselineMs)

const timed = async <A>(run: () => Promise<A>): Promise<{ readonly value: A; readonly ms: number }> => {
  const started = performance.now()
  const value = await run()
  return { value, ms: performance.now() - started }
}

const median = (values: ReadonlyArray<number>) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!

interface ListedApp {
  readonly id: string
  readonly state: string
  readonly error?: string
}

describe("an app's schemas and its channel cannot hold the platform's main thread", () => {
  let platform: RunningPlatform
  let helloBaselineMs = 0

  beforeAll(async () => {
    platform = await startPlatform({
      args: ["--devices", "cpu:0", "--max-response-bytes", String(maxResponseBytes)]
    })
    expect((await registerRaw(platform.url, { name: "hello", source: helloSource })).text).toContain("event: final")
    await hello()
    const times: Array<number> = []
    for (let round = 0; round < 5; round++) times.push((await timed(hello)).ms)
    helloBaselineMs = median(times)
  }, 60_000)

  afterAll(async () => {
    await platform?.stop()
    if (platform !== undefined) await removeStateDir(platform.stateDir)
  })

  const hello = async () => {
    const response = await invoke(platform.url, "hello", JSON.stringify({ name: "Ada" }))
    expect(response.status).toBe(200)
    return response.json()
  }

  /** Calls hello one request after another until `until` settles; answers the slowest. */
  const helloMeanwhile = async (until: Promise<unknown>): Promise<number> => {
    let settled = false
    void until.finally(() => {
      settled = true
    })
    let slowest = 0
    while (!settled) slowest = Math.max(slowest, (await timed(hello)).ms)
    return slowest
  }

  const invokeWith = (appId: string, body: string, init: RequestInit) =>
    fetch(`${platform.url}/app/invoke/${appId}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body,
      ...init
    })

  const listed = async (id: string): Promise<ListedApp | undefined> => {
    const { apps } = (await (await fetch(`${platform.url}/app/list`)).json()) as { apps: ReadonlyArray<ListedApp> }
    return apps.find((app) => app.id === id)
  }

  const unregister = (id: string) =>
    timed(async () => {
      const response = await fetch(`${platform.url}/app/unregister/${id}`, {
        method: "POST",
        headers: adminHeaders({ "content-type": "application/json" })
      })
      expect(response.status).toBe(200)
    })

  it("refuses at once an app whose process forges schemas naming 24,000 colliding names, naming the bound; hello answers meanwhile", async () => {
    const registering = registerRaw(platform.url, { name: "collider", source: fixture("schema_collider") })
    const slowestHello = await helloMeanwhile(registering)
    const registered = await registering
    expect(registered.status).toBe(400)
    expect(JSON.parse(registered.text).error.message).toContain(
      "its schemas name 24000 schemas ($defs), over the limit of 1000"
    )
    expect(slowestHello).toBeLessThan(slack(helloBaselineMs))
    expect(await listed("collider")).toBeUndefined()
  }, 120_000)

  it("serves an app whose forged schemas name as many colliding names as the bound allows, through its restarts, and unregisters it promptly", async () => {
    expect((await registerRaw(platform.url, { name: "spare", source: helloSource })).text).toContain("event: final")
    const unregisterBaselineMs = (await unregister("spare")).ms

    const source = fixture("schema_collider").replace("const names = 24_000", "const names = 1_000")
    expect(source).toContain("const names = 1_000")
    const registering = registerRaw(platform.url, { name: "collider_within", source })
    const slowestHello = await helloMeanwhile(registering)
    expect((await registering).text).toContain("event: final")
    expect(slowestHello).toBeLessThan(slack(helloBaselineMs))

    const document = await timed(async () => {
      const response = await fetch(`${platform.url}/app/collider_within/openapi.json`)
      expect(response.status).toBe(200)
      return (await response.json()) as { components: { schemas: Record<string, unknown> } }
    })
    // Names no other app gives are kept as the app's process named them, each read as `_` and then apart.
    const named = Object.keys(document.value.components.schemas).filter((name) => /^_(_\d+)?$/.test(name))
    expect(named).toHaveLength(1_000)
    expect(named).toContain("__1000")
    expect((await fetch(`${platform.url}/openapi.json`)).status).toBe(200)

    // The SDK's own "loaded" follows the forged one: the process is stopped for it and started again,
    // forging its schemas again each time, and `app list` says why.
    const stopped = await eventually(async () => (await listed("collider_within"))?.error)
    expect(stopped).toContain('it sent "loaded" after its app had loaded')
    const slowestDuringRestarts = await helloMeanwhile(new Promise((resolve) => setTimeout(resolve, 3_000)))
    expect(slowestDuringRestarts).toBeLessThan(slack(helloBaselineMs))

    const unregistered = await unregister("collider_within")
    expect(unregistered.ms).toBeLessThan(slack(unregisterBaselineMs))
    expect(await listed("collider_within")).toBeUndefined()
    await hello()
  }, 120_000)

  it("stops an app that floods its channel, with the reason in its state and log, restarts it, and hello answers throughout", async () => {
    expect((await registerRaw(platform.url, { name: "flood", source: fixture("channel_flood") })).text).toContain(
      "event: final"
    )
    const residentBefore = residentMiB(platform.process.pid!)
    const flooding = invokeWith("flood", JSON.stringify({ frameBytes: 2 * maxResponseBytes }), {
      signal: AbortSignal.timeout(60_000)
    })
    const slowestHello = await helloMeanwhile(flooding)
    const failed = await flooding
    const error = ((await failed.json()) as { error: { code: string; message: string } }).error
    expect(error.code).toBe("AppFailed")
    expect(error.message).toContain("wrote to its channel faster than its bound of 8 MiB a second (6 MiB at once)")
    expect(slowestHello).toBeLessThan(slack(helloBaselineMs))
    expect(residentMiB(platform.process.pid!) - residentBefore).toBeLessThan(200)

    expect((await listed("flood"))?.error).toContain("wrote to its channel faster than")
    const log = await (await fetch(`${platform.url}/app/logs/flood`, { headers: adminHeaders() })).text()
    expect(log).toContain("(platform) the app's process wrote to its channel faster than")
    // Restarted by the restart policy: it is there to flood again, and is stopped again.
    await eventually(async () => ((await listed("flood"))?.error?.includes("was restarted at") ? true : undefined))
    const again = await invoke(platform.url, "flood", JSON.stringify({ frameBytes: 2 * maxResponseBytes }))
    expect(((await again.json()) as { error: { message: string } }).error.message).toContain(
      "wrote to its channel faster than"
    )
    await hello()
  }, 120_000)

  it("never stops an app streaming past its burst at a steady rate", async () => {
    expect((await registerRaw(platform.url, { name: "firehose", source: fixture("firehose") })).text).toContain(
      "event: final"
    )
    const controller = new AbortController()
    const response = await invokeWith("firehose", "{}", { signal: controller.signal })
    expect(response.status).toBe(200)
    const reader = response.body!.getReader()
    // 2 MiB a second for 5 s: past the 6 MiB it may write at once, within the 8 MiB a second it may keep up.
    let read = 0
    const started = Date.now()
    while (read < 10 * 1024 * 1024) {
      const chunk = await reader.read()
      expect(chunk.done).toBe(false)
      read += chunk.value!.length
      const ahead = read / (2 * 1024 * 1024) - (Date.now() - started) / 1_000
      if (ahead > 0) await new Promise((resolve) => setTimeout(resolve, ahead * 1_000))
    }
    controller.abort()
    expect((await listed("firehose"))?.error).toBeUndefined()
  }, 60_000)
})

const residentMiB = (pid: number): number => {
  const line = readFileSync(`/proc/${pid}/status`, "utf8")
    .split("\n")
    .find((entry) => entry.startsWith("VmRSS:"))!
  return Number(line.split(/\s+/)[1]) / 1024
}
