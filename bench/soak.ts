/**
 * Soak: whether the platform holds on to anything over many requests.
 *
 * Starts the real platform (`bin/cornserve serve`) as color_chat's tests do (three CPU devices, a
 * 64 MiB sidecar arena, color_chat registered and nothing else) in a state directory of its own,
 * sends BENCH_WARMUP_REQUESTS color_chat requests to warm it up, then BENCH_REQUESTS more, each
 * time from BENCH_CONCURRENCY clients in a closed loop. The bench spawns the platform itself rather
 * than through startColorChat (which needs vitest) and keeps only the last lines of its output, so
 * that a long soak does not grow the bench's own memory. Every answer is checked: status 200 and the
 * colour "red" in the streamed text; anything else counts as an error.
 *
 * After the warm-up and again at the end it records, for the serve process and every process below
 * it (sidecar, each executor's router, engine and workers, the app's process): its resident set
 * (VmRSS in /proc/<pid>/status, with the part of it that is shared memory, RssShmem); the bytes of
 * this platform's files in /dev/shm (the sidecar's arena and the engines' batch buffers, whose
 * names end with their owner's pid); and the sidecar's transfers in progress, arena slots and bytes
 * held, from the gateway's /metrics. Transfers are released asynchronously after the answer has
 * gone out, so before each reading it waits a few seconds at most for those three to reach zero.
 *
 * A leak shows as a process whose resident set keeps growing once the caches and pools of the
 * warm-up have filled, or as transfers, slots or bytes still held when no request is in flight.
 * Target: every process's RSS within +10% of its warm level, the same processes at the end as
 * after the warm-up (a restarted process would hide its growth), the sidecar's transfers, slots and
 * bytes back to zero, and no error. Resident memory includes the pages of the shared arena a
 * process has touched, which can grow without a leak while the allocator reaches parts of the arena
 * it had not used yet; the RssShmem columns tell that growth apart.
 *
 * Each process's resident set goes up and down as its garbage collector runs (by tens of MiB for
 * some), so one reading can land anywhere in that swing. The levels compared are therefore peaks:
 * the highest resident set of each process over the last BENCH_PEAK_WINDOW requests of the warm-up
 * (sampled every 500 ms, the reading after the warm-up included) against the same over the last
 * BENCH_PEAK_WINDOW requests of the soak. A leak raises the later peak; the swing does not.
 *
 * The warm-up is long because a Node process's resident set is not at its working size until V8
 * has collected its old generation once, which it first does when that generation reaches its
 * initial limit: under this load the serve process's heap grows from 36 MB to about 140 MB over
 * some 12,000 requests before its first mark-compact brings it back to 42 MB (`node --trace-gc`),
 * after which each mark-compact leaves the same 41-42 MB. A shorter warm-up measures that first
 * climb (about +40% for the serve and app processes after 500 requests), not a leak.
 *
 * Prints a table, then (as the last line) one JSON object with the figures and the growth ratios.
 *
 * Env: BENCH_REQUESTS (default 10000), BENCH_CONCURRENCY (default 8), BENCH_WARMUP_REQUESTS
 * (default 15000), BENCH_PEAK_WINDOW (default 3000).
 */
import { readdirSync, statSync } from "node:fs"
import { join } from "node:path"
import { performance } from "node:perf_hooks"
import { setTimeout as sleep } from "node:timers/promises"
import { batchBufferPrefix } from "../src/executors/common/BatchBuffer.js"
import { arenaFilePrefix } from "../src/sidecar/Arena.js"
import { ESBUILD_ROLE, type ProcessSample, readStat, sampleProcesses, taskOnDevice } from "./support/processes.js"
import {
  benchNodeId,
  mib,
  percentile,
  round,
  START_TIMEOUT_MS,
  withBenchPlatform
} from "./support/colorChatPlatform.js"
import { chatRequest, outcomeOf } from "../test/support/colorChatRequest.js"
import { repoRoot, runCli } from "../test/support/platform.js"

