/**
 * Resources that follow load: the rebalancing policy (src/control/resource-manager/Rebalance.ts)
 * against fixed splits of the same devices, simulated at fleet scale and measured live.
 *
 * 1. Simulated (bench/support/Simulator.ts, on the fleet of fleetScenario.ts): 1,000 devices, three
 *    dozen tasks and 38 apps under a load that is image-heavy, then text-heavy, then
 *    generation-heavy, with bursts. The policy starts from the devices split evenly and runs every
 *    5 s, with executors that take time to start and drain. For every phase, the best static split
 *    is searched for (from the split proportional to the phase's load and from the policy's mean
 *    split of that phase, moving executors to the tasks that lose requests, each candidate
 *    simulated over the whole phase). Goodput: requests answered within their target.
 * 2. Live: `cornserve serve` on ten CPU devices with color_chat and color_studio registered (five
 *    tasks), under the same open-loop trace twice: with the devices split evenly (two executors per
 *    task) and `--autoscale` moving them from there, as in the simulation, and with the same split
 *    fixed. (BENCH_AUTOSCALE_START=one starts the autoscaled run from one executor per task and
 *    five devices free instead: it then pays executors' start-ups during the trace, which the
 *    fixed split paid before it.) The trace's mix shifts: image chats (color_chat), then paintings, then sung tones
 *    (color_studio), each phase with the other two kinds at a sixth of their rate. Arrival times
 *    come from a seeded generator, the same for both runs.
 *
 * Targets (the issue on resources): simulated goodput at least 0.9 × the best static split's in
 * every phase; live goodput at least 1.3 × the even split's over the whole trace.
 *
 * Prints a table per part, then (as the last line) one JSON object with the figures and ratios.
 *
 * Env: BENCH_SIM_PHASE_SECONDS (default 300), BENCH_SEARCH_EVALUATIONS (default 30),
 * BENCH_LIVE=0 (simulation only), BENCH_PHASE_SECONDS (live, default 40), BENCH_WARMUP_SECONDS
 * (default 15), BENCH_CHAT_RATE (default 100), BENCH_PAINT_RATE (default 45), BENCH_SING_RATE
 * (default 40) in requests per second, BENCH_AUTOSCALE_INTERVAL (seconds, default 2),
 * BENCH_AUTOSCALE_START (even or one, default even), BENCH_DEVICES (live, default cpu:0 to cpu:9;
 * the even split gives each task as many of them as divide evenly, at least one).
 */
import { join } from "node:path"
import { performance } from "node:perf_hooks"
import { setTimeout as sleep } from "node:timers/promises"
import {
  defaultSimPolicy,
  devicesOf,
  evenSplit,
  type Scenario,
  type Split,
  searchStaticSplit,
  simulate
} from "./support/Simulator.js"
import { chatRequest } from "../test/support/colorChatRequest.js"
import { repoRoot, runCli } from "../test/support/platform.js"
import { round, withBenchPlatform } from "./support/colorChatPlatform.js"
import { fleetScenario } from "./support/fleetScenario.js"

function envNumber(name: string, fallback: number): number {
  const raw = process.env[name]
  if (raw === undefined || raw === "") return fallback
  const value = Number(raw)
  if (!Number.isFinite(value) || value < 0) throw new Error(`${name} must be a number >= 0, got ${raw}`)
  return value
}

const TARGET = { simulatedPerPhase: 0.9, live: 1.3 } as const

// ---------------------------------------------------------------------------------------------
// Simulated

/** The policy's mean split of a phase, rounded and fitted into the pool: a start for the search. */
const fitted = (scenario: Scenario, mean: Split): Split => {
  const split: Record<string, number> = {}
  for (const task of scenario.tasks) split[task.id] = Math.max(task.minExecutors, Math.round(mean[task.id] ?? 0))
  while (devicesOf(scenario, split) > scenario.devices) {
    const largest = scenario.tasks
      .filter((task) => split[task.id]! > task.minExecutors)
      .sort((a, b) => split[b.id]! * b.devicesPerExecutor - split[a.id]! * a.devicesPerExecutor)[0]!
    split[largest.id]!--
  }
  return split
}

const percent = (value: number) => `${(100 * value).toFixed(2)}%`

