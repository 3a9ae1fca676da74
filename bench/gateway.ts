/**
 * Gateway overhead: what cornserve adds on top of a bare node:http server doing the same work.
 *
 * Starts the real platform (`bin/cornserve serve`, with only the hello example registered: the other
 * examples' executors would share this machine's cores with the gateway, and what they cost is not
 * the gateway's) and a bare server
 * (support/bare-hello-server.ts) as child processes, then drives both with an open-loop load
 * generator at fixed rates, alternating the two at each rate so machine noise hits both alike.
 * Prints a table, then (as the last line) one JSON object with the figures.
 *
 * Then the serial shape: one client sends a request, waits for its answer and sends the next, for
 * BENCH_SECONDS per round. There the latency a client sees is the whole request path end to end
 * with nothing queued, so the added p99 is the platform's own tail (its target: at most 1 ms).
 *
 * Env: BENCH_SECONDS (measured seconds per phase, default 5), BENCH_WARMUP_SECONDS (default 1),
 * BENCH_RATES (comma-separated requests/s, default 100,500,1000,2000), BENCH_ROUNDS (default 3),
 * BENCH_STARTUP_SECONDS (default 25), BENCH_EXAMPLES=1 (serve every example app, as `npm start` does,
 * so that their executors run beside the gateway: the platform as a user first meets it).
 *
 * The figures are for servers in their steady state. Before the first phase both servers take
 * BENCH_STARTUP_SECONDS of light load, together: a Node process that has just started spends its
 * first ~20 s on V8's memory reducer, which, once the start-up garbage is there and allocation is
 * low, runs up to three compacting collections 8 s apart (5–20 ms each, in the gateway and in each
 * app's process). They come once per process, not per request, and the 100 req/s phase would
 * otherwise measure them rather than the gateway.
 *
 * At each rate the two servers are measured in alternating rounds; a figure is the median over the
 * rounds, and the added latency the median of each round's difference, so that one noisy phase on a
 * shared machine neither makes nor breaks the comparison.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { once } from "node:events"
import { mkdtempSync, rmSync } from "node:fs"
import http from "node:http"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { performance } from "node:perf_hooks"
import { createInterface } from "node:readline"
import { setTimeout as sleep } from "node:timers/promises"
import { bundleScript } from "../test/support/bundle.js"
import { repoRoot, runCli } from "../test/support/platform.js"

const SECONDS = envNumber("BENCH_SECONDS", 5)
const WARMUP_SECONDS = envNumber("BENCH_WARMUP_SECONDS", 1)
const RATES = envRates("BENCH_RATES", [100, 500, 1000, 2000])
const ROUNDS = envNumber("BENCH_ROUNDS", 3)
const STARTUP_SECONDS = envNumber("BENCH_STARTUP_SECONDS", 25)
const STARTUP_RATE = 100
const EXAMPLES = process.env.BENCH_EXAMPLES === "1"
/**
 * BENCH_API_KEY: the platform takes invocations with this API key only (CORNSERVE_API_KEY, which
 * the platform started here inherits), and every request carries it, as the bare server's do too.
 */
const API_KEY = process.env.BENCH_API_KEY || undefined
if (API_KEY !== undefined) process.env.CORNSERVE_API_KEY = API_KEY
/** What the gateway may add to the bare server's latency, at every rate and one request after another. */
const TARGET = { p50AddedMs: 0.5, p99AddedMs: 1 } as const
const SERIAL_TARGET = { p99AddedMs: 1 } as const

const APP = "hello"
const INVOKE_PATH = `/app/invoke/${APP}`
const REQUEST_BODY = JSON.stringify({ name: "Ada" })
const EXPECTED_BODY = JSON.stringify({ greeting: "Hello, Ada! Cornserve is serving you." })
const MAX_SOCKETS = 64
/** How long a phase waits for its last responses before counting them as errors. */
const DRAIN_TIMEOUT_MS = 10_000
const START_TIMEOUT_MS = 60_000
const STOP_TIMEOUT_MS = 10_000
const PAUSE_BETWEEN_PHASES_MS = 250
const BARE_SERVER_SOURCE = "bench/support/bare-hello-server.ts"

