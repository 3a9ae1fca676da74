/**
 * Fairness: whether an app that sends a few requests keeps its latency while another app floods
 * the tasks both use.
 *
 * Starts the real platform as bench/soak.ts does (three CPU devices, color_chat's tasks, no cache
 * of encoder outputs, so that every request reaches the encoder) and registers color_chat twice,
 * as `steady` and as `flood`: two apps on the same three tasks. A steady client sends one request
 * at a time (a closed loop of one). Three phases of BENCH_SECONDS each, after a warm-up:
 *
 * 1. Alone: the steady client through `steady`, nothing else. Its p50 is the baseline.
 * 2. Fair: BENCH_FLOOD_CLIENTS clients in a closed loop through `flood`, and the steady client
 *    through `steady`. The executors' queues serve the two apps by weighted fair queuing.
 * 3. One queue: the same flood, and the steady client through `flood` too: its requests wait in
 *    the same app's arrival order as the flood's, which is what a FIFO queue gives every app.
 * 4. Limited: `flood` registered again with `--max-calls-per-task BENCH_FLOOD_LIMIT`: the same
 *    flood, of which that many calls per task reach the executors at once; the steady client
 *    through `steady`.
 *
 * Target (the issue on resources): the steady app's p50 while another floods at most 2x its p50
 * alone, judged apart for fair queues alone (phase 2) and for fair queues with the flood held to
 * its per-task limit (phase 4). The third phase shows what the fair queues save. The load
 * generator runs on the same machine and competes with the platform for CPU, in every phase
 * alike: on a machine whose cores the flood saturates, the steady request waits for CPU in every
 * process it crosses, which no executor queue can reorder; holding the flood at the dispatcher does.
 *
 * Prints a table, then (as the last line) one JSON object with the figures and the ratios.
 *
 * Env: BENCH_SECONDS (default 15), BENCH_FLOOD_CLIENTS (default 24), BENCH_FLOOD_LIMIT (default 1),
 * BENCH_WARMUP_SECONDS (default 10).
 */
import { join } from "node:path"
import { performance } from "node:perf_hooks"
import { percentile, round, withBenchPlatform } from "./support/colorChatPlatform.js"
import { chatRequest, outcomeOf } from "../test/support/colorChatRequest.js"
import { repoRoot, runCli } from "../test/support/platform.js"

const SECONDS = envNumber("BENCH_SECONDS", 15)
const FLOOD_CLIENTS = Math.floor(envNumber("BENCH_FLOOD_CLIENTS", 24))
const FLOOD_LIMIT = Math.floor(envNumber("BENCH_FLOOD_LIMIT", 1))
const WARMUP_SECONDS = envNumber("BENCH_WARMUP_SECONDS", 10)
const TARGET = { maxFairP50Ratio: 2 } as const

function envNumber(name: string, fallback: number): number {
  const raw = process.env[name]
  if (raw === undefined || raw === "") return fallback
  const value = Number(raw)
  if (!Number.isFinite(value) || value <= 0) throw new Error(`${name} must be a positive number, got "${raw}"`)
  return value
}

interface Tally {
  readonly latencies: Array<number>
  errors: number
}

/** `clients` closed loops through `app` until `until`; each answer checked for the colour. */
const load = (url: string, app: string, clients: number, until: () => boolean): Promise<Tally> => {
  const tally: Tally = { latencies: [], errors: 0 }
  const client = async () => {
    while (!until()) {
      const began = performance.now()
      try {
        const response = await fetch(`${url}/app/invoke/${app}`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: chatRequest
        })
        const outcome = await outcomeOf(response)
        if ("text" in outcome && outcome.text === "red") tally.latencies.push(performance.now() - began)
        else tally.errors++
      } catch {
        tally.errors++
      }
    }
  }
  return Promise.all(Array.from({ length: clients }, client)).then(() => tally)
}

const summary = (tally: Tally, seconds: number) => {
  const sorted = [...tally.latencies].sort((a, b) => a - b)
  return {
    count: sorted.length,
    perSecond: round(sorted.length / seconds, 2),
    p50Ms: round(percentile(sorted, 0.5), 2),
    p99Ms: round(percentile(sorted, 0.99), 2),
    errors: tally.errors
  }
}

/** One phase: the steady client through `steadyApp`, with the flood's clients through `flood` when asked. */
const phase = async (url: string, steadyApp: string, flood: boolean) => {
  const deadline = performance.now() + SECONDS * 1000
  const over = () => performance.now() >= deadline
  const [steady, flooding] = await Promise.all([
    load(url, steadyApp, 1, over),
    flood ? load(url, "flood", FLOOD_CLIENTS, over) : Promise.resolve(undefined)
  ])
  return { steady: summary(steady, SECONDS), flood: flooding === undefined ? undefined : summary(flooding, SECONDS) }
}

