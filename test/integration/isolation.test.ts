import { existsSync, readdirSync, readFileSync } from "node:fs"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  appState,
  childPids,
  eventually,
  invoke,
  registerRaw,
  removeStateDir,
  repoRoot,
  type RunningPlatform,
  startPlatform
} from "../support/platform.js"

const token = "isolation-test-token"
const fixture = (name: string) => readFileSync(join(repoRoot, "test", "fixtures", "apps", `${name}.ts`), "utf8")
const example = (name: string) => readFileSync(join(repoRoot, "examples", `${name}.ts`), "utf8")

const act = async (url: string, action: string, path?: string) => {
  const response = await invoke(url, "hostile", JSON.stringify({ action, ...(path === undefined ? {} : { path }) }))
  return { status: response.status, body: (await response.json()) as { outcome?: string; error?: { code: string } } }
}

describe("apps run isolated from the platform and from each other", () => {
  let platform: RunningPlatform

  beforeAll(async () => {
    platform = await startPlatform({
      args: ["--devices", "cpu:0", "--app-stall-timeout", "2", "--app-memory-mib", "512"],
      env: { CORNSERVE_ADMIN_TOKEN: token }
    })
    for (const [name, source] of [
      ["hostile", fixture("hostile")],
      ["hello", example("hello")]
    ] as const) {
      const registered = await registerRaw(platform.url, { name, source }, token)
      expect(registered.text).toContain("event: final")
    }
  })

  afterAll(async () => {
    await platform.stop()
    await removeStateDir(platform.stateDir)
  })

  const stillServing = async () => {
    expect(platform.process.exitCode).toBeNull()
    const hello = await invoke(platform.url, "hello", JSON.stringify({ name: "Ada" }))
    expect(hello.status).toBe(200)
  }

  it("runs each app in a process of its own, not in the gateway", () => {
    const appProcesses = childPids(platform.process.pid!).filter((pid) =>
      readFileSync(`/proc/${pid}/cmdline`, "utf8").includes("--experimental-permission")
    )
    expect(appProcesses).toHaveLength(2)
  })

  it("refuses a task the app did not declare, saying so", async () => {
    const { status, body } = await act(platform.url, "undeclared-task")
    expect(status).toBe(200)
    expect(body.outcome).toBe("refused: the app declares no tasks: list the tasks it invokes in defineApp's tasks")
  })

  it("gives an app no platform secret: the admin token is not in its environment", async () => {
    const { status, body } = await act(platform.url, "read-env")
    expect(status).toBe(200)
    expect(body.outcome).toContain("token=absent")
    expect(body.outcome).not.toContain(token)
  })

  it("lets an app neither write the state dir nor read files outside the SDK", async () => {
    const planted = join(platform.stateDir, "apps", "planted.json")
    expect((await act(platform.url, "write-state", planted)).body.outcome).toBe("refused: ERR_ACCESS_DENIED")
    expect(existsSync(planted)).toBe(false)
    expect((await act(platform.url, "read-file", "/etc/hostname")).body.outcome).toBe("refused: ERR_ACCESS_DENIED")
    const record = readdirSync(join(platform.stateDir, "apps"))[0]!
    expect((await act(platform.url, "read-file", join(platform.stateDir, "apps", record))).body.outcome).toBe(
      "refused: ERR_ACCESS_DENIED"
    )
  })

  it("lets an app start no process and no thread, and not signal the platform", async () => {
    expect((await act(platform.url, "spawn")).body.outcome).toBe("refused: ERR_ACCESS_DENIED")
    expect((await act(platform.url, "thread")).body.outcome).toMatch(/^refused: /)
    expect((await act(platform.url, "kill-parent")).body.outcome).toBe("refused: EPERM")
    await stillServing()
  })

  it.each([["exit"], ["kill-self"], ["hoard-off-heap"], ["hoard-heap"]])(
    "survives an app that does %s: that request fails clearly, other apps and later requests are served",
    async (action) => {
      const inFlight = invoke(platform.url, "hello", JSON.stringify({ name: "Bo" }))
      const { status, body } = await act(platform.url, action)
      expect([500, 503]).toContain(status)
      expect(body.error?.code).toBeDefined()
      expect((await inFlight).status).toBe(200)
      await stillServing()
      await eventually(async () => ((await act(platform.url, "read-env")).status === 200 ? true : undefined))
      expect(await appState(platform.url, "hostile")).toBe("ready")
    },
    120_000
  )

  it("restarts an app whose request spins, although its client has gone away", async () => {
    const client = new AbortController()
    const spinning = invoke(platform.url, "hostile", JSON.stringify({ action: "spin" }))
    void fetch(`${platform.url}/app/invoke/hostile`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ action: "spin" }),
      signal: client.signal
    }).catch(() => undefined)
    await new Promise((resolve) => setTimeout(resolve, 200))
    client.abort()
    expect([500, 503]).toContain((await spinning).status)
    await eventually(async () => ((await act(platform.url, "read-env")).status === 200 ? true : undefined))
    await stillServing()
  }, 60_000)

  it("answers 500 for a thrown Proxy or an object whose toString throws, for that request only", async () => {
    for (const action of ["throw-proxy", "throw-bad-to-string"]) {
      const { status, body } = await act(platform.url, action)
      expect(status).toBe(500)
      expect(body.error?.code).toBe("AppFailed")
    }
    expect((await act(platform.url, "read-env")).status).toBe(200)
  })

  it("refuses at registration an app whose top-level code kills processes, and keeps serving", async () => {
    const registered = await registerRaw(
      platform.url,
      { name: "top_level", source: fixture("hostile_top_level") },
      token
    )
    expect(registered.status).toBe(400)
    expect(JSON.parse(registered.text).error.message).toContain("kill EPERM")
    await stillServing()
  })
})