const REQUESTS = envInteger("BENCH_REQUESTS", 10_000, 1)
const CONCURRENCY = envInteger("BENCH_CONCURRENCY", 8, 1)
const WARMUP_REQUESTS = envInteger("BENCH_WARMUP_REQUESTS", 15_000, 0)
const PEAK_WINDOW = envInteger("BENCH_PEAK_WINDOW", 3_000, 0)
const PEAK_INTERVAL_MS = 500
/** The target: each resident set at most this ratio of its warm level, the sidecar's gauges back to these values, no error. */
const TARGET = { maxRssGrowth: 1.1, transfersActive: 0, slotsInUse: 0, bytesInUse: 0, errors: 0 } as const

const APP = "color_chat"
const NODE_ID = benchNodeId("soak")
const SHM_DIR = "/dev/shm"
/** How long a reading of the sidecar waits at most for the transfers of finished requests to be released. */
const SETTLE_TIMEOUT_MS = 5_000

function envInteger(name: string, fallback: number, min: number): number {
  const raw = process.env[name]
  if (raw === undefined || raw === "") return fallback
  const value = Number(raw)
  if (!Number.isSafeInteger(value) || value < min) throw new Error(`${name} must be an integer >= ${min}, got ${raw}`)
  return value
}

// ---------------------------------------------------------------------------------------------
// The platform

async function waitForApp(url: string, app: string): Promise<void> {
  const deadline = Date.now() + START_TIMEOUT_MS
  while (Date.now() < deadline) {
    const response = await fetch(`${url}/app/list`).catch(() => undefined)
    if (response?.ok) {
      const body = (await response.json()) as { apps?: Array<{ id?: unknown; state?: unknown }> }
      if (body.apps?.some((entry) => entry.id === app && entry.state === "ready")) return
    }
    await sleep(200)
  }
  throw new Error(`app ${app} was not ready within ${START_TIMEOUT_MS} ms`)
}

// ---------------------------------------------------------------------------------------------
// /dev/shm and the sidecar

interface ShmSample {
  readonly bytes: number
  readonly files: number
  /** Files of this platform whose owner is no longer running. */
  readonly abandoned: number
}

/**
 * This platform's files in /dev/shm: the arena (`cornserve-arena-<node id>-<pid>`, the node id being
 * this bench's own) and batch buffers (`cornserve-batches-<pid>`) whose pid is one of the platform's
 * processes, now or at an earlier sample.
 */
function sampleShm(ownPids: ReadonlySet<number>): ShmSample {
  let bytes = 0
  let files = 0
  let abandoned = 0
  let names: Array<string>
  try {
    names = readdirSync(SHM_DIR)
  } catch {
    return { bytes: 0, files: 0, abandoned: 0 }
  }
  for (const name of names) {
    const pid = Number(/-(\d+)$/.exec(name)?.[1])
    const ours =
      name.startsWith(`${arenaFilePrefix}${NODE_ID}-`) || (name.startsWith(batchBufferPrefix) && ownPids.has(pid))
    if (!ours) continue
    try {
      bytes += statSync(join(SHM_DIR, name)).size
    } catch {
      continue // removed since the listing
    }
    files++
    if (readStat(pid) === undefined) abandoned++
  }
  return { bytes, files, abandoned }
}

interface SidecarSample {
  readonly transfersActive: number | null
  readonly slotsInUse: number | null
  readonly bytesInUse: number | null
  /** How long the reading waited for the three to reach zero. */
  readonly waitedMs: number
}

/** The sum of a metric's samples in Prometheus text, or null when it is absent. */
function metricValue(text: string, name: string): number | null {
  let sum: number | null = null
  for (const line of text.split("\n")) {
    if (!line.startsWith(name)) continue
    const rest = line.slice(name.length)
    if (rest[0] !== "{" && rest[0] !== " ") continue
    const value = Number(line.slice(line.lastIndexOf(" ") + 1))
    if (Number.isFinite(value)) sum = (sum ?? 0) + value
  }
  return sum
}

/**
 * The sidecar's transfers in progress, slots and bytes held. The sidecar releases a transfer once
 * its receivers mark it done, which may come after the client has its answer; so this polls for at
 * most SETTLE_TIMEOUT_MS until all three are zero, and gives the last reading either way.
 */
