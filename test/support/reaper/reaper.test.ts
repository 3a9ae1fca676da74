import { type ChildProcess, execFileSync, spawn } from "node:child_process"
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterEach, describe, expect, it } from "vitest"
import { netnsAvailable } from "../netns.js"
import { eventually, isAlive, repoRoot } from "../platform.js"
import { reaperEnv } from "./registry.js"

/**
 * The acceptance of the test run's reaper, with the real runner: a nested `npx vitest run` of
 * test/fixtures/reaper/ starts a platform (serve and its sidecar, which makes an arena file in
 * /dev/shm) and a network namespace with a process in it; once they are up, the runner is killed
 * with SIGKILL, and within 5 s none of its processes, namespaces, /dev/shm files and directories
 * may remain. Two ways to kill it: vitest itself, and npx above it (as `npm test` is killed). And
 * the issue's case: the fixture's afterAll times out, its worker ends, and what it left is gone
 * within 5 s while the run goes on.
 */

interface Ready {
  /** The nested vitest's main process. */
  readonly runner: number
  /** Its worker, the platform and its descendants, the process in the namespace. */
  readonly pids: ReadonlyArray<number>
  /** `cn<worker pid>x`: the names of the namespaces (and the uplink) the fixture made; null without root. */
  readonly namespacePrefix: string | null
  readonly sharedMemory: ReadonlyArray<string>
  readonly stateDir: string
  readonly runId: string
  readonly reaperDir: string
}

const fixtureConfig = "test/fixtures/reaper/vitest.config.ts"
/** The acceptance's bound. */
const reapedWithinMs = 5_000
/** Starting a platform on a loaded machine is slow; this only bounds the wait for the fixture. */
const readyWithinMs = 120_000

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/** Processes whose environment names the nested run, or whose command line names its reaper's directory. */
const processesOfRun = (ready: Ready) =>
  readdirSync("/proc")
    .filter((entry) => /^\d+$/.test(entry) && Number(entry) !== process.pid)
    .filter((entry) => {
      try {
        const environ = `\0${readFileSync(`/proc/${entry}/environ`, "latin1")}`
        const cmdline = readFileSync(`/proc/${entry}/cmdline`, "latin1")
        return (
          isAlive(Number(entry)) &&
          (environ.includes(`\0${reaperEnv.run}=${ready.runId}\0`) || cmdline.includes(ready.reaperDir))
        )
      } catch {
        return false
      }
    })
    .map(Number)

/** The running (not zombie) processes of a process group. */
const membersOf = (group: number) =>
  readdirSync("/proc")
    .filter((entry) => /^\d+$/.test(entry))
    .filter((entry) => {
      try {
        const stat = readFileSync(`/proc/${entry}/stat`, "utf8")
        return Number(stat.slice(stat.lastIndexOf(") ") + 2).split(" ")[2]) === group && isAlive(Number(entry))
      } catch {
        return false
      }
    })
    .map(Number)

/** Names of network namespaces (`ip netns list`: "NAME (id: N)") and of links (`ip -o link show`: "N: NAME@PEER: ..."). */
const namespaceNames = () =>
  execFileSync("ip", ["netns", "list"], { encoding: "utf8" })
    .split("\n")
    .map((line) => line.split(" ")[0]!)
    .filter((name) => name !== "")
const linkNames = () =>
  execFileSync("ip", ["-o", "link", "show"], { encoding: "utf8" })
    .split("\n")
    .map((line) => /^\d+: ([^@:\s]+)/.exec(line)?.[1] ?? "")
    .filter((name) => name !== "")

/**
 * What of the nested run is left: empty once the reaper did its work. With `group`, the whole run
 * (vitest, npx and the reaper included); without, what the platform fixture's worker made.
 */
const leftovers = (run: NestedRun, group?: number) => {
  const { ready } = run
  const left: Array<string> = []
  for (const pid of ready.pids) if (isAlive(pid)) left.push(`process ${pid}`)
  if (group !== undefined) {
    if (isAlive(ready.runner)) left.push(`vitest ${ready.runner}`)
    for (const pid of processesOfRun(ready)) left.push(`process ${pid} of the run`)
    for (const pid of membersOf(group)) left.push(`process ${pid} of group ${group} (npx, vitest, its workers)`)
    if (existsSync(ready.reaperDir)) left.push(`reaper directory ${ready.reaperDir}`)
  }
  const runDirs = new Set(ready.pids.map((pid) => `cornserve-node-${pid}-`))
  for (const name of readdirSync(run.tmp))
    if ([...runDirs].some((prefix) => name.startsWith(prefix))) left.push(`run directory ${name}`)
  for (const name of ready.sharedMemory) if (existsSync(join("/dev/shm", name))) left.push(`/dev/shm/${name}`)
  if (ready.namespacePrefix !== null) {
    const prefix = ready.namespacePrefix
    for (const name of namespaceNames()) if (name.startsWith(prefix)) left.push(`namespace ${name}`)
    for (const name of linkNames()) if (name.startsWith(prefix)) left.push(`link ${name}`)
  }
  if (existsSync(ready.stateDir)) left.push(`state directory ${ready.stateDir}`)
  return left
}

/** The fixture's ready file, once it is there and whole. */
const readReady = (file: string): Ready | undefined => {
  try {
    return JSON.parse(readFileSync(file, "utf8")) as Ready
  } catch {
    return undefined
  }
}