function simulated() {
  const scenario = fleetScenario({
    phaseSeconds: envNumber("BENCH_SIM_PHASE_SECONDS", 300),
    load: envNumber("BENCH_SIM_LOAD", 0.85)
  })
  const evaluations = Math.max(2, Math.floor(envNumber("BENCH_SEARCH_EVALUATIONS", 30)))
  const started = performance.now()
  const even = evenSplit(scenario)
  const policy = simulate(scenario, { split: even, policy: defaultSimPolicy(5_000) })
  const fixedEven = simulate(scenario, { split: even })
  const phases = scenario.phases.map((phase, index) => {
    const best = searchStaticSplit(scenario, index, {
      starts: [fitted(scenario, policy.meanSplit[index]!)],
      evaluations
    })
    const run = policy.phases[index]!
    return {
      phase: phase.name,
      requests: run.requests,
      bestStatic: best.result.goodput,
      policy: run.goodput,
      even: fixedEven.phases[index]!.goodput,
      ratio: best.result.good === 0 ? Number.NaN : run.good / best.result.good,
      evaluations: best.evaluations
    }
  })
  const seconds = (performance.now() - started) / 1000
  console.log(
    `simulated: ${scenario.devices} devices, ${scenario.tasks.length} tasks, ${scenario.apps.length} apps, ` +
      `${scenario.phases.length} phases of ${scenario.phases[0]!.durationMs / 1000} s; the policy made ${policy.moves} moves ` +
      `(${policy.devicesMoved} devices); ${round(seconds, 1)} s to simulate and search`
  )
  const rows = [
    ["phase", "requests", "best static", "policy", "policy/best", "even split", "searched"],
    ...phases.map((entry) => [
      entry.phase,
      String(entry.requests),
      percent(entry.bestStatic),
      percent(entry.policy),
      entry.ratio.toFixed(3),
      percent(entry.even),
      String(entry.evaluations)
    ])
  ]
  printTable(rows)
  return {
    devices: scenario.devices,
    tasks: scenario.tasks.length,
    apps: scenario.apps.length,
    moves: policy.moves,
    devicesMoved: policy.devicesMoved,
    phases: phases.map((entry) => ({
      ...entry,
      bestStatic: round(entry.bestStatic, 4),
      policy: round(entry.policy, 4),
      even: round(entry.even, 4),
      ratio: round(entry.ratio, 3)
    })),
    minRatio: round(Math.min(...phases.map((entry) => entry.ratio)), 3)
  }
}

function printTable(rows: ReadonlyArray<ReadonlyArray<string>>) {
  const widths = rows[0]!.map((_, column) => Math.max(...rows.map((row) => row[column]!.length)))
  for (const row of rows)
    console.log(
      row
        .map((cell, column) => (column === 0 ? cell.padEnd(widths[column]!) : cell.padStart(widths[column]!)))
        .join("  ")
    )
}

// ---------------------------------------------------------------------------------------------
// Live

type Kind = "chat" | "paint" | "sing"
const KINDS: ReadonlyArray<Kind> = ["chat", "paint", "sing"]
const DEVICES = process.env.BENCH_DEVICES ?? Array.from({ length: 10 }, (_, index) => `cpu:${index}`).join(",")
/** Answer within this, whole, or it does not count. */
const TARGET_MS: Record<Kind, number> = { chat: 1_000, paint: 2_500, sing: 2_500 }

const studioRequest = (output: "image" | "audio") => JSON.stringify({ ...JSON.parse(chatRequest), output })
const requestOf: Record<Kind, { readonly app: string; readonly body: string }> = {
  chat: { app: "color_chat", body: chatRequest },
  paint: { app: "color_studio", body: studioRequest("image") },
  sing: { app: "color_studio", body: studioRequest("audio") }
}

interface Arrival {
  readonly at: number
  readonly kind: Kind
  readonly phase: number
}

