/**
 * Overload: whether admission control keeps an app's accepted requests fast when ten times more
 * requests arrive than the platform can serve, and whether the platform gives back the memory that
 * the burst took.
 *
 * The target comes from the project's issue on admission control: at 10x the platform's capacity for
 * 30 s, accepted requests keep their p99 latency within 2x their p99 at capacity, shed requests are
 * answered in under 50 ms, and memory returns to its level before the test. Without admission
 * control every request would wait inside the platform behind all those that came before it, and
 * every client would see its latency grow for as long as the burst lasts. With it, a request over
 * the app's limits should be turned away at once, so that its client can retry later or elsewhere,
 * while the requests that were admitted run about as fast as they do at capacity.
 *
 * The bench starts the real platform as bench/soak.ts does (three CPU devices, a 64 MiB sidecar
 * arena, color_chat registered and nothing else) in a state directory of its own, and registers
 * color_chat with admission limits given at registration (`--max-concurrency`, `--max-queue` and a
 * `--queue-timeout` of 2 s). Then it runs three phases:
 *
 * 1. Capacity. After BENCH_WARMUP_SECONDS of the same load, which is not measured, as many clients
 *    as the app's maxConcurrency send requests in a closed loop (each one sends its next request
 *    once it has the last answer) for BENCH_CAPACITY_SECONDS. The answers per second are the
 *    platform's capacity, and their latency is the baseline. Once the platform has been idle for
 *    2 s, the bench records the resident set of the serve process and of every process below it.
 * 2. Overload. An open loop sends BENCH_OVERLOAD_FACTOR times the capacity in requests per second
 *    for BENCH_OVERLOAD_SECONDS. Request i is due at start + i/rate whatever became of the earlier
 *    ones, and its latency counts from that due time, so that a platform that stalls is charged for
 *    the requests it delayed. Each answer is accepted (status 200 and the colour "red" in its text),
 *    shed (429, or 503 with a Retry-After header; the error's code tells AppOverloaded, QueueTimeout
 *    and TaskUnavailable apart), or another error (anything else, a network error included).
 * 3. Recovery. After 5 s of idle, the bench records every process's resident set again and compares
 *    it with the reading after phase 1.
 *
 * Target: the accepted p99 at most 2x the capacity p99, the shed p99 under 50 ms, no other error in
 * either phase, and the serve process's resident set after recovery at most 1.10x its level after
 * phase 1 (the other processes are printed too). A request that waits in the app's queue until the
 * queue timeout and is then answered 503 counts as shed, so such answers show in the shed p99; the
 * table splits the shed answers by status and code.
 *
 * The load generator runs on the same machine as the platform and competes with it for CPU. It
 * sends through a keep-alive agent with a socket for every request in flight, and it reports how
 * late it sent requests against their due times, so that a generator that could not keep up shows.
 * The rows marked "from send" give the same answers' latency from the moment each request actually
 * went out; they are not part of the target, and tell the platform's share of a slow answer apart
 * from the generator's.
 *
 * Prints two tables (latency, then memory), then (as the last line) one JSON object with the
 * figures and whether they meet the target.
 *
 * The warm-up is long for the memory reading's sake: a Node process is not at its working size
 * until V8 has collected its old generation once, which under this load takes the serve process
 * some 12,000 requests, about 75 s (see bench/soak.ts).
 *
 * Env: BENCH_MAX_CONCURRENCY (default 8), BENCH_MAX_QUEUE (default 8), BENCH_WARMUP_SECONDS
 * (default 90), BENCH_CAPACITY_SECONDS (default 15), BENCH_OVERLOAD_FACTOR (default 10),
 * BENCH_OVERLOAD_SECONDS (default 30).
 */
import http from "node:http"
import { join } from "node:path"
import { performance } from "node:perf_hooks"
import { setTimeout as sleep } from "node:timers/promises"
import { ESBUILD_ROLE, type ProcessSample, sampleProcesses, taskOnDevice } from "./support/processes.js"
import { mib, percentile, round, START_TIMEOUT_MS, withBenchPlatform } from "./support/colorChatPlatform.js"
import { chatRequest, outcomeOf } from "../test/support/colorChatRequest.js"
import { repoRoot, runCli } from "../test/support/platform.js"