export default function main(): Promise<void> {
  return withBenchPlatform("fairness", "steady", async (platform) => {
    for (const name of ["steady", "flood"]) {
      const registered = await runCli(
        ["app", "register", join(repoRoot, "examples", "color_chat.ts"), "--name", name],
        { CORNSERVE_GATEWAY_URL: platform.url }
      )
      if (registered.code !== 0) throw new Error(`registering ${name}: ${registered.stderr}`)
    }
    console.log(`cornserve at ${platform.url}; color_chat registered as steady and as flood (the same tasks)`)
    const warmUntil = performance.now() + WARMUP_SECONDS * 1000
    await Promise.all([
      load(platform.url, "steady", 1, () => performance.now() >= warmUntil),
      load(platform.url, "flood", 4, () => performance.now() >= warmUntil)
    ])

    const alone = await phase(platform.url, "steady", false)
    console.log(`  alone: steady p50 ${alone.steady.p50Ms} ms`)
    const fair = await phase(platform.url, "steady", true)
    console.log(`  fair queues: steady p50 ${fair.steady.p50Ms} ms, flood ${fair.flood!.perSecond} requests/s`)
    const shared = await phase(platform.url, "flood", true)
    console.log(`  one queue: steady p50 ${shared.steady.p50Ms} ms, flood ${shared.flood!.perSecond} requests/s`)
    const limitedFlood = await runCli(
      [
        "app",
        "register",
        join(repoRoot, "examples", "color_chat.ts"),
        "--name",
        "flood",
        "--replace",
        "--max-calls-per-task",
        String(FLOOD_LIMIT)
      ],
      { CORNSERVE_GATEWAY_URL: platform.url }
    )
    if (limitedFlood.code !== 0) throw new Error(`registering flood again: ${limitedFlood.stderr}`)
    const limited = await phase(platform.url, "steady", true)
    console.log(`  limited: steady p50 ${limited.steady.p50Ms} ms, flood ${limited.flood!.perSecond} requests/s`)

    const fairRatio = round(fair.steady.p50Ms / alone.steady.p50Ms, 3)
    const oneQueueRatio = round(shared.steady.p50Ms / alone.steady.p50Ms, 3)
    const limitedRatio = round(limited.steady.p50Ms / alone.steady.p50Ms, 3)
    const rows: Array<[string, ReturnType<typeof summary> | undefined]> = [
      ["alone: steady", alone.steady],
      ["fair queues: steady", fair.steady],
      ["fair queues: flood", fair.flood],
      ["one queue: steady", shared.steady],
      ["one queue: flood", shared.flood],
      ["limited: steady", limited.steady],
      ["limited: flood", limited.flood]
    ]
    console.log(
      `fairness bench: color_chat as two apps on shared tasks; the steady app sends one request at a time, the flood app ${FLOOD_CLIENTS} at a time; ${SECONDS} s per phase`
    )
    console.log(
      `${"requests".padEnd(22)}${["count", "per s", "p50 ms", "p99 ms", "errors"].map((h) => h.padStart(9)).join("")}`
    )
    for (const [label, row] of rows) {
      if (row === undefined) continue
      console.log(
        `${label.padEnd(22)}${[row.count, row.perSecond, row.p50Ms, row.p99Ms, row.errors].map((value) => String(value).padStart(9)).join("")}`
      )
    }
    const errors = rows.reduce((sum, [, row]) => sum + (row?.errors ?? 0), 0)
    // Both of the platform's means, judged apart: fair queues alone, and fair queues with the
    // flooding app held to its per-task limit at the dispatcher.
    const meetsTarget = {
      fairQueues: fairRatio <= TARGET.maxFairP50Ratio && errors === 0,
      fairQueuesAndLimit: limitedRatio <= TARGET.maxFairP50Ratio && errors === 0
    }
    const verdict = (met: boolean) => (met ? "meets" : "misses")
    console.log(
      `steady p50 with the flood: ${fairRatio}x alone with fair queues (target <= ${TARGET.maxFairP50Ratio}: ${verdict(meetsTarget.fairQueues)}), ` +
        `${limitedRatio}x with the flood also held to ${FLOOD_LIMIT} call(s) per task (${verdict(meetsTarget.fairQueuesAndLimit)}), ` +
        `${oneQueueRatio}x in one queue; ${errors} errors`
    )
    console.log(
      JSON.stringify({
        bench: "fairness",
        seconds: SECONDS,
        floodClients: FLOOD_CLIENTS,
        alone,
        fair,
        oneQueue: shared,
        limited,
        floodLimit: FLOOD_LIMIT,
        fairP50Ratio: fairRatio,
        oneQueueP50Ratio: oneQueueRatio,
        limitedP50Ratio: limitedRatio,
        errors,
        target: TARGET,
        meetsTarget
      })
    )
  })
}