type TargetName = "bare" | "cornserve"

interface Target {
  readonly name: TargetName
  readonly url: URL
  readonly agent: http.Agent
}

interface Phase {
  readonly ok: number
  readonly errors: number
  /** Latencies of the successful requests, from their scheduled send time. */
  readonly latenciesMs: ReadonlyArray<number>
  /** From the first scheduled send to the last response. */
  readonly elapsedMs: number
}

interface Stats {
  readonly rps: number
  readonly p50Ms: number
  readonly p99Ms: number
  readonly errors: number
}

interface RateResult {
  /** Requests per second of the open loop, or "serial": one client, one request at a time. */
  readonly rate: number | "serial"
  readonly bare: Stats
  readonly cornserve: Stats
  readonly p50AddedMs: number
  readonly p99AddedMs: number
  readonly throughputRatio: number
}

function envNumber(name: string, fallback: number): number {
  const raw = process.env[name]
  if (raw === undefined || raw === "") return fallback
  const value = Number(raw)
  if (!Number.isFinite(value) || value <= 0) throw new Error(`${name} must be a positive number, got ${raw}`)
  return value
}

function envRates(name: string, fallback: ReadonlyArray<number>): ReadonlyArray<number> {
  const raw = process.env[name]
  if (raw === undefined || raw === "") return fallback
  const rates = raw.split(",").map(Number)
  if (rates.some((rate) => !Number.isInteger(rate) || rate <= 0))
    throw new Error(`${name} must list positive integers, got ${raw}`)
  return rates
}

const round = (value: number, digits: number) => Number(value.toFixed(digits))

// ---------------------------------------------------------------------------------------------
// Child processes

/** Every child still running, so that an error or a signal can stop them all. */
const children = new Set<ChildProcess>()

/**
 * Spawns `node args...` and resolves with the URL of its `serving at http://127.0.0.1:PORT` line.
 * The child's output is kept (last lines only) to explain a failure to start.
 */
async function startServer(label: string, args: ReadonlyArray<string>): Promise<{ child: ChildProcess; url: URL }> {
  const child = spawn(process.execPath, args, { stdio: ["ignore", "pipe", "pipe"] })
  children.add(child)
  child.once("exit", () => children.delete(child))
  const tail: Array<string> = []
  const keep = (line: string) => {
    tail.push(line)
    if (tail.length > 40) tail.shift()
  }
  // Both streams are always read to the end: a child blocked on a full pipe would skew the bench.
  createInterface({ input: child.stderr! }).on("line", keep)
  const stdout = createInterface({ input: child.stdout! })
  const url = await new Promise<URL>((resolve, reject) => {
    const timer = setTimeout(() => fail(`did not print its URL within ${START_TIMEOUT_MS} ms`), START_TIMEOUT_MS)
    const onExit = (code: number | null, signal: NodeJS.Signals | null) =>
      fail(`exited (${signal ?? code}) before serving`)
    function fail(why: string) {
      clearTimeout(timer)
      child.off("exit", onExit)
      reject(new Error(`${label} ${why}; its last output:\n${tail.join("\n")}`))
    }
    child.once("exit", onExit)
    stdout.on("line", (line) => {
      keep(line)
      const match = /serving at (http:\/\/127\.0\.0\.1:\d+)/.exec(line)
      if (match?.[1] !== undefined) {
        clearTimeout(timer)
        child.off("exit", onExit)
        resolve(new URL(match[1]))
      }
    })
  })
  return { child, url }
}

/** SIGTERM, then SIGKILL if the child has not exited after STOP_TIMEOUT_MS. */
async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return
  const exited = once(child, "exit")
  child.kill("SIGTERM")
  const stopped = await Promise.race([exited.then(() => true), sleep(STOP_TIMEOUT_MS, false)])
  if (!stopped) {
    child.kill("SIGKILL")
    await exited
  }
}