const MAX_CONCURRENCY = envNumber("BENCH_MAX_CONCURRENCY", 8, { integer: true, min: 1 })
const MAX_QUEUE = envNumber("BENCH_MAX_QUEUE", 8, { integer: true, min: 0 })
const QUEUE_TIMEOUT_SECONDS = 2
const WARMUP_SECONDS = envNumber("BENCH_WARMUP_SECONDS", 90, { integer: false, min: 0 })
const CAPACITY_SECONDS = envNumber("BENCH_CAPACITY_SECONDS", 15, { integer: false, min: 1 })
const OVERLOAD_FACTOR = envNumber("BENCH_OVERLOAD_FACTOR", 10, { integer: false, min: 1 })
const OVERLOAD_SECONDS = envNumber("BENCH_OVERLOAD_SECONDS", 30, { integer: false, min: 1 })
/** Idle time before the memory reading after phase 1, and before the one after phase 2. */
const IDLE_AFTER_CAPACITY_MS = 2_000
const IDLE_AFTER_OVERLOAD_MS = 5_000
/** From the issue on admission control. */
const TARGET = { maxAcceptedP99Ratio: 2, maxShedP99Ms: 50, otherErrors: 0, maxServeRssRatio: 1.1 } as const

const APP = "color_chat"
const INVOKE_PATH = `/app/invoke/${APP}`
/** Sockets of the load generator: more than the requests it ever has in flight, so that none waits for one. */
const MAX_SOCKETS = 4_096
/** How long the overload phase waits for its last answers; those still out then count as errors. */
const DRAIN_TIMEOUT_MS = 30_000
const PROGRESS_INTERVAL_MS = 5_000

function envNumber(name: string, fallback: number, { integer, min }: { integer: boolean; min: number }): number {
  const raw = process.env[name]
  if (raw === undefined || raw === "") return fallback
  const value = Number(raw)
  const valid = integer ? Number.isSafeInteger(value) : Number.isFinite(value)
  if (!valid || value < min)
    throw new Error(`${name} must be ${integer ? "an integer" : "a number"} >= ${min}, got ${raw}`)
  return value
}

/** `a / b`, or null when either is missing or b is zero. */
const ratio = (a: number | null, b: number | null) =>
  a === null || b === null || !Number.isFinite(a) || !Number.isFinite(b) || b === 0 ? null : round(a / b, 3)

// ---------------------------------------------------------------------------------------------
// The platform

interface AppState {
  readonly state?: unknown
  readonly inFlight?: unknown
  readonly queued?: unknown
  readonly admission?: {
    readonly maxConcurrency?: unknown
    readonly maxQueue?: unknown
    readonly queueTimeoutMs?: unknown
  }
}

/** The app's entry in /app/list, or undefined when the list cannot be read or does not hold it. */
async function appState(url: string, app: string): Promise<AppState | undefined> {
  const response = await fetch(`${url}/app/list`).catch(() => undefined)
  if (!response?.ok) return undefined
  const body = (await response.json()) as { apps?: Array<AppState & { id?: unknown }> }
  return body.apps?.find((entry) => entry.id === app)
}

async function waitForApp(url: string, app: string): Promise<AppState> {
  const deadline = Date.now() + START_TIMEOUT_MS
  while (Date.now() < deadline) {
    const state = await appState(url, app)
    if (state?.state === "ready") return state
    await sleep(200)
  }
  throw new Error(`app ${app} was not ready within ${START_TIMEOUT_MS} ms`)
}

