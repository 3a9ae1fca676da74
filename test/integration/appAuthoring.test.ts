import { readFileSync } from "node:fs"
import { writeFile } from "node:fs/promises"
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
import { solidPngBase64 } from "../support/images.js"

const fixture = (name: string) => readFileSync(join(repoRoot, "test", "fixtures", "apps", `${name}.ts`), "utf8")

const solidPng = async (r: number, g: number, b: number) => `data:image/png;base64,${await solidPngBase64(r, g, b)}`

const lines = (text: string) =>
  text
    .trim()
    .split("\n")
    .map((line) => JSON.parse(line) as Record<string, unknown>)

/** One platform for the first day and the schema errors: each start costs seconds of the suite. */
let platform: RunningPlatform

beforeAll(async () => {
  // The watchdog stops an app whose event loop stays busy for a second.
  platform = await startPlatform({ args: ["--devices", "cpu:0", "--app-stall-timeout", "1"] })
}, 60_000)

afterAll(async () => {
  await platform?.stop()
  if (platform !== undefined) await removeStateDir(platform.stateDir)
})

describe("an app author's first day", () => {
  it("streams lines between task calls: an async generator yields, invokes the MLLM, yields and invokes it again", async () => {
    expect((await registerRaw(platform.url, { name: "stream_tasks", source: fixture("stream_tasks") })).text).toContain(
      "event: final"
    )
    const response = await invoke(
      platform.url,
      "stream_tasks",
      JSON.stringify({ first: await solidPng(230, 20, 20), second: await solidPng(20, 30, 235) })
    )
    expect(response.status).toBe(200)
    const answer = lines(await response.text())
    expect(answer.map((line) => line.step)).toEqual([
      "looking at the first image",
      "first",
      "looking at the second image",
      "second"
    ])
    expect(answer[1]!.answer).toMatch(/red/i)
    expect(answer[3]!.answer).toMatch(/blue/i)
  }, 120_000)

  it("ends a never-ending stream at the app's timeoutMs with an error line, and tells a stalled app's client why", async () => {
    expect((await registerRaw(platform.url, { name: "endless", source: fixture("endless") })).text).toContain(
      "event: final"
    )
    const started = Date.now()
    const response = await invoke(platform.url, "endless", "{}")
    expect(response.status).toBe(200)
    const answer = lines(await response.text())
    const elapsed = Date.now() - started
    expect(elapsed, "the stream ended at its limit, not at the platform's").toBeLessThan(60_000)
    expect(answer.length).toBeGreaterThan(1)
    expect(answer.at(-1)).toMatchObject({ error: { code: "RequestTimeout" } })
    expect(JSON.stringify(answer.at(-1))).toContain("time limit of 1500 ms")

    // A serve that never yields, in an app without a limit of its own: the watchdog stops the
    // process, and its client hears why.
    const spinner = fixture("endless").replace("timeoutMs: 1_500,", "")
    expect((await registerRaw(platform.url, { name: "spinner", source: spinner })).text).toContain("event: final")
    const stalled = await invoke(platform.url, "spinner", JSON.stringify({ spin: true }))
    expect(stalled.status).toBeGreaterThanOrEqual(500)
    expect(await stalled.text()).toContain("did not yield to the event loop for 1000 ms")
  }, 120_000)

  it("sets a request timeout at registration (app register --timeout) and lists it", async () => {
    const file = join(platform.stateDir, "countdown_limited.ts")
    await writeFile(file, readFileSync(join(repoRoot, "examples", "countdown.ts"), "utf8"))
    const registered = await runCli(["app", "register", file, "--timeout", "0.5", "--gateway", platform.url])
    expect(registered.code, registered.stderr).toBe(0)
    const response = await invoke(platform.url, "countdown_limited", JSON.stringify({ from: 20, intervalMs: 100 }))
    const answer = lines(await response.text())
    expect(answer.at(-1)).toMatchObject({ error: { code: "RequestTimeout" } })
    expect(answer.length).toBeLessThan(20)
    const list = (await (await fetch(`${platform.url}/app/list`)).json()) as {
      apps: Array<{ id: string; timeoutMs?: number }>
    }
    expect(list.apps.find((app) => app.id === "countdown_limited")?.timeoutMs).toBe(500)
  }, 60_000)
})

