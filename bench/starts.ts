/**
 * Starts: what a cold start costs in CPU, process by process. Each round starts `cornserve serve`
 * on two CPU devices and a fresh state directory, registers color_chat (its image and audio
 * encoders and its LLM: three executors) with the CLI, sends it its own example chat, and then
 * reads, before anything stops, the CPU time (user + system, from /proc) each process below `serve` has used
 * since it started: serve itself, the sidecar, the app's process, each executor's router and its
 * worker. That is what a platform's cold start costs the machine, and most of what the test suite
 * spends: its files start about two thousand Node processes.
 *
 * Baseline, measured in the same run: a bare Node process (`node -e` with one timer), which reports
 * its own CPU once started, so that each role's cost is also given in bare Node starts. The
 * platform's processes are read in /proc's ticks of 10 ms: a few percent of each.
 *
 * Prints a table per role (median over rounds of each process's CPU seconds, and the sum a round),
 * the seconds to serve's "serving at" line, to a registered app and to the chat's answer, then (as
 * the last line) one JSON object.
 *
 * Env: BENCH_ROUNDS (default 3).
 */
import { type ChildProcess, execFile, spawn } from "node:child_process"
import { once } from "node:events"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { performance } from "node:perf_hooks"
import { promisify } from "node:util"
import { binPath, repoRoot } from "../test/support/platform.js"
import { cpuSeconds, sampleProcesses } from "./support/processes.js"

const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3)
const TOKEN = "cornserve-bench-starts-token"

/** The request an app's own document gives as its example (`GET /app/:id/openapi.json`). */
const exampleOf = async (url: string, app: string): Promise<unknown> => {
  const response = await fetch(`${url}/app/${app}/openapi.json`, { headers: { authorization: `Bearer ${TOKEN}` } })
  const document = (await response.json()) as {
    paths?: Record<string, { post?: { requestBody?: { content?: Record<string, { example?: unknown }> } } }>
  }
  const example = document.paths?.[`/app/invoke/${app}`]?.post?.requestBody?.content?.["application/json"]?.example
  if (example === undefined) throw new Error(`${app}'s document (${response.status}) gives no example request`)
  return example
}

const median = (values: ReadonlyArray<number>) => {
  const sorted = [...values].sort((a, b) => a - b)
  const middle = Math.floor(sorted.length / 2)
  return sorted.length % 2 === 1 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2
}

const round3 = (value: number) => Math.round(value * 1000) / 1000

/** Resolves with the first match of `pattern` in what `child` prints, or rejects after `ms`. */
const waitForOutput = (child: ChildProcess, pattern: RegExp, ms: number): Promise<RegExpMatchArray> =>
  new Promise((resolve, reject) => {
    let output = ""
    const timer = setTimeout(() => reject(new Error(`no ${pattern} within ${ms} ms:\n${output.slice(-2000)}`)), ms)
    const onData = (chunk: Buffer) => {
      output += chunk.toString()
      const match = output.match(pattern)
      if (match !== null) {
        clearTimeout(timer)
        resolve(match)
      }
    }
    child.stdout?.on("data", onData)
    child.stderr?.on("data", onData)
    child.once("exit", (code) => reject(new Error(`exited (${code}) before ${pattern}:\n${output.slice(-2000)}`)))
  })

/**
 * A bare Node process's CPU once it has started: the floor every process of the platform pays. It
 * reports its own (getrusage, in microseconds): /proc counts in ticks of 10 ms, a sixth of it.
 */
const bareNodeStart = async (): Promise<number> => {
  const child = spawn(
    process.execPath,
    [
      "-e",
      "const u = process.cpuUsage(); process.stdout.write('cpu ' + (u.user + u.system) + '\\n'); setInterval(() => {}, 1e6)"
    ],
    { stdio: ["ignore", "pipe", "ignore"] }
  )
  const [, micros] = await waitForOutput(child, /cpu (\d+)\n/, 30_000)
  child.kill("SIGKILL")
  await once(child, "exit")
  return Number(micros) / 1e6
}

interface Round {
  readonly listenS: number
  readonly registerS: number
  readonly answerS: number
  readonly byRole: Map<string, Array<number>>
}