/** Polls /app/list until the app is ready. */
async function waitForApp(gateway: URL, app: string): Promise<void> {
  const deadline = Date.now() + START_TIMEOUT_MS
  while (Date.now() < deadline) {
    const response = await fetch(new URL("/app/list", gateway)).catch(() => undefined)
    if (response?.ok) {
      const body = (await response.json()) as { apps?: Array<{ id?: unknown; state?: unknown }> }
      if (body.apps?.some((entry) => entry.id === app && entry.state === "ready")) return
    }
    await sleep(200)
  }
  throw new Error(`app ${app} was not ready within ${START_TIMEOUT_MS} ms`)
}

function bundleBareServer(): Promise<string> {
  return bundleScript(BARE_SERVER_SOURCE, `bench/.out/bare-hello-server-${process.pid}.mjs`)
}

// ---------------------------------------------------------------------------------------------
// Load generation

/** Sends one invocation; `onDone` gets whether it answered 200 with the expected body. */
function sendRequest(target: Target, onDone: (ok: boolean) => void): http.ClientRequest {
  let settled = false
  const settle = (ok: boolean) => {
    if (settled) return
    settled = true
    onDone(ok)
  }
  const request = http.request({
    agent: target.agent,
    host: target.url.hostname,
    port: target.url.port,
    method: "POST",
    path: INVOKE_PATH,
    headers: {
      "content-type": "application/json",
      "content-length": Buffer.byteLength(REQUEST_BODY),
      ...(API_KEY === undefined ? {} : { authorization: `Bearer ${API_KEY}` })
    }
  })
  request.on("response", (response) => {
    let body = ""
    response.setEncoding("utf8")
    response.on("data", (chunk: string) => (body += chunk))
    response.on("end", () => settle(response.statusCode === 200 && body === EXPECTED_BODY))
    response.on("error", () => settle(false))
  })
  request.on("error", () => settle(false))
  request.end(REQUEST_BODY)
  return request
}

/**
 * Open loop: request i is due at start + i/rate whatever happened to the earlier ones, and its
 * latency counts from that due time, so a stalled server is charged for the requests it delayed
 * (no coordinated omission). Timers fire at most once a millisecond, so each tick sends every
 * request that has come due.
 */
function runOpenLoop(target: Target, rate: number, seconds: number): Promise<Phase> {
  const total = Math.max(1, Math.round(rate * seconds))
  const intervalMs = 1000 / rate
  const latenciesMs: Array<number> = []
  const inFlight = new Set<http.ClientRequest>()
  let errors = 0
  let sent = 0
  let lastDoneAt = 0
  let finished = false
  const start = performance.now()

  return new Promise((resolve) => {
    let drainTimer: NodeJS.Timeout | undefined
    const finish = () => {
      finished = true
      clearTimeout(drainTimer)
      // Whatever is still out after the drain timeout counts as failed.
      errors += inFlight.size
      for (const request of inFlight) request.destroy()
      inFlight.clear()
      resolve({ ok: latenciesMs.length, errors, latenciesMs, elapsedMs: (lastDoneAt || performance.now()) - start })
    }
    const sendDue = () => {
      const now = performance.now()
      while (sent < total && start + sent * intervalMs <= now) {
        const dueAt = start + sent * intervalMs
        const request = sendRequest(target, (ok) => {
          if (finished) return
          inFlight.delete(request)
          lastDoneAt = performance.now()
          if (ok) latenciesMs.push(lastDoneAt - dueAt)
          else errors++
          if (sent === total && inFlight.size === 0) finish()
        })
        inFlight.add(request)
        sent++
      }
      if (sent < total) setTimeout(sendDue, start + sent * intervalMs - now)
      else drainTimer = setTimeout(finish, DRAIN_TIMEOUT_MS)
    }
    sendDue()
  })
}