/** The app's requests shed by the platform, by reason, from `cornserve_requests_shed_total` in /metrics. */
async function shedMetric(url: string): Promise<Record<string, number>> {
  const text = await fetch(`${url}/metrics`, {
    headers: { authorization: `Bearer ${process.env.CORNSERVE_ADMIN_TOKEN}` }
  })
    .then((response) => (response.ok ? response.text() : ""))
    .catch(() => "")
  const shed: Record<string, number> = {}
  for (const line of text.split("\n")) {
    if (!line.startsWith("cornserve_requests_shed_total{") || !line.includes(`app="${APP}"`)) continue
    const reason = /reason="([^"]*)"/.exec(line)?.[1] ?? "?"
    const value = Number(line.slice(line.lastIndexOf(" ") + 1))
    if (Number.isFinite(value)) shed[reason] = (shed[reason] ?? 0) + value
  }
  return shed
}

// ---------------------------------------------------------------------------------------------
// Requests

/** What one request got. */
type Answer =
  | { readonly kind: "accepted" }
  /** Refused for capacity: 429, or 503 with Retry-After; `code` is the error's tag. */
  | { readonly kind: "shed"; readonly status: number; readonly code: string }
  | { readonly kind: "error"; readonly why: string }

const requestBytes = Buffer.byteLength(chatRequest)

/** The `code` of a JSON error answer, or "?". */
function errorCode(body: string): string {
  try {
    const code = (JSON.parse(body) as { error?: { code?: unknown } }).error?.code
    return typeof code === "string" ? code : "?"
  } catch {
    return "?"
  }
}

async function classify(status: number, retryAfter: boolean, body: string): Promise<Answer> {
  if (status === 200) {
    // As the tests judge an answer: the streamed chunks' text, or an error line that cut the stream.
    const outcome = await outcomeOf(new Response(body, { status })).catch((error: unknown) => ({
      cut: `unreadable answer: ${String(error).slice(0, 100)}`
    }))
    if ("text" in outcome)
      return outcome.text.toLowerCase().includes("red")
        ? { kind: "accepted" }
        : { kind: "error", why: `answered ${outcome.text.slice(0, 60)}` }
    if ("cut" in outcome) return { kind: "error", why: `stream cut after ${JSON.stringify(outcome.cut.slice(0, 60))}` }
  }
  const code = errorCode(body)
  if ((status === 429 || status === 503) && retryAfter) return { kind: "shed", status, code }
  return { kind: "error", why: `status ${status} ${code}${status === 503 ? " without Retry-After" : ""}` }
}

/** Sends one color_chat request; `onDone` gets its answer and when its last byte came (or it failed). */
function send(agent: http.Agent, gateway: URL, onDone: (answer: Answer, doneAt: number) => void): http.ClientRequest {
  let settled = false
  const settle = (answer: Answer, doneAt = performance.now()) => {
    if (settled) return
    settled = true
    onDone(answer, doneAt)
  }
  const request = http.request({
    agent,
    host: gateway.hostname,
    port: gateway.port,
    method: "POST",
    path: INVOKE_PATH,
    headers: { "content-type": "application/json", "content-length": requestBytes }
  })
  request.on("response", (response) => {
    const chunks: Array<Buffer> = []
    response.on("data", (chunk: Buffer) => chunks.push(chunk))
    response.on("end", () => {
      const doneAt = performance.now()
      const retryAfter = response.headers["retry-after"] !== undefined
      void classify(response.statusCode ?? 0, retryAfter, Buffer.concat(chunks).toString("utf8")).then((answer) =>
        settle(answer, doneAt)
      )
    })
    response.on("error", (error) => settle({ kind: "error", why: `answer broke off: ${error.message}` }))
    response.on("close", () => {
      if (!response.complete) settle({ kind: "error", why: "connection closed before the answer's end" })
    })
  })
  request.on("error", (error) => settle({ kind: "error", why: error.message }))
  request.end(chatRequest)
  return request
}

/** A phase's answers and their latencies, in ms. */
class Tally {
  readonly acceptedMs: Array<number> = []
  readonly shedMs: Array<number> = []
  /** Shed answers by status and code, such as `429 AppOverloaded`. */
  readonly shedByKind = new Map<string, Array<number>>()
  errors = 0
  /** Other errors by what went wrong (the first few kinds only). */
  readonly errorKinds = new Map<string, number>()