describe("schema errors an app's client and author can read", () => {
  beforeAll(async () => {
    for (const [name, source] of [
      ["countdown_strict", readFileSync(join(repoRoot, "examples", "countdown.ts"), "utf8")],
      ["bad_answer", fixture("bad_answer")],
      [
        "lenient",
        readFileSync(join(repoRoot, "examples", "countdown.ts"), "utf8").replace(
          "tasks: {},",
          'tasks: {},\n  extraFields: "drop",'
        )
      ]
    ] as const) {
      expect((await registerRaw(platform.url, { name, source })).text, name).toContain("event: final")
    }
  }, 60_000)

  it("answers a bad request with one readable line per field, an unknown field included", async () => {
    const response = await invoke(
      platform.url,
      "countdown_strict",
      JSON.stringify({ from: 3, intervalMs: "x", color: "red" })
    )
    expect(response.status).toBe(422)
    const { error } = (await response.json()) as {
      error: { message: string; issues: Array<{ path: Array<string>; message: string }> }
    }
    expect(error.issues).toEqual([
      { path: ["color"], message: 'is not a field here (the fields are "from", "intervalMs")' },
      { path: ["intervalMs"], message: 'expected number, got "x"' }
    ])
    expect(error.message).not.toContain("Expected undefined")
  })

  it("drops unknown fields for an app that says so", async () => {
    const response = await invoke(platform.url, "lenient", JSON.stringify({ from: 1, color: "red" }))
    expect(response.status).toBe(200)
  })

  it("answers an answer that fails the response schema with a 500 naming the field, and logs the details", async () => {
    const response = await invoke(platform.url, "bad_answer", "{}")
    expect(response.status).toBe(500)
    const { error } = (await response.json()) as { error: { code: string; message: string } }
    expect(error.message).toContain("does not match the app's response schema")
    expect(error.message).toContain('count: expected number, got "three"')
    const logs = await (await fetch(`${platform.url}/app/logs/bad_answer`, { headers: adminHeaders() })).text()
    expect(logs).toContain("does not match the app's response schema")
  })
})

describe("readiness while the apps of the state dir come back", () => {
  it("answers /ready 503 and the apps being restored 503 AppNotReady with Retry-After, then 200", async () => {
    let platform = await startPlatform({ args: ["--devices", "cpu:0"] })
    try {
      for (const name of ["slow_one", "slow_two"]) {
        expect((await registerRaw(platform.url, { name, source: fixture("slow_loading") })).text).toContain(
          "event: final"
        )
      }
      expect(
        (await registerRaw(platform.url, { name: "hello", source: fixture("slow_loading").replace("3_000", "0") })).text
      ).toContain("event: final")
      expect((await fetch(`${platform.url}/ready`)).status).toBe(200)
      await platform.stop()
      const stateDir = platform.stateDir
      const restartedAt = Date.now()
      platform = await startPlatform({ stateDir, args: ["--devices", "cpu:0"] })
      const starting = await fetch(`${platform.url}/ready`)
      expect(starting.status).toBe(503)
      expect(await starting.json()).toMatchObject({ status: "starting" })
      const restoring = await invoke(platform.url, "slow_one", "{}")
      expect(restoring.status).toBe(503)
      expect(restoring.headers.get("retry-after")).toBe("1")
      expect(((await restoring.json()) as { error: { code: string } }).error.code).toBe("AppNotReady")
      expect((await fetch(`${platform.url}/health`)).status, "liveness holds meanwhile").toBe(200)
      // The two slow apps load side by side, not one after the other.
      let readyAt = 0
      for (;;) {
        if ((await fetch(`${platform.url}/ready`)).status === 200) {
          readyAt = Date.now()
          break
        }
        await new Promise((resolve) => setTimeout(resolve, 100))
      }
      expect(readyAt - restartedAt).toBeLessThan(30_000)
      for (const name of ["slow_one", "slow_two", "hello"]) {
        expect((await invoke(platform.url, name, "{}")).status, name).toBe(200)
      }
    } finally {
      await platform.stop()
      await removeStateDir(platform.stateDir)
    }
  }, 120_000)
})
