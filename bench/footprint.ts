/**
 * Footprint: what `npm start` (`cornserve serve --examples`) costs, and whether it leaves anything
 * behind when a terminal's Ctrl-C stops it.
 *
 * Starts the real binary with every example app on a fresh state directory, in a process group of
 * its own, and times it to its "ready" line. Then it reads the platform's footprint
 * (src/metrics/Footprint.ts: the PSS of every process below `serve`, shared memory counted once by
 * the /dev/shm files the processes made), by role, and sends each example the request the platform
 * prints for it (the README's), twice: the first call after ready and a warm one. Where `serve`
 * has `--idle-release`, the platform runs with BENCH_IDLE_RELEASE_S (default 30) and, once the
 * examples' executors have been released, each example is called again: its cold start. Last, the
 * whole group gets SIGINT, as a terminal's Ctrl-C sends it, and the bench lists the processes,
 * /dev/shm files and /tmp entries of the platform's processes that are left (named after their
 * pid, as the platform names them), which must be none.
 *
 * Targets (the issue on resources): at most 1 GiB with /dev/shm, ready within 30 s on a quiet
 * 2-core machine, a tiny model's cold start within 2 s, nothing left after the stop.
 *
 * Prints a table per part, then (as the last line) one JSON object with the figures and their
 * ratios to the targets.
 *
 * After the calls it measures what the platform's processes use of a core while nothing calls them
 * (BENCH_IDLE_SETTLE_S after the last call, for BENCH_IDLE_WINDOW_S), by role, beside a bare Node
 * process with one timer measured in the same window.
 *
 * Env: BENCH_IDLE_RELEASE_S (default 30), BENCH_READY_TIMEOUT_S (default 900), BENCH_IDLE_SETTLE_S
 * (default 10), BENCH_IDLE_WINDOW_S (default 15).
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process"
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { performance } from "node:perf_hooks"
import { setTimeout as sleep } from "node:timers/promises"
import { footprintBytes, measureFootprint, processPss, processTree } from "../src/metrics/Footprint.js"
import { cpuSeconds } from "./support/processes.js"

const TARGET = { bytes: 2 ** 30, readyS: 30, coldS: 2 } as const
const MiB = 2 ** 20
const binPath = join(process.cwd(), "bin", "cornserve")

const envNumber = (name: string, fallback: number): number => {
  const raw = process.env[name]
  if (raw === undefined || raw === "") return fallback
  const value = Number(raw)
  if (!Number.isFinite(value) || value < 0) throw new Error(`${name} must be a number >= 0, got ${raw}`)
  return value
}

const table = (header: ReadonlyArray<string>, rows: ReadonlyArray<ReadonlyArray<string | number>>) => {
  const cells = [header, ...rows.map((row) => row.map(String))]
  const widths = header.map((_, column) => Math.max(...cells.map((row) => row[column]!.length)))
  for (const row of cells) console.log(row.map((cell, column) => cell.padEnd(widths[column]!)).join("  "))
}

const mib = (bytes: number) => Math.round(bytes / MiB)
const seconds = (ms: number) => Math.round(ms) / 1000

/** A process's role, from its command line. */
const roleOf = (pid: number): string => {
  let args: Array<string>
  try {
    args = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0")
  } catch {
    return "gone"
  }
  const line = args.join(" ")
  if (line.includes("--experimental-permission")) return "app"
  const at = args.findIndex((arg) => arg.endsWith("bin/cornserve"))
  if (at < 0) return args[0]?.split("/").at(-1) ?? "?"
  const [command, sub] = args.slice(at + 1)
  if (command === "serve") return "serve"
  if (command === "internal" && sub === "executor") return "executor router"
  if (command === "internal" && sub === "executor-worker") return "executor worker"
  return [command, sub].filter(Boolean).join(" ")
}

const pssByRole = (root: number) => {
  const roles = new Map<string, { count: number; bytes: number }>()
  for (const pid of processTree(root)) {
    const role = roleOf(pid)
    const entry = roles.get(role) ?? { count: 0, bytes: 0 }
    const pss = processPss(pid)
    roles.set(role, { count: entry.count + 1, bytes: entry.bytes + (typeof pss === "number" ? pss : 0) })
  }
  return roles
}

/** The example requests `serve` prints once its apps are ready: app id, URL and JSON body. */
const exampleRequests = (output: string) => {
  const requests: Array<{ app: string; url: string; body: string }> = []
  const pattern = /curl -s (\S+\/app\/invoke\/(\S+)) -H 'content-type: application\/json' -d '((?:[^']|'\\'')*)'$/gm
  for (const match of output.matchAll(pattern)) {
    requests.push({ app: match[2]!, url: match[1]!, body: match[3]!.replaceAll("'\\''", "'") })
  }
  return requests
}