/** Poisson arrivals per kind and phase from a seeded generator: both runs send the same requests. */
function trace(phaseMs: number, rates: Record<Kind, number>, heavyPhases: ReadonlyArray<Kind>): Array<Arrival> {
  let state = 42
  const random = () => {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0
    return (state + 0.5) / 4294967296
  }
  const arrivals: Array<Arrival> = []
  heavyPhases.forEach((heavy, phase) => {
    for (const kind of KINDS) {
      const rate = kind === heavy ? rates[kind] : rates[kind] / 6
      if (rate <= 0) continue
      for (let t = -Math.log(random()) / rate; t * 1000 < phaseMs; t += -Math.log(random()) / rate)
        arrivals.push({ at: phase * phaseMs + t * 1000, kind, phase })
    }
  })
  return arrivals.sort((a, b) => a.at - b.at)
}

interface Tally {
  requests: number
  good: number
  late: number
  failed: number
}

/** The first answers of failed requests, to say what failed. */
const failures: Array<string> = []
const noteFailure = (what: string) => {
  if (failures.length < 5) failures.push(what.slice(0, 300))
}

/** Sends each arrival at its time (open loop); a request counts as good when answered whole within its target. */
async function drive(url: string, arrivals: ReadonlyArray<Arrival>, phases: number, signal: AbortSignal) {
  const tallies: Array<Tally> = Array.from({ length: phases }, () => ({ requests: 0, good: 0, late: 0, failed: 0 }))
  const start = performance.now()
  const inFlight = new Set<Promise<void>>()
  for (const arrival of arrivals) {
    if (signal.aborted) break
    const wait = start + arrival.at - performance.now()
    if (wait > 0) await sleep(wait)
    const tally = tallies[arrival.phase]!
    tally.requests++
    const { app, body } = requestOf[arrival.kind]
    const sent = performance.now()
    const call = (async () => {
      try {
        const response = await fetch(`${url}/app/invoke/${app}`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body
        })
        const text = await response.text()
        if (!response.ok || text.includes('"error"')) {
          tally.failed++
          noteFailure(`${arrival.kind} at ${Math.round(arrival.at)} ms: ${response.status} ${text}`)
        } else if (performance.now() - sent > TARGET_MS[arrival.kind]) tally.late++
        else tally.good++
      } catch (error) {
        tally.failed++
        // fetch says only "fetch failed"; why (a reset, a refusal, a closed socket) is its cause.
        const cause = error instanceof Error && error.cause !== undefined ? ` (${String(error.cause)})` : ""
        noteFailure(`${arrival.kind} at ${Math.round(arrival.at)} ms: ${String(error)}${cause}`)
      }
    })()
    inFlight.add(call)
    void call.finally(() => inFlight.delete(call))
  }
  await Promise.all(inFlight)
  return tallies
}

interface TaskRow {
  readonly id: string
  readonly name: string
  readonly executors: ReadonlyArray<unknown>
}

async function live(mode: "autoscale" | "even") {
  const phaseMs = envNumber("BENCH_PHASE_SECONDS", 40) * 1000
  const warmupMs = envNumber("BENCH_WARMUP_SECONDS", 15) * 1000
  const rates: Record<Kind, number> = {
    chat: envNumber("BENCH_CHAT_RATE", 100),
    paint: envNumber("BENCH_PAINT_RATE", 45),
    sing: envNumber("BENCH_SING_RATE", 40)
  }
  const interval = String(envNumber("BENCH_AUTOSCALE_INTERVAL", 2))
  const start = process.env.BENCH_AUTOSCALE_START ?? "even"
  if (start !== "even" && start !== "one") throw new Error(`BENCH_AUTOSCALE_START must be even or one, got ${start}`)
  let result: { tallies: Array<Tally>; moves: string; executors: string; failures: Array<string> } | undefined
  failures.length = 0
  await withBenchPlatform(
    `resources-${mode}`,
    "color_chat",
    async (platform) => {
      const env = { CORNSERVE_GATEWAY_URL: platform.url }
      for (const app of ["color_chat", "color_studio"]) {
        const registered = await runCli(["app", "register", join(repoRoot, "examples", `${app}.ts`)], env)
        if (registered.code !== 0) throw new Error(`registering ${app} failed: ${registered.stderr}`)
      }
      const tasks = async () =>
        ((await (await fetch(`${platform.url}/tasks/list`)).json()) as { tasks: Array<TaskRow> }).tasks
      if (mode === "even" || start === "even") {
        const listed = await tasks()
        const each = Math.floor(DEVICES.split(",").length / listed.length)
        for (const task of listed) {
          if (each <= 1) continue
          const scaled = await runCli(["tasks", "scale", task.id, `+${each - 1}`], env)
          if (scaled.code !== 0) throw new Error(`scaling ${task.id} failed: ${scaled.stderr}`)
        }
      }
      // Warm-up: every kind at a third of its rate, not measured.
      const third = { chat: rates.chat / 3, paint: rates.paint / 3, sing: rates.sing / 3 }
      const warm = trace(warmupMs, third, ["chat"])
      await drive(platform.url, warm, 1, platform.signal)
      const phases: Array<Kind> = ["chat", "paint", "sing"]
      const tallies = await drive(platform.url, trace(phaseMs, rates, phases), phases.length, platform.signal)
      const metrics = await (
        await fetch(`${platform.url}/metrics`, {
          headers: { authorization: `Bearer ${process.env.CORNSERVE_ADMIN_TOKEN}` }
        })
      ).text()
      const moves = [...metrics.matchAll(/^cornserve_rebalance_moves_total\{kind="(\w+)"\} (\d+)$/gm)]
        .map((match) => `${match[1]} ${match[2]}`)
        .join(", ")
      const executors = (await tasks())
        .map((task) => `${task.name.split("-tiny")[0]} ${task.executors.length}`)
        .join(", ")
      for (const line of platform.rebalancing()) console.error(`${mode}: ${line.slice(0, 400)}`)
      result = { tallies, moves: moves || "none", executors, failures: [...failures] }
    },
    undefined,
    { devices: DEVICES, args: mode === "autoscale" ? ["--autoscale", "--autoscale-interval", interval] : [] }
  )
  return result!
}

