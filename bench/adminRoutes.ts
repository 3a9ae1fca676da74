/**
 * The platform's own routes (`/health`, `/app/list`, `/tasks/list`, `/openapi.json`), served by
 * `HttpApiBuilder` since they are declared once (`src/control/gateway/AdminApi.ts`), against the
 * invoke fast path on `node:http` in the same platform (the same-run baseline), one request after
 * another on a kept-alive connection.
 *
 * BENCH_BASELINE_ROOT: another built checkout (say, the commit before the routes moved to
 * `HttpApi`); its platform is started too and each route is measured on both, alternating rounds,
 * so the table says what the move cost.
 *
 * Env: BENCH_REQUESTS (per route per round, default 500), BENCH_ROUNDS (default 3). Last line: one
 * JSON object.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { randomBytes } from "node:crypto"
import { once } from "node:events"
import { mkdtempSync, rmSync } from "node:fs"
import http from "node:http"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { performance } from "node:perf_hooks"
import { createInterface } from "node:readline"
import { setTimeout as sleep } from "node:timers/promises"
import { repoRoot, runCli } from "../test/support/platform.js"

const REQUESTS = Number(process.env.BENCH_REQUESTS ?? 500)
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3)
const BASELINE_ROOT = process.env.BENCH_BASELINE_ROOT || undefined
/** The platforms' admin token: the bench registers hello with it; the listing routes it measures need none. */
const ADMIN_TOKEN = randomBytes(24).toString("hex")

interface Route {
  readonly name: string
  readonly method: "GET" | "POST"
  readonly path: string
  readonly body?: string
}

const routes: ReadonlyArray<Route> = [
  { name: "invoke hello (node:http)", method: "POST", path: "/app/invoke/hello", body: '{"name":"Ada"}' },
  { name: "GET /health", method: "GET", path: "/health" },
  { name: "GET /app/list", method: "GET", path: "/app/list" },
  { name: "GET /tasks/list", method: "GET", path: "/tasks/list" },
  { name: "GET /openapi.json", method: "GET", path: "/openapi.json" }
]

const children = new Set<ChildProcess>()