interface Outcome {
  readonly ms: number
  readonly status: number | string
}

const call = async (request: { url: string; body: string }): Promise<Outcome> => {
  const started = performance.now()
  try {
    const response = await fetch(request.url, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: request.body,
      signal: AbortSignal.timeout(300_000)
    })
    await response.arrayBuffer()
    return { ms: performance.now() - started, status: response.status }
  } catch (error) {
    return { ms: performance.now() - started, status: String((error as Error).name) }
  }
}

/** Every pid seen below the root, kept: processes it started, and theirs, even once reparented. */
class Lineage {
  readonly seen = new Set<number>()
  constructor(root: number) {
    this.seen.add(root)
  }
  sample(): void {
    let grew = true
    const parents = new Map<number, number>()
    for (const name of readdirSync("/proc")) {
      if (!/^\d+$/.test(name)) continue
      try {
        const stat = readFileSync(`/proc/${name}/stat`, "utf8")
        parents.set(Number(name), Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]))
      } catch {
        // Gone since it was listed.
      }
    }
    while (grew) {
      grew = false
      for (const [pid, parent] of parents) {
        if (!this.seen.has(pid) && this.seen.has(parent)) {
          this.seen.add(pid)
          grew = true
        }
      }
    }
  }
  alive(): Array<number> {
    return [...this.seen].filter((pid) => {
      try {
        const stat = readFileSync(`/proc/${pid}/stat`, "utf8")
        return stat.slice(stat.lastIndexOf(")") + 2)[0] !== "Z"
      } catch {
        return false
      }
    })
  }
  /** Entries of `dir` named after a pid seen (`…-<pid>` or `…-<pid>-…`). */
  filesIn(dir: string): Array<string> {
    return readdirSync(dir).filter((name) =>
      [...name.matchAll(/-(\d+)(?=-|$)/g)].some((match) => this.seen.has(Number(match[1])))
    )
  }
}

/**
 * What the platform's processes use of a core while nothing calls them, by role, over `windowMs`;
 * beside it, in the same window, a bare Node process with one timer (the floor of any process).
 */
const idleCpu = async (root: number, windowMs: number) => {
  const bare = spawn(process.execPath, ["-e", "setInterval(() => {}, 1 << 30)"], { stdio: "ignore" })
  await sleep(1_000)
  const pids = [...processTree(root), bare.pid!]
  const before = new Map(pids.map((pid) => [pid, cpuSeconds(pid)]))
  const started = performance.now()
  await sleep(windowMs)
  const seconds = (performance.now() - started) / 1000
  const byRole = new Map<string, { count: number; cpuS: number }>()
  let gone = 0
  for (const pid of pids) {
    const [from, to] = [before.get(pid), cpuSeconds(pid)]
    if (from === undefined || to === undefined) {
      gone++
      continue
    }
    const role = pid === bare.pid ? "bare node (baseline)" : roleOf(pid)
    const entry = byRole.get(role) ?? { count: 0, cpuS: 0 }
    byRole.set(role, { count: entry.count + 1, cpuS: entry.cpuS + (to - from) })
  }
  bare.kill()
  const platform = [...byRole].filter(([role]) => role !== "bare node (baseline)")
  const count = platform.reduce((sum, [, entry]) => sum + entry.count, 0)
  const cpuS = platform.reduce((sum, [, entry]) => sum + entry.cpuS, 0)
  const bareShare = (byRole.get("bare node (baseline)")?.cpuS ?? 0) / seconds
  return { seconds, byRole, gone, count, share: cpuS / seconds, bareShare }
}

const waitForExit = (child: ChildProcess, timeoutMs: number) =>
  new Promise<boolean>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve(true)
    const timer = setTimeout(() => resolve(false), timeoutMs)
    child.once("exit", () => {
      clearTimeout(timer)
      resolve(true)
    })
  })