export default async function main() {
  const sim = simulated()
  if (process.env.BENCH_LIVE === "0") {
    console.log(
      JSON.stringify({
        bench: "resources",
        simulated: sim,
        meetsTarget: { simulated: sim.minRatio >= TARGET.simulatedPerPhase }
      })
    )
    return
  }
  console.log("")
  const autoscale = await live("autoscale")
  const even = await live("even")
  const phaseNames = ["image chats", "paintings", "sung tones"]
  const rows = [["phase", "requests", "autoscale good", "even good", "autoscale/even"]]
  const sum = (tallies: ReadonlyArray<Tally>, key: keyof Tally) =>
    tallies.reduce((total, tally) => total + tally[key], 0)
  phaseNames.forEach((name, index) => {
    const [a, e] = [autoscale.tallies[index]!, even.tallies[index]!]
    rows.push([
      name,
      String(a.requests),
      String(a.good),
      String(e.good),
      e.good === 0 ? "inf" : (a.good / e.good).toFixed(3)
    ])
  })
  const [goodAuto, goodEven] = [sum(autoscale.tallies, "good"), sum(even.tallies, "good")]
  rows.push([
    "whole trace",
    String(sum(autoscale.tallies, "requests")),
    String(goodAuto),
    String(goodEven),
    (goodAuto / Math.max(1, goodEven)).toFixed(3)
  ])
  console.log(
    `live: color_chat and color_studio on ${DEVICES}, autoscaled from ${process.env.BENCH_AUTOSCALE_START === "one" ? "one executor per task" : "the even split"}; good = answered whole within its target (chat 1 s, paint and sing 2.5 s)`
  )
  printTable(rows)
  for (const [label, run] of [
    ["autoscale", autoscale],
    ["even", even]
  ] as const) {
    console.log(
      `${label}: late ${sum(run.tallies, "late")}, failed ${sum(run.tallies, "failed")}; moves: ${run.moves}; executors at the end: ${run.executors}`
    )
    for (const failure of run.failures) console.log(`  ${label} failed: ${failure}`)
  }
  const liveRatio = goodAuto / Math.max(1, goodEven)
  console.log(
    JSON.stringify({
      bench: "resources",
      simulated: sim,
      live: {
        autoscale: autoscale.tallies,
        even: even.tallies,
        moves: autoscale.moves,
        autoscaleStart: process.env.BENCH_AUTOSCALE_START ?? "even",
        ratio: round(liveRatio, 3)
      },
      meetsTarget: { simulated: sim.minRatio >= TARGET.simulatedPerPhase, live: liveRatio >= TARGET.live }
    })
  )
}