  record(answer: Answer, latencyMs: number): void {
    switch (answer.kind) {
      case "accepted":
        this.acceptedMs.push(latencyMs)
        return
      case "shed": {
        this.shedMs.push(latencyMs)
        const kind = `${answer.status} ${answer.code}`
        const latencies = this.shedByKind.get(kind) ?? []
        latencies.push(latencyMs)
        this.shedByKind.set(kind, latencies)
        return
      }
      case "error":
        this.errors++
        if (this.errorKinds.has(answer.why) || this.errorKinds.size < 10)
          this.errorKinds.set(answer.why, (this.errorKinds.get(answer.why) ?? 0) + 1)
    }
  }

  get answers(): number {
    return this.acceptedMs.length + this.shedMs.length + this.errors
  }
}

interface ClosedLoopResult {
  readonly tally: Tally
  /** From the first send to the last answer. */
  readonly elapsedMs: number
}

/** `clients` clients for `seconds`, each sending its next request once it has the last answer. */
async function closedLoop(
  agent: http.Agent,
  gateway: URL,
  clients: number,
  seconds: number,
  signal: AbortSignal
): Promise<ClosedLoopResult> {
  const tally = new Tally()
  const started = performance.now()
  const deadline = started + seconds * 1000
  const client = async () => {
    while (performance.now() < deadline && !signal.aborted) {
      const sentAt = performance.now()
      const { answer, doneAt } = await new Promise<{ answer: Answer; doneAt: number }>((resolve) =>
        send(agent, gateway, (answer, doneAt) => resolve({ answer, doneAt }))
      )
      tally.record(answer, doneAt - sentAt)
    }
  }
  await Promise.all(Array.from({ length: clients }, client))
  return { tally, elapsedMs: performance.now() - started }
}

interface OpenLoopResult {
  readonly tally: Tally
  /** The same answers with their latency from the moment each request actually went out, to tell the generator's lag apart. */
  readonly fromSend: Tally
  readonly sent: number
  /** Requests still without an answer DRAIN_TIMEOUT_MS after the last was sent (counted in the tally's errors). */
  readonly unanswered: number
  /** From the first due time to the last answer. */
  readonly elapsedMs: number
  /** How late each request went out against its due time, sorted. */
  readonly sendLagMs: ReadonlyArray<number>
  readonly maxInFlight: number
}

/**
 * Open loop: request i is due at start + i/rate whatever happened to the earlier ones, and its
 * latency counts from that due time (no coordinated omission). Timers fire at most once a
 * millisecond, so each tick sends every request that has come due.
 */
function openLoop(
  agent: http.Agent,
  gateway: URL,
  rate: number,
  seconds: number,
  signal: AbortSignal
): Promise<OpenLoopResult> {
  const total = Math.max(1, Math.round(rate * seconds))
  const intervalMs = 1000 / rate
  const tally = new Tally()
  const fromSend = new Tally()
  const sendLagMs: Array<number> = []
  const inFlight = new Set<http.ClientRequest>()
  let maxInFlight = 0
  let sent = 0
  let lastDoneAt = 0
  let finished = false
  const start = performance.now()

  return new Promise((resolve) => {
    let sendTimer: NodeJS.Timeout | undefined
    let drainTimer: NodeJS.Timeout | undefined
    const progress = setInterval(() => {
      console.error(
        `  overload: ${sent}/${total} sent, ${tally.acceptedMs.length} accepted, ${tally.shedMs.length} shed, ${tally.errors} errors, ${inFlight.size} in flight`
      )
    }, PROGRESS_INTERVAL_MS)
    const finish = () => {
      if (finished) return
      finished = true
      clearTimeout(sendTimer)
      clearTimeout(drainTimer)
      clearInterval(progress)
      signal.removeEventListener("abort", finish)
      const unanswered = inFlight.size
      const noAnswer: Answer = { kind: "error", why: `no answer within ${DRAIN_TIMEOUT_MS} ms of the last send` }
      for (let index = 0; index < unanswered; index++) {
        tally.record(noAnswer, Number.NaN)
        fromSend.record(noAnswer, Number.NaN)
      }
      for (const request of inFlight) request.destroy()
      inFlight.clear()
      resolve({
        tally,
        fromSend,
        sent,
        unanswered,
        elapsedMs: (lastDoneAt || performance.now()) - start,
        sendLagMs: sendLagMs.sort((a, b) => a - b),
        maxInFlight
      })
    }
    signal.addEventListener("abort", finish, { once: true })
    const sendDue = () => {
      const now = performance.now()
      while (sent < total && start + sent * intervalMs <= now) {
        const dueAt = start + sent * intervalMs
        const sentAt = performance.now()
        sendLagMs.push(sentAt - dueAt)
        const request = send(agent, gateway, (answer, doneAt) => {
          if (finished) return
          inFlight.delete(request)
          lastDoneAt = doneAt
          tally.record(answer, doneAt - dueAt)
          fromSend.record(answer, doneAt - sentAt)
          if (sent === total && inFlight.size === 0) finish()
        })
        inFlight.add(request)
        maxInFlight = Math.max(maxInFlight, inFlight.size)
        sent++
      }
      if (sent < total) sendTimer = setTimeout(sendDue, start + sent * intervalMs - now)
      else if (inFlight.size === 0) finish()
      else drainTimer = setTimeout(finish, DRAIN_TIMEOUT_MS)
    }
    if (signal.aborted) finish()
    else sendDue()
  })
}

