import { spawnSync } from "node:child_process"
import { readFileSync, readlinkSync, readdirSync, writeFileSync } from "node:fs"
import { createServer, type Server } from "node:net"
import { getPriority, networkInterfaces } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  adminHeaders,
  runCli,
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

const fixture = (name: string) => readFileSync(join(repoRoot, "test", "fixtures", "apps", `${name}.ts`), "utf8")
const helloSource = readFileSync(join(repoRoot, "examples", "hello.ts"), "utf8")
const helloAnswer = { greeting: "Hello, Ada! Cornserve is serving you." }

const root = process.getuid?.() === 0
/** Whether this machine lets the platform give an app's process a network namespace, as `serve` finds out. */
const namespaces =
  spawnSync("unshare", [...(root ? ["--net"] : ["--user", "--net"]), "--", process.execPath, "--version"]).status === 0
/** The whole boundary: a namespace of its own, and a user of its own (which only root can hand out). */
const sandboxed = root && namespaces

const withoutNetns = "apps run without a network namespace"
const asPlatformUser = "apps run as the platform's own user"

const register = async (platform: RunningPlatform, name: string, source: string) =>
  expect((await registerRaw(platform.url, { name, source })).text).toContain("event: final")

const call = async (platform: RunningPlatform, appId: string, body: unknown) => {
  const response = await invoke(platform.url, appId, JSON.stringify(body))
  return { status: response.status, body: (await response.json()) as Record<string, unknown> }
}

const stillServing = async (platform: RunningPlatform) => {
  expect(platform.process.exitCode).toBeNull()
  expect(await call(platform, "hello", { name: "Ada" })).toEqual({ status: 200, body: helloAnswer })
}

/** The app processes of the platform: its children that run the driver's worker. */
const appProcesses = (platform: RunningPlatform) =>
  childPids(platform.process.pid!).filter((pid) => {
    try {
      return readFileSync(`/proc/${pid}/cmdline`, "utf8").includes("worker.js")
    } catch {
      return false
    }
  })