async function sampleSidecar(url: string): Promise<SidecarSample> {
  const started = performance.now()
  for (;;) {
    const text = await fetch(`${url}/metrics`, {
      headers: { authorization: `Bearer ${process.env.CORNSERVE_ADMIN_TOKEN}` }
    })
      .then((response) => (response.ok ? response.text() : ""))
      .catch(() => "")
    const sample = {
      transfersActive: metricValue(text, "cornserve_sidecar_transfers_active"),
      slotsInUse: metricValue(text, "cornserve_sidecar_slots_in_use"),
      bytesInUse: metricValue(text, "cornserve_sidecar_bytes_in_use")
    }
    const waitedMs = Math.round(performance.now() - started)
    const settled = sample.transfersActive === 0 && sample.slotsInUse === 0 && sample.bytesInUse === 0
    if (settled || waitedMs >= SETTLE_TIMEOUT_MS) return { ...sample, waitedMs }
    await sleep(100)
  }
}

interface Snapshot {
  readonly processes: ReadonlyArray<ProcessSample>
  readonly shm: ShmSample
  readonly sidecar: SidecarSample
}

// ---------------------------------------------------------------------------------------------
// Load

interface Phase {
  readonly ok: number
  readonly errors: number
  readonly errorSamples: ReadonlyArray<string>
  readonly latenciesMs: ReadonlyArray<number>
  readonly elapsedMs: number
}