/** Closed loop of one: each request is sent when the one before it has been answered. */
async function runSerial(target: Target, seconds: number): Promise<Phase> {
  const latenciesMs: Array<number> = []
  let errors = 0
  const start = performance.now()
  const end = start + seconds * 1000
  while (performance.now() < end) {
    const sentAt = performance.now()
    const ok = await new Promise<boolean>((resolve) => sendRequest(target, resolve))
    if (ok) latenciesMs.push(performance.now() - sentAt)
    else errors++
  }
  return { ok: latenciesMs.length, errors, latenciesMs, elapsedMs: performance.now() - start }
}

/** Nearest-rank percentile of sorted values. */
function percentile(sorted: ReadonlyArray<number>, p: number): number {
  if (sorted.length === 0) return Number.NaN
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1))]!
}

function summarize(phase: Phase): Stats {
  const sorted = [...phase.latenciesMs].sort((a, b) => a - b)
  return {
    rps: round(phase.ok / (phase.elapsedMs / 1000), 1),
    p50Ms: round(percentile(sorted, 0.5), 3),
    p99Ms: round(percentile(sorted, 0.99), 3),
    errors: phase.errors
  }
}

async function measure(target: Target, rate: number | "serial"): Promise<Stats> {
  const run = (seconds: number) => (rate === "serial" ? runSerial(target, seconds) : runOpenLoop(target, rate, seconds))
  await run(WARMUP_SECONDS)
  const stats = summarize(await run(SECONDS))
  console.error(
    `  ${target.name.padEnd(9)} ${rate}/s: ${stats.rps} rps, p50 ${stats.p50Ms} ms, p99 ${stats.p99Ms} ms, ${stats.errors} errors`
  )
  await sleep(PAUSE_BETWEEN_PHASES_MS)
  return stats
}

function median(values: ReadonlyArray<number>): number {
  const sorted = [...values].sort((a, b) => a - b)
  const middle = Math.floor(sorted.length / 2)
  return sorted.length % 2 === 1 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2
}

/** Each field's median over the rounds (errors: their sum). */
function medianStats(rounds: ReadonlyArray<Stats>): Stats {
  return {
    rps: round(median(rounds.map((s) => s.rps)), 1),
    p50Ms: round(median(rounds.map((s) => s.p50Ms)), 3),
    p99Ms: round(median(rounds.map((s) => s.p99Ms)), 3),
    errors: rounds.reduce((sum, s) => sum + s.errors, 0)
  }
}

function compare(
  rate: number | "serial",
  rounds: ReadonlyArray<{ readonly bare: Stats; readonly cornserve: Stats }>
): RateResult {
  const bare = medianStats(rounds.map((r) => r.bare))
  const cornserve = medianStats(rounds.map((r) => r.cornserve))
  return {
    rate,
    bare,
    cornserve,
    p50AddedMs: round(median(rounds.map((r) => r.cornserve.p50Ms - r.bare.p50Ms)), 3),
    p99AddedMs: round(median(rounds.map((r) => r.cornserve.p99Ms - r.bare.p99Ms)), 3),
    throughputRatio: round(cornserve.rps / bare.rps, 3)
  }
}

// ---------------------------------------------------------------------------------------------
// Report

function printTable(results: ReadonlyArray<RateResult>): void {
  const header = [
    "rate",
    "bare rps",
    "p50 ms",
    "p99 ms",
    "err",
    "cs rps",
    "p50 ms",
    "p99 ms",
    "err",
    "+p50 ms",
    "+p99 ms",
    "rps ratio"
  ]
  const rows = results.map((r) =>
    [
      r.rate,
      r.bare.rps,
      r.bare.p50Ms,
      r.bare.p99Ms,
      r.bare.errors,
      r.cornserve.rps,
      r.cornserve.p50Ms,
      r.cornserve.p99Ms,
      r.cornserve.errors,
      r.p50AddedMs,
      r.p99AddedMs,
      r.throughputRatio
    ].map(String)
  )
  const widths = header.map((title, column) => Math.max(title.length, ...rows.map((row) => row[column]!.length)))
  const line = (cells: ReadonlyArray<string>) => cells.map((cell, column) => cell.padStart(widths[column]!)).join("  ")
  console.log(
    `gateway bench: open loop, ${ROUNDS} rounds of ${SECONDS} s per phase after ${WARMUP_SECONDS} s warm-up (${STARTUP_SECONDS} s start-up first), medians, cs = cornserve`
  )
  console.log(line(header))
  for (const row of rows) console.log(line(row))
}