interface NestedRun {
  readonly child: ChildProcess
  readonly ready: Ready
  /** The run's TMPDIR: a killed vitest leaves its own transform cache there, which is not the reaper's to know. */
  readonly tmp: string
  output(): string
}

const started: Array<{ child: ChildProcess; tmp: string; ready?: Ready }> = []

/**
 * Starts `npx vitest run` on the fixtures (`filter`: only those whose names hold it), in a process
 * group of its own, and waits until the platform fixture is ready.
 */
const startNestedRun = async (filter?: string, mode: "wait" | "time-out" = "wait"): Promise<NestedRun> => {
  const dir = mkdtempSync(join(tmpdir(), "cornserve-reaper-ready-"))
  const readyFile = join(dir, "ready.json")
  const tmp = mkdtempSync(join(tmpdir(), "cornserve-reaper-tmp-"))
  const child = spawn("npx", ["vitest", "run", "--config", fixtureConfig, ...(filter === undefined ? [] : [filter])], {
    cwd: repoRoot,
    env: { ...process.env, TMPDIR: tmp, REAPER_FIXTURE_READY: readyFile, REAPER_FIXTURE_MODE: mode },
    stdio: ["ignore", "pipe", "pipe"],
    detached: true
  })
  const entry: { child: ChildProcess; tmp: string; ready?: Ready } = { child, tmp }
  started.push(entry)
  let output = ""
  child.stdout!.on("data", (chunk: Buffer) => (output += chunk.toString()))
  child.stderr!.on("data", (chunk: Buffer) => (output += chunk.toString()))
  const deadline = Date.now() + readyWithinMs
  try {
    for (;;) {
      const ready = readReady(readyFile)
      if (ready !== undefined) {
        entry.ready = ready
        return { child, ready, tmp, output: () => output }
      }
      if (child.exitCode !== null || child.signalCode !== null)
        throw new Error(`the nested run ended (${child.exitCode ?? child.signalCode}) before it was ready:\n${output}`)
      if (Date.now() > deadline) throw new Error(`the nested run was not ready within ${readyWithinMs} ms:\n${output}`)
      await sleep(100)
    }
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}

/** Polls until nothing is left, at most `reapedWithinMs` after the kill; returns what is left then. */
const leftAfterKill = async (run: NestedRun, killedAt: number, whole = true) => {
  for (;;) {
    const left = leftovers(run, whole ? run.child.pid! : undefined)
    if (left.length === 0 || Date.now() - killedAt > reapedWithinMs) return left
    await sleep(100)
  }
}

afterEach(() => {
  // The run's TMPDIR goes; and, only when the reaper failed, what the nested run left is ended by hand.
  for (const { child, tmp, ready } of started.splice(0)) {
    try {
      process.kill(-child.pid!, "SIGKILL")
    } catch {}
    rmSync(tmp, { recursive: true, force: true })
    if (ready === undefined) continue
    for (const pid of [ready.runner, ...ready.pids, ...processesOfRun(ready)])
      try {
        process.kill(pid, "SIGKILL")
      } catch {}
    for (const name of ready.sharedMemory) rmSync(join("/dev/shm", name), { force: true })
    const prefix = ready.namespacePrefix
    if (prefix !== null) {
      const ipQuietly = (args: ReadonlyArray<string>) => {
        try {
          execFileSync("ip", args, { stdio: "ignore" })
        } catch {}
      }
      for (const name of namespaceNames()) if (name.startsWith(prefix)) ipQuietly(["netns", "del", name])
      for (const name of linkNames()) if (name.startsWith(prefix)) ipQuietly(["link", "del", name])
    }
    rmSync(ready.stateDir, { recursive: true, force: true })
    rmSync(ready.reaperDir, { recursive: true, force: true })
  }
})

describe("the test run's reaper", () => {
  it("ends the platform, namespace and /dev/shm files of a run whose vitest is SIGKILLed", {
    timeout: 180_000
  }, async () => {
    const run = await startNestedRun("platform")
    expect(run.ready.namespacePrefix !== null).toBe(netnsAvailable())
    expect(leftovers(run, run.child.pid!).length).toBeGreaterThan(0)
    process.kill(run.ready.runner, "SIGKILL")
    const left = await leftAfterKill(run, Date.now())
    expect(left, run.output()).toEqual([])
  })

  it("does the same when npx, which started vitest, is SIGKILLed", { timeout: 180_000 }, async () => {
    const run = await startNestedRun("platform")
    process.kill(run.child.pid!, "SIGKILL")
    const left = await leftAfterKill(run, Date.now())
    expect(left, run.output()).toEqual([])
  })

  it("ends what a worker made once that worker is gone, its afterAll timed out, while the run goes on", {
    timeout: 180_000
  }, async () => {
    const run = await startNestedRun(undefined, "time-out")
    const [worker] = run.ready.pids
    // The afterAll that was to stop the platform times out after 1 s; then the worker is ended.
    const workerGone = await eventually(async () => (isAlive(worker!) ? undefined : Date.now()), 60_000)
    const left = await leftAfterKill(run, workerGone, false)
    expect(left, run.output()).toEqual([])
    // The run went on (the other fixture keeps it going): the reaper ended the worker's alone.
    expect(isAlive(run.ready.runner), run.output()).toBe(true)
    process.kill(run.ready.runner, "SIGKILL")
    expect(await leftAfterKill(run, Date.now()), run.output()).toEqual([])
  })
})
