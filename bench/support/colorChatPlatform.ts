/**
 * The platform the soak and overload benches run: `cornserve serve` on color_chat's three CPU
 * devices with a 64 MiB sidecar arena (as startColorChat in test/support/colorChat.ts), started
 * as a child of the bench and stopped so that none of its processes outlives it; and the figures
 * both benches print.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { once } from "node:events"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { createInterface } from "node:readline"
import { setTimeout as sleep } from "node:timers/promises"
import { binPath, repoRoot } from "../../test/support/platform.js"
import { type ProcessSample, sampleProcesses, stillRunning } from "./processes.js"

const DEVICES = "cpu:0,cpu:1,cpu:2"
const ARENA_BYTES = 64 * 1024 * 1024
export const START_TIMEOUT_MS = 120_000
const STOP_TIMEOUT_MS = 15_000

export const round = (value: number, digits: number) => Number(value.toFixed(digits))
export const mib = (kib: number) => round(kib / 1024, 1)

/** Nearest-rank percentile of sorted values. */
export function percentile(sorted: ReadonlyArray<number>, p: number): number {
  if (sorted.length === 0) return Number.NaN
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1))]!
}

export interface Platform {
  readonly child: ChildProcess
  readonly url: string
  /** The platform's last lines of output, to explain a failure. */
  readonly tail: () => string
  /** Every line of the platform's output that says `rebalancing:` (the moves of --autoscale), up to 500. */
  readonly rebalancing: () => ReadonlyArray<string>
}

/**
 * Spawns `cornserve serve` and resolves once its gateway listens. Both output streams are read to
 * the end (executors write into them too) and only their last lines are kept, so that a long run
 * neither blocks the platform on a full pipe nor grows the bench's own memory. `onSpawn` learns of
 * the child before it listens, so that a signal during start-up stops it too.
 */
export async function startPlatform(options: {
  readonly stateDir: string
  readonly modelDir: string
  readonly nodeId: string
  readonly onSpawn: (child: ChildProcess) => void
  /** Devices other than color_chat's three, and more flags for serve. */
  readonly devices?: string | undefined
  readonly args?: ReadonlyArray<string> | undefined
}): Promise<Platform> {
  const child = spawn(
    process.execPath,
    [
      binPath,
      "serve",
      "--host",
      "127.0.0.1",
      "--port",
      "0",
      "--state-dir",
      options.stateDir,
      "--devices",
      options.devices ?? DEVICES,
      "--node-id",
      options.nodeId,
      "--sidecar-arena-bytes",
      String(ARENA_BYTES),
      // Every request sends the same image: the cache of encoder outputs would leave the encoder idle.
      "--embedding-cache-bytes",
      "0",
      ...(options.args ?? [])
    ],
    {
      cwd: repoRoot,
      env: { ...process.env, CORNSERVE_MODEL_DIR: options.modelDir },
      stdio: ["ignore", "pipe", "pipe"]
    }
  )
  options.onSpawn(child)
  const lines: Array<string> = []
  const moves: Array<string> = []
  const keep = (line: string) => {
    if (moves.length < 500 && line.includes("rebalancing:")) moves.push(line)
    lines.push(line)
    if (lines.length > 60) lines.shift()
  }
  const tail = () => lines.join("\n")
  createInterface({ input: child.stderr! }).on("line", keep)
  const stdout = createInterface({ input: child.stdout! })
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => fail(`did not listen within ${START_TIMEOUT_MS} ms`), START_TIMEOUT_MS)
    const onExit = (code: number | null, signal: NodeJS.Signals | null) => fail(`exited (${signal ?? code}) first`)
    const onLine = (line: string) => {
      keep(line)
      // Executors write to the same stream, with their own "executor: serving at" lines.
      const match = /^cornserve: serving at (http:\/\/\S+)/.exec(line)
      if (match?.[1] !== undefined) {
        clearTimeout(timer)
        child.off("exit", onExit)
        stdout.off("line", onLine)
        stdout.on("line", keep)
        resolve(match[1])
      }
    }
    function fail(why: string) {
      clearTimeout(timer)
      child.off("exit", onExit)
      reject(new Error(`cornserve serve ${why}; its last output:\n${tail()}`))
    }
    child.once("exit", onExit)
    stdout.on("line", onLine)
  })
  return { child, url, tail, rebalancing: () => moves }
}

/**
 * Every process of the platform the bench has seen (pid and start time), and `stop`: SIGTERM to
 * serve (SIGKILL after STOP_TIMEOUT_MS), then SIGKILL to any process of the platform still running
 * after as long again. `label` names the bench in what it says.
 */