const keepAliveAgent = () => new http.Agent({ keepAlive: true, maxSockets: MAX_SOCKETS, maxFreeSockets: MAX_SOCKETS })

// ---------------------------------------------------------------------------------------------
// Report

interface LatencyStats {
  readonly count: number
  readonly p50Ms: number | null
  readonly p99Ms: number | null
  readonly maxMs: number | null
}

function latencyStats(latenciesMs: ReadonlyArray<number>): LatencyStats {
  const sorted = latenciesMs.filter(Number.isFinite).sort((a, b) => a - b)
  const figure = (value: number) => (Number.isFinite(value) ? round(value, 2) : null)
  return {
    count: latenciesMs.length,
    p50Ms: figure(percentile(sorted, 0.5)),
    p99Ms: figure(percentile(sorted, 0.99)),
    maxMs: figure(sorted.at(-1) ?? Number.NaN)
  }
}

/** Shed answers by status and code, with their latencies. */
const shedKinds = (tally: Tally) =>
  Object.fromEntries(
    [...tally.shedByKind].sort(([a], [b]) => a.localeCompare(b)).map(([kind, ms]) => [kind, latencyStats(ms)])
  )

function printTable(header: ReadonlyArray<string>, rows: ReadonlyArray<ReadonlyArray<string>>): void {
  const widths = header.map((title, column) => Math.max(title.length, ...rows.map((row) => row[column]!.length)))
  const line = (values: ReadonlyArray<string>) =>
    values
      .map((value, column) => (column === 0 ? value.padEnd(widths[0]!) : value.padStart(widths[column]!)))
      .join("  ")
  console.log(line(header))
  for (const row of rows) console.log(line(row))
}

const show = (value: number | null | undefined) => (value === null || value === undefined ? "-" : String(value))

interface ProcessRow {
  readonly role: string
  readonly pid: number
  readonly beforeMiB: number | null
  readonly afterMiB: number | null
  /** After over before; null when the process is in one reading only. */
  readonly ratio: number | null
  readonly beforeShmemMiB: number | null
  readonly afterShmemMiB: number | null
}