function report(results: ReadonlyArray<RateResult>) {
  const meets = (r: RateResult) =>
    r.cornserve.errors === 0 &&
    (r.rate === "serial"
      ? r.p99AddedMs <= SERIAL_TARGET.p99AddedMs
      : r.p50AddedMs <= TARGET.p50AddedMs && r.p99AddedMs <= TARGET.p99AddedMs)
  return {
    bench: "gateway",
    seconds: SECONDS,
    rounds: ROUNDS,
    rates: results,
    target: TARGET,
    serialTarget: SERIAL_TARGET,
    ratesMeetingTarget: results.filter(meets).map((r) => r.rate),
    meetsTarget: results.every(meets)
  }
}

// ---------------------------------------------------------------------------------------------

export default async function gatewayBench(): Promise<void> {
  const stateDir = mkdtempSync(join(tmpdir(), "cornserve-bench-"))
  let bareScript: string | undefined
  const agents: Array<http.Agent> = []
  // A signal to the bench alone (not its process group) must not orphan the servers.
  const onSignal = (signal: NodeJS.Signals) => {
    for (const child of children) child.kill("SIGTERM")
    rmSync(stateDir, { recursive: true, force: true })
    if (bareScript !== undefined) rmSync(bareScript, { force: true })
    process.exit(signal === "SIGINT" ? 130 : 143)
  }
  process.once("SIGINT", onSignal)
  process.once("SIGTERM", onSignal)

  try {
    bareScript = await bundleBareServer()
    const [cornserve, bare] = await Promise.all([
      startServer("cornserve", [
        "bin/cornserve",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--state-dir",
        stateDir,
        ...(EXAMPLES ? ["--examples"] : [])
      ]),
      startServer("bare server", [bareScript])
    ])
    if (!EXAMPLES) {
      const registered = await runCli(["app", "register", join(repoRoot, "examples", `${APP}.ts`)], {
        CORNSERVE_GATEWAY_URL: cornserve.url.origin
      })
      if (registered.code !== 0) throw new Error(`registering ${APP} failed: ${registered.stderr}`)
    }
    await waitForApp(cornserve.url, APP)

    const target = (name: TargetName, url: URL): Target => {
      const agent = new http.Agent({ keepAlive: true, maxSockets: MAX_SOCKETS })
      agents.push(agent)
      return { name, url, agent }
    }
    const targets = { bare: target("bare", bare.url), cornserve: target("cornserve", cornserve.url) }
    console.error(`bare at ${bare.url.origin}, cornserve at ${cornserve.url.origin}`)

    if (STARTUP_SECONDS > 0) {
      console.error(`start-up: ${STARTUP_SECONDS} s at ${STARTUP_RATE} req/s to both servers, not measured`)
      await Promise.all([
        runOpenLoop(targets.bare, STARTUP_RATE, STARTUP_SECONDS),
        runOpenLoop(targets.cornserve, STARTUP_RATE, STARTUP_SECONDS)
      ])
    }

    const results: Array<RateResult> = []
    for (const rate of [...RATES, "serial" as const]) {
      const rounds: Array<{ bare: Stats; cornserve: Stats }> = []
      for (let index = 0; index < ROUNDS; index++) {
        const bareStats = await measure(targets.bare, rate)
        rounds.push({ bare: bareStats, cornserve: await measure(targets.cornserve, rate) })
      }
      results.push(compare(rate, rounds))
    }

    printTable(results)
    console.log(JSON.stringify(report(results)))
  } finally {
    for (const agent of agents) agent.destroy()
    await Promise.all([...children].map(stopChild))
    rmSync(stateDir, { recursive: true, force: true })
    if (bareScript !== undefined) rmSync(bareScript, { force: true })
    process.off("SIGINT", onSignal)
    process.off("SIGTERM", onSignal)
  }
}