const oneRound = async (): Promise<Round> => {
  const stateDir = mkdtempSync(join(tmpdir(), "cornserve-bench-starts-"))
  const env = { ...process.env, CORNSERVE_ADMIN_TOKEN: TOKEN, CORNSERVE_APP_CHECK: "off" }
  const started = performance.now()
  const serve = spawn(
    process.execPath,
    [binPath, "serve", "--port", "0", "--state-dir", stateDir, "--devices", "cpu:0,cpu:1"],
    { cwd: repoRoot, env, stdio: ["ignore", "pipe", "pipe"] }
  )
  try {
    const [, url] = await waitForOutput(serve, /serving at (http:\/\/\S+)/, 120_000)
    const listenS = (performance.now() - started) / 1000
    const registering = performance.now()
    await promisify(execFile)(
      process.execPath,
      [binPath, "app", "register", "examples/color_chat.ts", "--gateway", url!],
      { cwd: repoRoot, env, timeout: 300_000 }
    )
    const registerS = (performance.now() - registering) / 1000
    const chat = await exampleOf(url!, "color_chat")
    const asking = performance.now()
    const response = await fetch(`${url}/app/invoke/color_chat`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(chat),
      signal: AbortSignal.timeout(120_000)
    })
    const body = await response.text()
    if (!response.ok) throw new Error(`color_chat answered ${response.status}: ${body.slice(0, 500)}`)
    const answerS = (performance.now() - asking) / 1000
    const byRole = new Map<string, Array<number>>()
    for (const { pid, role } of sampleProcesses(serve.pid!, new Map(), "color_chat")) {
      const seconds = cpuSeconds(pid)
      if (seconds === undefined) continue
      // An executor's router and its workers by kind, without the devices each one holds.
      const kind = role.replace(/ \(.*\)$/, "").replace(/ worker \d+$/, " worker")
      byRole.set(kind, [...(byRole.get(kind) ?? []), seconds])
    }
    return { listenS, registerS, answerS, byRole }
  } finally {
    serve.kill("SIGTERM")
    await once(serve, "exit")
    rmSync(stateDir, { recursive: true, force: true })
  }
}

export default async function main() {
  const bare: Array<number> = []
  const rounds: Array<Round> = []
  for (let round = 0; round < ROUNDS; round++) {
    bare.push(await bareNodeStart())
    rounds.push(await oneRound())
    console.log(`round ${round + 1}/${ROUNDS} done`)
  }
  const bareS = median(bare)
  const roles = [...new Set(rounds.flatMap((round) => [...round.byRole.keys()]))].sort()
  const rows = roles.map((role) => {
    const each = rounds.flatMap((round) => round.byRole.get(role) ?? [])
    const perRound = median(rounds.map((round) => (round.byRole.get(role) ?? []).reduce((a, b) => a + b, 0)))
    return {
      role,
      processes: each.length / rounds.length,
      cpuS: round3(median(each)),
      bareStarts: round3(median(each) / bareS),
      perRoundS: round3(perRound)
    }
  })
  const totalS = round3(median(rounds.map((round) => [...round.byRole.values()].flat().reduce((a, b) => a + b, 0))))
  console.log(`\nbare node start: ${round3(bareS)} CPU-s (median of ${bare.length})\n`)
  console.log("role                 processes  CPU-s each  × bare node  CPU-s a round")
  for (const row of rows)
    console.log(
      `${row.role.padEnd(20)} ${String(row.processes).padStart(9)}  ${row.cpuS.toFixed(3).padStart(10)}  ${row.bareStarts.toFixed(1).padStart(11)}  ${row.perRoundS.toFixed(3).padStart(13)}`
    )
  console.log(
    `${"all".padEnd(20)} ${"".padStart(9)}  ${"".padStart(10)}  ${round3(totalS / bareS)
      .toFixed(1)
      .padStart(11)}  ${totalS.toFixed(3).padStart(13)}`
  )
  const listenS = round3(median(rounds.map((round) => round.listenS)))
  const registerS = round3(median(rounds.map((round) => round.registerS)))
  const answerS = round3(median(rounds.map((round) => round.answerS)))
  console.log(
    `\nserving after ${listenS} s; color_chat registered (3 executors ready) in ${registerS} s; first answer in ${answerS} s`
  )
  console.log(
    JSON.stringify({
      bench: "starts",
      rounds: ROUNDS,
      bareNodeS: round3(bareS),
      roles: rows,
      totalS,
      totalInBareStarts: round3(totalS / bareS),
      listenS,
      registerS,
      answerS
    })
  )
}