/** One color_chat request: undefined when it was answered as expected, else what went wrong. */
async function askColour(url: string, signal: AbortSignal): Promise<string | undefined> {
  // A signal of its own per request: fetch keeps a listener on the signal it is given until the
  // request is garbage-collected, so the bench's one stop signal would gather thousands.
  const controller = new AbortController()
  const stop = () => controller.abort()
  signal.addEventListener("abort", stop, { once: true })
  try {
    const response = await fetch(`${url}/app/invoke/${APP}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: chatRequest,
      signal: controller.signal
    })
    const outcome = await outcomeOf(response)
    if ("text" in outcome) return outcome.text.toLowerCase().includes("red") ? undefined : `answered ${outcome.text}`
    if ("status" in outcome) return `status ${outcome.status}: ${outcome.error.slice(0, 200)}`
    return `stream cut after ${JSON.stringify(outcome.cut)}`
  } finally {
    signal.removeEventListener("abort", stop)
  }
}

/** `total` requests from `concurrency` clients, each sending its next request once it has the last answer. */
/**
 * The highest resident set of each process of the platform while it samples, and readings raised
 * to those peaks.
 */
function peakSampler(servePid: number, roles: ReadonlyMap<string, string>) {
  const key = (sample: ProcessSample) => `${sample.pid}/${sample.startTime}`
  let peaks = new Map<string, ProcessSample>()
  let timer: NodeJS.Timeout | undefined
  const sample = () => {
    for (const current of sampleProcesses(servePid, roles, APP)) {
      const peak = peaks.get(key(current))
      if (peak === undefined || current.rssKiB > peak.rssKiB) peaks.set(key(current), current)
    }
  }
  return {
    /** Starts a window (forgetting the last one's peaks). */
    start() {
      if (timer !== undefined) return
      peaks = new Map()
      sample()
      timer = setInterval(sample, PEAK_INTERVAL_MS)
    },
    stop() {
      clearInterval(timer)
      timer = undefined
    },
    /** Each reading, or the window's peak of its process when that was higher. */
    raise(readings: ReadonlyArray<ProcessSample>): Array<ProcessSample> {
      return readings.map((reading) => {
        const peak = peaks.get(key(reading))
        return peak !== undefined && peak.rssKiB > reading.rssKiB
          ? { ...reading, rssKiB: peak.rssKiB, shmemKiB: peak.shmemKiB }
          : reading
      })
    }
  }
}

async function closedLoop(
  label: string,
  url: string,
  total: number,
  concurrency: number,
  signal: AbortSignal,
  /** Told how many requests are done, after each. */
  onDone: (done: number) => void = () => undefined
): Promise<Phase> {
  const latenciesMs: Array<number> = []
  const errorSamples: Array<string> = []
  let errors = 0
  let sent = 0
  let done = 0
  const step = Math.max(1, Math.round(total / 10))
  const started = performance.now()
  const client = async () => {
    while (sent < total && !signal.aborted) {
      sent++
      const sentAt = performance.now()
      const failure = await askColour(url, signal).catch((error: unknown) => String(error))
      if (failure === undefined) latenciesMs.push(performance.now() - sentAt)
      else {
        errors++
        if (errorSamples.length < 5) errorSamples.push(failure)
      }
      done++
      onDone(done)
      if (done % step === 0 || done === total)
        console.error(`  ${label}: ${done}/${total}, ${errors} errors, ${Math.round(performance.now() - started)} ms`)
    }
  }
  await Promise.all(Array.from({ length: Math.min(concurrency, total) }, client))
  return { ok: latenciesMs.length, errors, errorSamples, latenciesMs, elapsedMs: performance.now() - started }
}

// ---------------------------------------------------------------------------------------------
// Report

interface ProcessRow {
  readonly role: string
  readonly pid: number
  readonly warmMiB: number | null
  readonly endMiB: number | null
  /** End over warm; null when the process is in one snapshot only. */
  readonly growth: number | null
  readonly warmShmemMiB: number | null
  readonly endShmemMiB: number | null
  readonly meetsTarget: boolean
}

function processRows(warm: ReadonlyArray<ProcessSample>, end: ReadonlyArray<ProcessSample>): Array<ProcessRow> {
  const key = (sample: ProcessSample) => `${sample.pid}/${sample.startTime}`
  const endByKey = new Map(end.map((sample) => [key(sample), sample]))
  const warmKeys = new Set(warm.map(key))
  const row = (w: ProcessSample | undefined, e: ProcessSample | undefined): ProcessRow => {
    const growth = w !== undefined && e !== undefined && w.rssKiB > 0 ? round(e.rssKiB / w.rssKiB, 3) : null
    const role = (e ?? w)!.role
    return {
      role,
      pid: (e ?? w)!.pid,
      warmMiB: w === undefined ? null : mib(w.rssKiB),
      endMiB: e === undefined ? null : mib(e.rssKiB),
      growth,
      warmShmemMiB: w === undefined ? null : mib(w.shmemKiB),
      endShmemMiB: e === undefined ? null : mib(e.shmemKiB),
      // A process in one snapshot only has exited or been (re)started in between; the esbuild service stops by design.
      meetsTarget: growth === null ? role === ESBUILD_ROLE && e === undefined : growth <= TARGET.maxRssGrowth
    }
  }
  return [
    ...warm.map((w) => row(w, endByKey.get(key(w)))),
    ...end.filter((e) => !warmKeys.has(key(e))).map((e) => row(undefined, e))
  ]
}

function printTable(rows: ReadonlyArray<ProcessRow>): void {
  const show = (value: number | null, format: (value: number) => string = String) =>
    value === null ? "-" : format(value)
  const header = ["role", "pid", "RSS warm MiB", "RSS end MiB", "growth %", "shmem warm MiB", "shmem end MiB"]
  const cells = rows.map((row) => [
    row.role,
    String(row.pid),
    show(row.warmMiB),
    show(row.endMiB),
    show(row.growth, (growth) => `${growth >= 1 ? "+" : ""}${((growth - 1) * 100).toFixed(1)}`),
    show(row.warmShmemMiB),
    show(row.endShmemMiB)
  ])
  const widths = header.map((title, column) => Math.max(title.length, ...cells.map((line) => line[column]!.length)))
  const line = (values: ReadonlyArray<string>) =>
    values
      .map((value, column) => (column === 0 ? value.padEnd(widths[0]!) : value.padStart(widths[column]!)))
      .join("  ")
  console.log(line(header))
  for (const values of cells) console.log(line(values))
}

const sidecarText = (sample: SidecarSample) =>
  `transfers active ${sample.transfersActive ?? "?"}, slots in use ${sample.slotsInUse ?? "?"}, bytes in use ${sample.bytesInUse ?? "?"} (after waiting ${sample.waitedMs} ms)`

// ---------------------------------------------------------------------------------------------

export default function soakBench(): Promise<void> {
  return withBenchPlatform("soak", APP, async (platform) => {
    const { url, signal } = platform
    const servePid = platform.child.pid!
    console.error(`cornserve at ${url}; registering ${APP}`)
    const registered = await runCli(["app", "register", join(repoRoot, "examples", `${APP}.ts`)], {
      CORNSERVE_GATEWAY_URL: url
    })
    if (registered.code !== 0)
      throw new Error(`registering ${APP} failed: ${registered.stderr}\nplatform output:\n${platform.tail()}`)
    await waitForApp(url, APP)

    const snapshot = async (): Promise<Snapshot> => {
      // The sidecar first: its wait lets the last requests' transfers go before memory is read.
      const sidecar = await sampleSidecar(url)
      const processes = sampleProcesses(servePid, await taskOnDevice(url), APP)
      platform.remember(processes)
      return { processes, shm: sampleShm(platform.pids()), sidecar }
    }

    const peaks = peakSampler(servePid, await taskOnDevice(url))
    const sampleFrom = (total: number) => (done: number) => {
      if (done >= total - PEAK_WINDOW) peaks.start()
    }
    console.error(`warm-up: ${WARMUP_REQUESTS} requests at concurrency ${CONCURRENCY}`)
    const warmup = await closedLoop("warm-up", url, WARMUP_REQUESTS, CONCURRENCY, signal, sampleFrom(WARMUP_REQUESTS))
    if (signal.aborted) return
    const warmReading = await snapshot()
    const warm = { ...warmReading, processes: peaks.raise(warmReading.processes) }
    peaks.stop()
    console.error(`soak: ${REQUESTS} requests at concurrency ${CONCURRENCY}`)
    const phase = await closedLoop("soak", url, REQUESTS, CONCURRENCY, signal, sampleFrom(REQUESTS))
    if (signal.aborted) return
    const endReading = await snapshot()
    const end = { ...endReading, processes: peaks.raise(endReading.processes) }
    peaks.stop()

    for (const sample of [...warmup.errorSamples, ...phase.errorSamples]) console.error(`  error: ${sample}`)
    const sorted = [...phase.latenciesMs].sort((a, b) => a - b)
    const rps = round(phase.ok / (phase.elapsedMs / 1000), 2)
    const p50Ms = round(percentile(sorted, 0.5), 1)
    const p99Ms = round(percentile(sorted, 0.99), 1)
    const rows = processRows(warm.processes, end.processes)
    const sidecarBack =
      end.sidecar.transfersActive === TARGET.transfersActive &&
      end.sidecar.slotsInUse === TARGET.slotsInUse &&
      end.sidecar.bytesInUse === TARGET.bytesInUse
    const meetsTarget = phase.errors === TARGET.errors && sidecarBack && rows.every((row) => row.meetsTarget)

    console.log(
      `soak bench: ${REQUESTS} ${APP} requests at concurrency ${CONCURRENCY} after ${WARMUP_REQUESTS} warm-up requests (${warmup.errors} errors); RSS is the peak VmRSS over the last ${PEAK_WINDOW} requests of each, shmem its RssShmem part`
    )
    printTable(rows)
    console.log(
      `/dev/shm: warm ${warm.shm.bytes} bytes in ${warm.shm.files} files, end ${end.shm.bytes} bytes in ${end.shm.files} files (${end.shm.abandoned} of them abandoned)`
    )
    console.log(`sidecar warm: ${sidecarText(warm.sidecar)}`)
    console.log(`sidecar end:  ${sidecarText(end.sidecar)}`)
    console.log(
      `throughput ${rps} requests/s, latency p50 ${p50Ms} ms, p99 ${p99Ms} ms, ${phase.errors} errors of ${REQUESTS}`
    )
    console.log(
      JSON.stringify({
        bench: "soak",
        requests: REQUESTS,
        warmupRequests: WARMUP_REQUESTS,
        concurrency: CONCURRENCY,
        errors: phase.errors,
        warmupErrors: warmup.errors,
        rps,
        p50Ms,
        p99Ms,
        processes: rows.map(({ role, pid, warmMiB, endMiB, growth, warmShmemMiB, endShmemMiB }) => ({
          role,
          pid,
          warmMiB,
          endMiB,
          growth,
          warmShmemMiB,
          endShmemMiB
        })),
        shm: { warmBytes: warm.shm.bytes, endBytes: end.shm.bytes, endAbandonedFiles: end.shm.abandoned },
        sidecar: {
          transfersActive: end.sidecar.transfersActive,
          slotsInUse: end.sidecar.slotsInUse,
          bytesInUse: end.sidecar.bytesInUse,
          waitedMs: end.sidecar.waitedMs
        },
        target: TARGET,
        meetsTarget
      })
    )
  })
}