function processRows(before: ReadonlyArray<ProcessSample>, after: ReadonlyArray<ProcessSample>): Array<ProcessRow> {
  const key = (sample: ProcessSample) => `${sample.pid}/${sample.startTime}`
  const afterByKey = new Map(after.map((sample) => [key(sample), sample]))
  const beforeKeys = new Set(before.map(key))
  const row = (b: ProcessSample | undefined, a: ProcessSample | undefined): ProcessRow => ({
    role: (a ?? b)!.role,
    pid: (a ?? b)!.pid,
    beforeMiB: b === undefined ? null : mib(b.rssKiB),
    afterMiB: a === undefined ? null : mib(a.rssKiB),
    ratio: b === undefined || a === undefined ? null : ratio(a.rssKiB, b.rssKiB),
    beforeShmemMiB: b === undefined ? null : mib(b.shmemKiB),
    afterShmemMiB: a === undefined ? null : mib(a.shmemKiB)
  })
  return [
    ...before.map((b) => row(b, afterByKey.get(key(b)))),
    ...after.filter((a) => !beforeKeys.has(key(a))).map((a) => row(undefined, a))
  ]
}

// ---------------------------------------------------------------------------------------------

export default function overloadBench(): Promise<void> {
  const agents: Array<http.Agent> = []
  const agent = () => {
    const made = keepAliveAgent()
    agents.push(made)
    return made
  }
  return withBenchPlatform(
    "overload",
    APP,
    async (platform) => {
      const { url, signal } = platform
      const gateway = new URL(url)
      const servePid = platform.child.pid!
      console.error(
        `cornserve at ${url}; registering ${APP} with --max-concurrency ${MAX_CONCURRENCY} --max-queue ${MAX_QUEUE} --queue-timeout ${QUEUE_TIMEOUT_SECONDS}`
      )
      const registered = await runCli(
        [
          "app",
          "register",
          "--max-concurrency",
          String(MAX_CONCURRENCY),
          "--max-queue",
          String(MAX_QUEUE),
          "--queue-timeout",
          String(QUEUE_TIMEOUT_SECONDS),
          join(repoRoot, "examples", `${APP}.ts`)
        ],
        { CORNSERVE_GATEWAY_URL: url }
      )
      if (registered.code !== 0)
        throw new Error(`registering ${APP} failed: ${registered.stderr}\nplatform output:\n${platform.tail()}`)
      const ready = await waitForApp(url, APP)
      const limits = ready.admission
      if (
        limits?.maxConcurrency !== MAX_CONCURRENCY ||
        limits.maxQueue !== MAX_QUEUE ||
        limits.queueTimeoutMs !== QUEUE_TIMEOUT_SECONDS * 1000
      )
        throw new Error(
          `${APP} runs under admission limits ${JSON.stringify(limits)}, not the ones it was registered with`
        )

      const snapshot = async () => {
        const processes = sampleProcesses(servePid, await taskOnDevice(url), APP)
        platform.remember(processes)
        return processes
      }

      // Phase 1: capacity.
      if (WARMUP_SECONDS > 0) {
        console.error(`warm-up: ${MAX_CONCURRENCY} clients in a closed loop for ${WARMUP_SECONDS} s`)
        const warmupAgent = agent()
        const warmup = await closedLoop(warmupAgent, gateway, MAX_CONCURRENCY, WARMUP_SECONDS, signal)
        warmupAgent.destroy()
        if (signal.aborted) return
        console.error(
          `  warm-up: ${warmup.tally.acceptedMs.length} accepted, ${warmup.tally.shedMs.length} shed, ${warmup.tally.errors} errors`
        )
      }
      console.error(`capacity: ${MAX_CONCURRENCY} clients in a closed loop for ${CAPACITY_SECONDS} s`)
      const capacityAgent = agent()
      const capacityRun = await closedLoop(capacityAgent, gateway, MAX_CONCURRENCY, CAPACITY_SECONDS, signal)
      capacityAgent.destroy()
      if (signal.aborted) return
      const capacity = capacityRun.tally
      const capacityRps = round(capacity.acceptedMs.length / (capacityRun.elapsedMs / 1000), 2)
      const capacityStats = latencyStats(capacity.acceptedMs)
      console.error(
        `  capacity: ${capacityRps} requests/s, p50 ${capacityStats.p50Ms} ms, p99 ${capacityStats.p99Ms} ms, ${capacity.shedMs.length} shed, ${capacity.errors} errors`
      )
      if (capacity.acceptedMs.length === 0)
        throw new Error(`no request was answered at capacity; platform output:\n${platform.tail()}`)
      await sleep(IDLE_AFTER_CAPACITY_MS)
      const before = await snapshot()

      // Phase 2: overload.
      const rate = round(capacityRps * OVERLOAD_FACTOR, 1)
      console.error(
        `overload: ${rate} requests/s (${OVERLOAD_FACTOR}x capacity) in an open loop for ${OVERLOAD_SECONDS} s`
      )
      const overloadAgent = agent()
      const overloadRun = await openLoop(overloadAgent, gateway, rate, OVERLOAD_SECONDS, signal)
      overloadAgent.destroy()
      if (signal.aborted) return
      const overload = overloadRun.tally
      const shedCounted = await shedMetric(url)

      // Phase 3: recovery.
      await sleep(IDLE_AFTER_OVERLOAD_MS)
      const after = await snapshot()
      const appAfter = await appState(url, APP)

      const accepted = latencyStats(overload.acceptedMs)
      const shed = latencyStats(overload.shedMs)
      const acceptedFromSend = latencyStats(overloadRun.fromSend.acceptedMs)
      const shedFromSend = latencyStats(overloadRun.fromSend.shedMs)
      const overloadSeconds = overloadRun.elapsedMs / 1000
      const acceptedRps = round(overload.acceptedMs.length / overloadSeconds, 2)
      const shedRps = round(overload.shedMs.length / overloadSeconds, 2)
      const acceptedP99Ratio = ratio(accepted.p99Ms, capacityStats.p99Ms)
      const rows = processRows(before, after)
      const serveRow = rows.find((row) => row.role === "serve")
      const serveRssRatio = serveRow?.ratio ?? null
      const changed = rows.filter((row) => row.ratio === null && row.role !== ESBUILD_ROLE)
      const otherErrors = capacity.errors + overload.errors
      const sendLag = {
        p50Ms: round(percentile(overloadRun.sendLagMs, 0.5), 2),
        p99Ms: round(percentile(overloadRun.sendLagMs, 0.99), 2),
        maxMs: round(overloadRun.sendLagMs.at(-1) ?? Number.NaN, 2)
      }
      const meets = {
        acceptedP99: acceptedP99Ratio !== null && acceptedP99Ratio <= TARGET.maxAcceptedP99Ratio,
        shedP99: shed.count === 0 || (shed.p99Ms !== null && shed.p99Ms < TARGET.maxShedP99Ms),
        errors: otherErrors === TARGET.otherErrors,
        serveRss: serveRssRatio !== null && serveRssRatio <= TARGET.maxServeRssRatio
      }
      const meetsTarget = Object.values(meets).every(Boolean)

      for (const [phase, tally] of [
        ["capacity", capacity],
        ["overload", overload]
      ] as const)
        for (const [why, count] of tally.errorKinds) console.error(`  ${phase} error (${count}x): ${why}`)

      console.log(
        `overload bench: ${APP} under admission maxConcurrency ${MAX_CONCURRENCY}, maxQueue ${MAX_QUEUE}, queue timeout ${QUEUE_TIMEOUT_SECONDS} s; capacity: closed loop of ${MAX_CONCURRENCY} clients for ${CAPACITY_SECONDS} s after ${WARMUP_SECONDS} s warm-up; overload: open loop at ${OVERLOAD_FACTOR}x capacity (${rate} requests/s) for ${OVERLOAD_SECONDS} s, latency from the due time ("from send": from the actual send)`
      )
      const latencyRow = (label: string, stats: LatencyStats, perSecond: number | null) => [
        label,
        String(stats.count),
        show(perSecond),
        show(stats.p50Ms),
        show(stats.p99Ms),
        show(stats.maxMs)
      ]
      printTable(
        ["answers", "count", "per s", "p50 ms", "p99 ms", "max ms"],
        [
          latencyRow("capacity: accepted", capacityStats, capacityRps),
          latencyRow("capacity: shed", latencyStats(capacity.shedMs), null),
          ["capacity: other errors", String(capacity.errors), "-", "-", "-", "-"],
          latencyRow("overload: accepted", accepted, acceptedRps),
          latencyRow("overload: shed", shed, shedRps),
          ...Object.entries(shedKinds(overload)).map(([kind, stats]) => latencyRow(`  shed ${kind}`, stats, null)),
          ["overload: other errors", String(overload.errors), "-", "-", "-", "-"],
          latencyRow("overload: accepted, from send", acceptedFromSend, null),
          latencyRow("overload: shed, from send", shedFromSend, null)
        ]
      )
      console.log("")
      console.log(
        `memory: VmRSS (shmem its RssShmem part) ${IDLE_AFTER_CAPACITY_MS / 1000} s after capacity and ${IDLE_AFTER_OVERLOAD_MS / 1000} s after overload`
      )
      printTable(
        ["role", "pid", "RSS before MiB", "RSS after MiB", "ratio", "shmem before MiB", "shmem after MiB"],
        rows.map((row) => [
          row.role,
          String(row.pid),
          show(row.beforeMiB),
          show(row.afterMiB),
          show(row.ratio),
          show(row.beforeShmemMiB),
          show(row.afterShmemMiB)
        ])
      )
      console.log("")
      if (changed.length > 0)
        console.log(
          `processes that started or stopped in between: ${changed.map((row) => `${row.role} (${row.pid})`).join(", ")}`
        )
      console.log(
        `load generator: ${overloadRun.sent} sent, send lag p50 ${sendLag.p50Ms} ms, p99 ${sendLag.p99Ms} ms, max ${sendLag.maxMs} ms; at most ${overloadRun.maxInFlight} in flight; ${overloadRun.unanswered} unanswered`
      )
      console.log(
        `platform's shed count (cornserve_requests_shed_total): ${JSON.stringify(shedCounted)}; ${APP} after recovery: ${show(appAfter?.inFlight as number | undefined)} in flight, ${show(appAfter?.queued as number | undefined)} queued`
      )
      console.log(
        `accepted p99 ${show(accepted.p99Ms)} ms = ${show(acceptedP99Ratio)}x capacity p99 (target <= ${TARGET.maxAcceptedP99Ratio}); shed p99 ${show(shed.p99Ms)} ms (target < ${TARGET.maxShedP99Ms}); ${otherErrors} other errors (target ${TARGET.otherErrors}); serve RSS ${show(serveRssRatio)}x (target <= ${TARGET.maxServeRssRatio}): ${meetsTarget ? "meets" : "misses"} the target`
      )
      console.log(
        JSON.stringify({
          bench: "overload",
          admission: {
            maxConcurrency: MAX_CONCURRENCY,
            maxQueue: MAX_QUEUE,
            queueTimeoutMs: QUEUE_TIMEOUT_SECONDS * 1000
          },
          warmupSeconds: WARMUP_SECONDS,
          capacitySeconds: CAPACITY_SECONDS,
          overloadSeconds: OVERLOAD_SECONDS,
          overloadFactor: OVERLOAD_FACTOR,
          capacity: {
            rps: capacityRps,
            accepted: capacityStats,
            shed: capacity.shedMs.length,
            errors: capacity.errors
          },
          overload: {
            rate,
            sent: overloadRun.sent,
            accepted: { ...accepted, rps: acceptedRps },
            shed: { ...shed, rps: shedRps, byKind: shedKinds(overload) },
            errors: overload.errors,
            errorKinds: Object.fromEntries(overload.errorKinds),
            unanswered: overloadRun.unanswered,
            acceptedP99Ratio,
            sendLag,
            fromSend: { accepted: acceptedFromSend, shed: shedFromSend },
            maxInFlight: overloadRun.maxInFlight,
            platformShedCount: shedCounted
          },
          recovery: {
            serveRssRatio,
            processes: rows,
            changedProcesses: changed.map(({ role, pid }) => ({ role, pid })),
            appInFlight: appAfter?.inFlight ?? null,
            appQueued: appAfter?.queued ?? null
          },
          target: TARGET,
          meets,
          meetsTarget
        })
      )
    },
    () => {
      for (const made of agents) made.destroy()
    }
  )
}