export default async function footprint() {
  const idleReleaseS = envNumber("BENCH_IDLE_RELEASE_S", 30)
  const readyTimeoutMs = envNumber("BENCH_READY_TIMEOUT_S", 900) * 1000
  const idleSettleMs = envNumber("BENCH_IDLE_SETTLE_S", 10) * 1000
  const idleWindowMs = envNumber("BENCH_IDLE_WINDOW_S", 15) * 1000
  const help = execFileSync(process.execPath, [binPath, "serve", "--help"], { encoding: "utf8" })
  const idleRelease = help.includes("--idle-release")
  const stateDir = mkdtempSync(join(tmpdir(), "cornserve-bench-footprint-"))
  const args = [binPath, "serve", "--examples", "--port", "0", "--state-dir", stateDir]
  if (idleRelease) args.push("--idle-release", String(idleReleaseS))

  const started = performance.now()
  const child = spawn(process.execPath, args, { stdio: ["ignore", "pipe", "pipe"], detached: true })
  const lineage = new Lineage(child.pid!)
  const sampler = setInterval(() => lineage.sample(), 100)
  let output = ""
  const readyMs = await new Promise<number>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`not ready within ${readyTimeoutMs} ms:\n${output}`)),
      readyTimeoutMs
    )
    const onData = (chunk: Buffer) => {
      output += chunk.toString()
      if (/^cornserve: ready/m.test(output)) {
        clearTimeout(timer)
        resolve(performance.now() - started)
      }
    }
    child.stdout!.on("data", onData)
    child.stderr!.on("data", onData)
    child.once("exit", (code) => reject(new Error(`serve exited with ${code} before ready:\n${output}`)))
  })
  const atReady = measureFootprint(child.pid!)
  const roles = pssByRole(child.pid!)
  const printed = /^cornserve: the platform holds .*$/m.exec(output)?.[0]

  const requests = exampleRequests(output)
  const calls: Array<{ app: string; first: Outcome; warm?: Outcome; cold?: Outcome }> = []
  // The warm call right after the first: with idle release on, a task idle for longer than its time
  // (the other examples' calls) would be released again, and its second call a cold one.
  for (const request of requests) {
    const first = await call(request)
    calls.push({ app: request.app, first, warm: await call(request) })
  }
  const afterCalls = measureFootprint(child.pid!)
  const rolesAfterCalls = pssByRole(child.pid!)
  // Idle: the calls' work has ended, and (with the default idle release) no executor has gone yet.
  await sleep(idleSettleMs)
  const idle = await idleCpu(child.pid!, idleWindowMs)

  let released: ReturnType<typeof measureFootprint> | undefined
  if (idleRelease) {
    const executorsLeft = () => processTree(child.pid!).filter((pid) => roleOf(pid).startsWith("executor")).length
    const deadline = performance.now() + 3 * idleReleaseS * 1000 + 60_000
    while (executorsLeft() > 0 && performance.now() < deadline) await sleep(500)
    released = measureFootprint(child.pid!)
    for (const [index, request] of requests.entries()) calls[index]!.cold = await call(request)
  }

  lineage.sample()
  const stopStarted = performance.now()
  process.kill(-child.pid!, "SIGINT")
  const exited = await waitForExit(child, 30_000)
  const stopMs = performance.now() - stopStarted
  // What the group's processes started keeps going down for a moment: wait for the last of them (10 s at most).
  const allGoneBy = performance.now() + 10_000
  while (lineage.alive().length > 0 && performance.now() < allGoneBy) await sleep(100)
  clearInterval(sampler)
  const leftProcesses = lineage.alive()
  const leftShm = lineage.filesIn("/dev/shm")
  const leftTmp = lineage.filesIn(tmpdir()).filter((name) => join(tmpdir(), name) !== stateDir)
  // Whatever is left is cleared so that the next run starts clean; the report says it was left.
  for (const pid of leftProcesses) {
    try {
      process.kill(pid, "SIGKILL")
    } catch {
      // Gone meanwhile.
    }
  }
  for (const name of leftShm) rmSync(join("/dev/shm", name), { force: true })
  for (const name of leftTmp) rmSync(join(tmpdir(), name), { recursive: true, force: true })
  rmSync(stateDir, { recursive: true, force: true })

  console.log(
    `\nserve --examples${idleRelease ? ` --idle-release ${idleReleaseS}` : ""}: ready in ${seconds(readyMs)} s`
  )
  if (printed !== undefined) console.log(`it printed: ${printed}`)
  const roleTable = (
    when: string,
    byRole: ReturnType<typeof pssByRole>,
    footprint: ReturnType<typeof measureFootprint>
  ) => {
    console.log(`\nMemory by role ${when} (PSS without shared memory; /dev/shm by file)`)
    table(
      ["role", "processes", "MiB", "MiB each"],
      [
        ...[...byRole.entries()]
          .sort((a, b) => b[1].bytes - a[1].bytes)
          .map(([role, { count, bytes }]) => [role, count, mib(bytes), mib(bytes / count)]),
        ["/dev/shm", footprint.sharedMemoryFiles, mib(footprint.sharedMemoryBytes), ""],
        ["total", footprint.processes, mib(footprintBytes(footprint)), ""]
      ]
    )
  }
  roleTable("at ready", roles, atReady)
  roleTable("after the calls", rolesAfterCalls, afterCalls)
  console.log("\nFootprint")
  const footprintRow = (name: string, footprint: ReturnType<typeof measureFootprint>) => [
    name,
    footprint.processes,
    mib(footprint.processBytes),
    mib(footprint.sharedMemoryBytes),
    mib(footprintBytes(footprint))
  ]
  table(
    ["when", "processes", "process MiB", "/dev/shm MiB", "total MiB"],
    [
      footprintRow("ready", atReady),
      footprintRow("after the calls", afterCalls),
      ...(released === undefined ? [] : [footprintRow("executors released", released)])
    ]
  )
  const percent = (share: number) => Math.round(share * 1000) / 10
  console.log(
    `\nIdle CPU after the calls (% of one core over ${Math.round(idle.seconds)} s; ${idle.gone} processes went meanwhile)`
  )
  table(
    ["role", "processes", "% of a core", "% each"],
    [
      ...[...idle.byRole.entries()]
        .sort((a, b) => b[1].cpuS - a[1].cpuS)
        .map(([role, { count, cpuS }]) => [
          role,
          count,
          percent(cpuS / idle.seconds),
          percent(cpuS / idle.seconds / count)
        ]),
      ["platform", idle.count, percent(idle.share), percent(idle.share / Math.max(1, idle.count))]
    ]
  )
  console.log("\nCalls (the request serve prints for each example; ms)")
  table(
    ["app", "first", "warm", ...(idleRelease ? ["cold"] : [])],
    calls.map((entry) => {
      const cell = (outcome: Outcome | undefined) =>
        outcome === undefined ? "" : `${Math.round(outcome.ms)}${outcome.status === 200 ? "" : ` (${outcome.status})`}`
      return [entry.app, cell(entry.first), cell(entry.warm), ...(idleRelease ? [cell(entry.cold)] : [])]
    })
  )
  console.log(
    `\nSIGINT to the group: serve ${exited ? `exited in ${seconds(stopMs)} s` : "had not exited after 30 s"}; left: ${leftProcesses.length} processes, /dev/shm [${leftShm.join(", ")}], ${tmpdir()} [${leftTmp.join(", ")}]`
  )

  const bytes = footprintBytes(atReady)
  const coldMs = calls.flatMap((entry) => (entry.cold === undefined ? [] : [entry.cold.ms]))
  const failed = calls.filter((entry) =>
    [entry.first, entry.warm, entry.cold].some((c) => c !== undefined && c.status !== 200)
  )
  console.log(
    JSON.stringify({
      bench: "footprint",
      readyS: seconds(readyMs),
      processes: atReady.processes,
      footprintMiB: mib(bytes),
      processMiB: mib(atReady.processBytes),
      sharedMemoryMiB: mib(atReady.sharedMemoryBytes),
      afterCallsMiB: mib(footprintBytes(afterCalls)),
      releasedMiB: released === undefined ? null : mib(footprintBytes(released)),
      firstCallMs: Object.fromEntries(calls.map((entry) => [entry.app, Math.round(entry.first.ms)])),
      warmCallMs: Object.fromEntries(calls.map((entry) => [entry.app, Math.round(entry.warm!.ms)])),
      coldCallMs: idleRelease
        ? Object.fromEntries(calls.map((entry) => [entry.app, Math.round(entry.cold!.ms)]))
        : null,
      idleCpuPercent: percent(idle.share),
      idleProcesses: idle.count,
      bareNodeIdleCpuPercent: percent(idle.bareShare),
      failedApps: failed.map((entry) => entry.app),
      stopS: exited ? seconds(stopMs) : null,
      left: { processes: leftProcesses.length, shm: leftShm, tmp: leftTmp },
      ratios: {
        footprintToTarget: Math.round((bytes / TARGET.bytes) * 100) / 100,
        // The platform's idle CPU per process, to a bare Node process's with one timer.
        idlePerProcessToBareNode:
          idle.bareShare === 0 ? null : Math.round((idle.share / Math.max(1, idle.count) / idle.bareShare) * 100) / 100,
        readyToTarget: Math.round((readyMs / 1000 / TARGET.readyS) * 100) / 100,
        maxColdToTarget:
          coldMs.length === 0 ? null : Math.round((Math.max(...coldMs) / 1000 / TARGET.coldS) * 100) / 100
      }
    })
  )
}