const startPlatform = async (root: string, stateDir: string): Promise<URL> => {
  const child = spawn(
    process.execPath,
    [join(root, "bin/cornserve"), "serve", "--host", "127.0.0.1", "--port", "0", "--state-dir", stateDir],
    { stdio: ["ignore", "pipe", "pipe"], cwd: root, env: { ...process.env, CORNSERVE_ADMIN_TOKEN: ADMIN_TOKEN } }
  )
  children.add(child)
  createInterface({ input: child.stderr! }).on("line", () => {})
  const url = await new Promise<URL>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the platform of ${root} did not start`)), 60_000)
    child.once("exit", (code) => reject(new Error(`the platform of ${root} exited (${code})`)))
    createInterface({ input: child.stdout! }).on("line", (line) => {
      const match = /serving at (http:\/\/127\.0\.0\.1:\d+)/.exec(line)
      if (match?.[1] !== undefined) {
        clearTimeout(timer)
        resolve(new URL(match[1]))
      }
    })
  })
  const registered = await runCli(["app", "register", join(repoRoot, "examples/hello.ts")], {
    CORNSERVE_GATEWAY_URL: url.origin,
    CORNSERVE_ADMIN_TOKEN: ADMIN_TOKEN
  })
  if (registered.code !== 0) throw new Error(`registering hello failed: ${registered.stderr}`)
  for (let i = 0; i < 600; i++) {
    const listed = (await (await fetch(new URL("/app/list", url))).json()) as {
      apps: ReadonlyArray<{ id: string; state: string }>
    }
    if (listed.apps.some((app) => app.id === "hello" && app.state === "ready")) return url
    await sleep(100)
  }
  throw new Error("hello did not become ready")
}

const request = (agent: http.Agent, url: URL, route: Route) =>
  new Promise<number>((resolve, reject) => {
    const started = performance.now()
    const outgoing = http.request(
      new URL(route.path, url),
      {
        method: route.method,
        agent,
        headers: route.body === undefined ? {} : { "content-type": "application/json" }
      },
      (response) => {
        response.on("data", () => {})
        response.on("end", () => {
          if (response.statusCode !== 200) reject(new Error(`${route.path}: ${response.statusCode}`))
          else resolve(performance.now() - started)
        })
      }
    )
    outgoing.on("error", reject)
    outgoing.end(route.body)
  })

const quantile = (sorted: ReadonlyArray<number>, q: number) =>
  sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!
const median = (values: ReadonlyArray<number>) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!
const round = (value: number) => Math.round(value * 1000) / 1000

/** One round of one route: REQUESTS in a row after 50 unmeasured; p50 and p99 in ms. */
const measure = async (agent: http.Agent, url: URL, route: Route) => {
  for (let i = 0; i < 50; i++) await request(agent, url, route)
  const times: Array<number> = []
  for (let i = 0; i < REQUESTS; i++) times.push(await request(agent, url, route))
  times.sort((a, b) => a - b)
  return { p50: quantile(times, 0.5), p99: quantile(times, 0.99) }
}

export default async function adminRoutesBench(): Promise<void> {
  const dirs: Array<string> = []
  const agents: Array<http.Agent> = []
  try {
    const targets: Array<{ readonly name: string; readonly url: URL; readonly agent: http.Agent }> = []
    for (const [name, root] of [
      ["now", repoRoot],
      ...(BASELINE_ROOT === undefined ? [] : [["before", BASELINE_ROOT]])
    ]) {
      const dir = mkdtempSync(join(tmpdir(), "cornserve-bench-"))
      dirs.push(dir)
      const agent = new http.Agent({ keepAlive: true, maxSockets: 1 })
      agents.push(agent)
      targets.push({ name: name!, url: await startPlatform(root!, dir), agent })
    }
    const results = new Map<string, Array<{ p50: number; p99: number }>>()
    for (let roundIndex = 0; roundIndex < ROUNDS; roundIndex++)
      for (const route of routes)
        for (const target of roundIndex % 2 === 0 ? targets : [...targets].reverse()) {
          const key = `${target.name}\t${route.name}`
          results.set(key, [...(results.get(key) ?? []), await measure(target.agent, target.url, route)])
        }
    const rows = [...results].map(([key, rounds]) => {
      const [target, route] = key.split("\t") as [string, string]
      return {
        target,
        route,
        p50Ms: round(median(rounds.map((r) => r.p50))),
        p99Ms: round(median(rounds.map((r) => r.p99)))
      }
    })
    const invoke = (target: string) => rows.find((row) => row.target === target && row.route.startsWith("invoke"))!
    console.log(`admin routes: ${ROUNDS} rounds of ${REQUESTS} requests in a row per route, medians`)
    console.log("| platform | route | p50 ms | p99 ms | p50 / invoke's |")
    console.log("|---|---|---|---|---|")
    for (const row of rows)
      console.log(
        `| ${row.target} | ${row.route} | ${row.p50Ms} | ${row.p99Ms} | ${round(row.p50Ms / invoke(row.target).p50Ms)} |`
      )
    const ratios = Object.fromEntries(
      BASELINE_ROOT === undefined
        ? []
        : routes.map((route) => {
            const now = rows.find((row) => row.target === "now" && row.route === route.name)!
            const before = rows.find((row) => row.target === "before" && row.route === route.name)!
            return [route.name, round(now.p50Ms / before.p50Ms)]
          })
    )
    if (BASELINE_ROOT !== undefined) {
      console.log("p50 now / before:")
      for (const [name, ratio] of Object.entries(ratios)) console.log(`  ${name}: ${ratio}`)
    }
    console.log(
      JSON.stringify({ bench: "adminRoutes", requests: REQUESTS, rounds: ROUNDS, rows, nowOverBefore: ratios })
    )
  } finally {
    for (const agent of agents) agent.destroy()
    await Promise.all(
      [...children].map(async (child) => {
        if (child.exitCode !== null) return
        const exited = once(child, "exit")
        child.kill("SIGTERM")
        await Promise.race([exited, sleep(15_000).then(() => child.kill("SIGKILL"))])
      })
    )
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true })
  }
}