export function platformReaper(app: string, label: string) {
  const seen = new Map<number, string>()
  const remember = (samples: ReadonlyArray<ProcessSample>) => {
    for (const sample of samples) seen.set(sample.pid, sample.startTime)
  }
  const stop = async (child: ChildProcess | undefined): Promise<void> => {
    if (child === undefined) return
    if (child.pid !== undefined) remember(sampleProcesses(child.pid, new Map(), app))
    if (child.exitCode === null && child.signalCode === null) {
      const exited = once(child, "exit")
      child.kill("SIGTERM")
      const stopped = await Promise.race([exited.then(() => true), sleep(STOP_TIMEOUT_MS, false)])
      if (!stopped) {
        console.error(`${label}: serve did not stop within ${STOP_TIMEOUT_MS} ms of SIGTERM; killing it`)
        child.kill("SIGKILL")
        await exited
      }
    }
    // Its children stop when their lifeline (a pipe from their parent) closes; give them the same time.
    const deadline = Date.now() + STOP_TIMEOUT_MS
    let left = [...seen].filter(([pid, startTime]) => stillRunning(pid, startTime))
    while (left.length > 0 && Date.now() < deadline) {
      await sleep(100)
      left = left.filter(([pid, startTime]) => stillRunning(pid, startTime))
    }
    for (const [pid] of left) {
      console.error(`${label}: process ${pid} of the platform outlived it by ${STOP_TIMEOUT_MS} ms; killing it`)
      try {
        process.kill(pid, "SIGKILL")
      } catch {
        // gone meanwhile
      }
    }
  }
  /** The pids of the platform's processes seen so far. */
  const pids = () => new Set(seen.keys())
  return { remember, pids, stop }
}

/** The platform a bench runs against, with what the reaper needs to know of it. */
export interface BenchPlatform extends Platform {
  /** Aborts when the bench is told to stop (SIGINT, SIGTERM): load loops end with it. */
  readonly signal: AbortSignal
  /** Notes processes of the platform, so that stopping it reaps them too. */
  readonly remember: (samples: ReadonlyArray<ProcessSample>) => void
  /** The pids of the platform's processes seen so far. */
  readonly pids: () => Set<number>
}

/** The node name of a bench's platform (withBenchPlatform's): its sidecar's arena file carries it. */
export const benchNodeId = (label: string) => `${label}-${process.pid}`

/**
 * Runs `body` against a platform started for the bench in state and model directories of its own.
 * When the body ends, fails, or the bench gets SIGINT/SIGTERM, `signal` aborts, `cleanup` runs, the
 * platform is stopped and every process of it reaped, and the directories are removed. `label`
 * names the bench in what it says and in its directories; `app` is the app its processes serve.
 */
export async function withBenchPlatform(
  label: string,
  app: string,
  body: (platform: BenchPlatform) => Promise<void>,
  cleanup: () => void = () => undefined,
  serve: { readonly devices?: string; readonly args?: ReadonlyArray<string> } = {}
): Promise<void> {
  const stateDir = mkdtempSync(join(tmpdir(), `cornserve-bench-${label}-`))
  const modelDir = mkdtempSync(join(tmpdir(), `cornserve-bench-${label}-models-`))
  const load = new AbortController()
  let serveProcess: ChildProcess | undefined
  const reaper = platformReaper(app, label)
  let cleaning: Promise<void> | undefined
  const stop = () => {
    load.abort()
    cleaning ??= (async () => {
      cleanup()
      await reaper.stop(serveProcess)
    })().finally(() => {
      rmSync(stateDir, { recursive: true, force: true })
      rmSync(modelDir, { recursive: true, force: true })
    })
    return cleaning
  }
  const onSignal = (signal: NodeJS.Signals) => {
    console.error(`${label}: ${signal}, stopping the platform`)
    void stop().finally(() => process.exit(signal === "SIGINT" ? 130 : 143))
  }
  process.once("SIGINT", onSignal)
  process.once("SIGTERM", onSignal)
  try {
    const platform = await startPlatform({
      stateDir,
      modelDir,
      nodeId: benchNodeId(label),
      onSpawn: (child) => {
        serveProcess = child
      },
      ...serve
    })
    await body({ ...platform, signal: load.signal, remember: reaper.remember, pids: reaper.pids })
  } finally {
    await stop()
    process.off("SIGINT", onSignal)
    process.off("SIGTERM", onSignal)
  }
}