const uidOf = (pid: number) => Number(/^Uid:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"))![1])

/** Where each fd of a process leads (`pipe:[123]`, a path), by fd. */
const fdTargets = (pid: number) =>
  new Map(readdirSync(`/proc/${pid}/fd`).map((fd) => [Number(fd), readlinkSync(`/proc/${pid}/fd/${fd}`)]))

/** An address of this machine's other than loopback, if it has one. */
const hostAddress = () =>
  Object.values(networkInterfaces())
    .flat()
    .find((address) => address !== undefined && !address.internal && address.family === "IPv4")?.address

const occurrences = (text: string, part: string) => text.split(part).length - 1

describe("an app's process runs inside the operating system's boundary", () => {
  let platform: RunningPlatform
  /** A server on every address of this machine's, to tell whether an app's connection reaches it. */
  let bystander: Server
  let bystanderPort = 0
  let bystanderConnections = 0

  beforeAll(async () => {
    bystander = createServer((socket) => {
      bystanderConnections++
      socket.destroy()
    })
    await new Promise<void>((resolve) => bystander.listen(0, "0.0.0.0", resolve))
    bystanderPort = (bystander.address() as { port: number }).port
    platform = await startPlatform({ args: ["--devices", "cpu:0"] })
    await register(platform, "hello", helloSource)
    await register(platform, "sandbox_escape", fixture("sandbox_escape"))
    await register(platform, "sandbox_flood", fixture("sandbox_flood"))
  }, 120_000)

  afterAll(async () => {
    await platform?.stop()
    if (platform !== undefined) await removeStateDir(platform.stateDir)
    await new Promise((resolve) => bystander?.close(resolve))
  })

  it("says at start what the machine leaves unprotected, once, and nothing where the boundary is whole", () => {
    const output = platform.output()
    if (sandboxed) {
      expect(output).not.toContain(withoutNetns)
      expect(output).not.toContain(asPlatformUser)
      return
    }
    // Without root or namespaces the platform cannot keep apps in: it must say so, and what is left open.
    if (!namespaces) {
      expect(occurrences(output, withoutNetns)).toBe(1)
      expect(output).toContain("the platform's gateway (its admin routes included)")
    }
    if (!root) {
      expect(occurrences(output, asPlatformUser)).toBe(1)
      expect(output).toContain("can change the priority of the platform's processes")
    }
  })

  it.runIf(namespaces)(
    "has no network: the gateway's admin routes and every port of the machine are out of reach",
    async () => {
      const outcome = async (body: unknown) => (await call(platform, "sandbox_escape", body)).body.outcome as string
      expect(
        await outcome({ action: "fetch", url: `${platform.url}/app/register` }),
        "registering an app through the admin route"
      ).toMatch(/^refused: /)
      const gatewayPort = Number(new URL(platform.url).port)
      expect(await outcome({ action: "connect", host: "127.0.0.1", port: gatewayPort })).toMatch(/^refused: /)
      expect(await outcome({ action: "connect", host: "127.0.0.1", port: bystanderPort })).toMatch(/^refused: /)
      const address = hostAddress()
      if (address !== undefined) {
        expect(await outcome({ action: "connect", host: address, port: bystanderPort })).toMatch(/^refused: /)
      }
      expect(bystanderConnections).toBe(0)
      expect(await appState(platform.url, "planted")).toBeUndefined()
      const { body } = await call(platform, "sandbox_escape", { action: "whoami" })
      expect(body.interfaces, "a namespace of its own has no interface with an address").toEqual([])
      await stillServing(platform)
    },
    60_000
  )

  it.runIf(sandboxed)(
    "runs as a user of its own: it cannot lower the platform's priority",
    async () => {
      const platformPid = platform.process.pid!
      const before = getPriority(platformPid)
      const { body } = await call(platform, "sandbox_escape", { action: "whoami" })
      expect(body.ppid, "the app knows the platform's pid").toBe(platformPid)
      expect(body.uid).not.toBe(0)
      const reniced = await call(platform, "sandbox_escape", { action: "renice", pid: platformPid })
      expect(reniced.body.outcome).toMatch(/^refused: /)
      expect(getPriority(platformPid)).toBe(before)
      // Nor another app's: each process has a user of its own.
      const uids = appProcesses(platform).map(uidOf)
      expect(uids.length).toBeGreaterThanOrEqual(3)
      expect(new Set(uids).size).toBe(uids.length)
      await stillServing(platform)
    },
    60_000
  )

  it.runIf(sandboxed)(
    "cannot read a secret of the platform's state directory, even past Node's permission model",
    async () => {
      const secretPath = join(platform.stateDir, "admin-token")
      writeFileSync(secretPath, "the-admin-token\n", { mode: 0o600 })
      const read = await call(platform, "sandbox_escape", { action: "read-file", path: secretPath })
      expect(read.body.outcome).toMatch(/^refused: /)
      // The operating system's own answer to the app's user: no code it runs could read the file.
      const { body } = await call(platform, "sandbox_escape", { action: "whoami" })
      const uid = body.uid as number
      const asApp = spawnSync("cat", [secretPath], { uid, gid: uid, encoding: "utf8" })
      expect(asApp.status).not.toBe(0)
      expect(asApp.stderr).toContain("Permission denied")
      expect(asApp.stdout).not.toContain("the-admin-token")
      await stillServing(platform)
    },
    60_000
  )

  it("holds no fd of the platform's: its stdout and stderr are channels of its own", async () => {
    const platformOutput = fdTargets(platform.process.pid!)
    const platformStreams = new Set([platformOutput.get(1), platformOutput.get(2)])
    const apps = appProcesses(platform)
    expect(apps.length).toBeGreaterThanOrEqual(3)
    for (const pid of apps) {
      const fds = fdTargets(pid)
      // Node's pipes to a child are socket pairs: nothing a file's length can be cut through.
      expect(fds.get(1)).toMatch(/^(pipe|socket):/)
      expect(fds.get(2)).toMatch(/^(pipe|socket):/)
      for (const target of fds.values()) expect(platformStreams.has(target)).toBe(false)
    }
  })

  it("writes megabytes to a bounded log of its own: lines marked as the app's, at a bounded rate", async () => {
    const before = platform.output().length
    const megabytes = 8
    const flood = await call(platform, "sandbox_flood", { megabytes })
    expect(flood.status).toBe(200)
    await stillServing(platform)
    // Lines over the rate are counted and the count is said, marked as the app's like its lines.
    await eventually(async () => (platform.output().slice(before).includes("[app sandbox_flood] (") ? true : undefined))
    const shown = platform.output().slice(before)
    expect(shown.length).toBeLessThan((megabytes * 1024 * 1024) / 8)
    expect(shown).toMatch(/\[app sandbox_flood\] \(\d+ more line\(s\) not shown here/)
    const lines = shown.split("\n")
    // What the app wrote never reads as the platform's: every line of it is marked, and cut short.
    const appLines = lines.filter((line) => /flood x|forged|yyyy|harmless/.test(line))
    expect(appLines.length).toBeGreaterThan(0)
    for (const line of appLines) {
      expect(line.startsWith("[app sandbox_flood] ")).toBe(true)
      expect(line.length).toBeLessThan(2_100)
    }
    expect(lines.some((line) => line.startsWith("cornserve: serving at http://forged"))).toBe(false)
    expect(lines.some((line) => line.startsWith("timestamp=2000-01-01"))).toBe(false)
    // No terminal escape or carriage return of the app's reaches the platform's log as it is.
    expect(shown).not.toContain("\u001b")
    expect(shown).not.toContain("\r")
    expect(shown).toContain("harmless\\u000d\\u001b[2Kcornserve: ready")
    // The app's own log keeps its last 64 KiB, for the admin: over HTTP and by the CLI.
    const logs = await eventually(async () => {
      const response = await fetch(`${platform.url}/app/logs/sandbox_flood`, { headers: adminHeaders() })
      const text = await response.text()
      // Full once the flood is in: its stdout and stderr arrive side by side, so which line is last varies.
      return text.length > 60 * 1024 ? { status: response.status, text } : undefined
    })
    expect(logs.status).toBe(200)
    expect(logs.text.length).toBeLessThanOrEqual(64 * 1024)
    expect(logs.text).toMatch(/flood x+\n/)
    expect((await fetch(`${platform.url}/app/logs/sandbox_flood`)).status).toBe(401)
    expect((await fetch(`${platform.url}/app/logs/nobody`, { headers: adminHeaders() })).status).toBe(404)
    const cli = await runCli(["app", "logs", "sandbox_flood"], { CORNSERVE_GATEWAY_URL: platform.url })
    expect(cli.code, cli.stderr).toBe(0)
    expect(cli.stdout).toMatch(/flood x+\n/)
  }, 120_000)
})

describe.runIf(root)("where unshare(1) cannot be found", () => {
  let platform: RunningPlatform

  beforeAll(async () => {
    platform = await startPlatform({ args: ["--devices", "cpu:0"], env: { PATH: "/nonexistent" } })
    await register(platform, "hello", helloSource)
    await register(platform, "sandbox_escape", fixture("sandbox_escape"))
  }, 120_000)

  afterAll(async () => {
    await platform?.stop()
    if (platform !== undefined) await removeStateDir(platform.stateDir)
  })

  it("says once at start that apps have the network, and still runs them as users of their own", async () => {
    const output = platform.output()
    expect(occurrences(output, withoutNetns)).toBe(1)
    expect(output).toContain("unshare(1) from util-linux is not installed")
    expect(output).toContain("the platform's gateway (its admin routes included)")
    const { body } = await call(platform, "sandbox_escape", { action: "whoami" })
    expect(body.uid).not.toBe(0)
    const platformPid = platform.process.pid!
    const before = getPriority(platformPid)
    const reniced = await call(platform, "sandbox_escape", { action: "renice", pid: platformPid })
    expect(reniced.body.outcome).toMatch(/^refused: /)
    expect(getPriority(platformPid)).toBe(before)
    await stillServing(platform)
  }, 60_000)
})
