#!/usr/bin/env node
// `node scripts/suite-cost.mjs [VITEST ARGS]`: where the test suite's CPU time goes. It runs vitest
// (after `npm run build`) under Linux process accounting (`accton`, Debian's acct package; root), so
// that every process the run starts is counted when it exits, however short its life: the vitest
// workers themselves (one a file: the suite isolates files), and everything each file starts
// (platforms, executors, sidecars, apps, the CLI, ffmpeg, npm, Chromium). Each worker is matched to
// the file it ran by their times. Prints the CPU seconds by kind, by the role of each Node process
// (serve, an executor, a worker, a CLI command), and the files that cost most, then
// (as the last line) one JSON object. Its accounting file is removed however the run ends.
import { execFileSync, spawn } from "node:child_process"
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"

const need = (command) => {
  try {
    execFileSync("sh", ["-c", `command -v ${command}`], { stdio: "ignore" })
  } catch {
    console.error(`suite-cost: needs ${command} (Debian's acct package) and root`)
    process.exit(2)
  }
}
need("accton")
need("dump-acct")

const dir = mkdtempSync(join(tmpdir(), "cornserve-suite-cost-"))
const accounting = join(dir, "pacct")
const results = join(dir, "results.json")
const cleanUp = () => {
  try {
    execFileSync("accton", ["off"], { stdio: "ignore" })
  } catch {}
  rmSync(dir, { recursive: true, force: true })
}
process.once("exit", cleanUp)
execFileSync("sh", ["-c", `: > ${accounting} && accton ${accounting}`], { stdio: "ignore" })

// Accounting names a process by its executable alone ("node" for nearly all of them), so every Node
// process of the run also loads a small hook (NODE_OPTIONS, which the platform's children inherit; an
// app's process gets a clean environment and is not seen) that writes its role and CPU when it exits.
// A process that is killed outright writes nothing: the roles' sum is less than the whole.
const roles = join(dir, "roles.ndjson")
const hook = join(dir, "role-hook.cjs")
writeFileSync(
  hook,
  `const { appendFileSync } = require("node:fs")
const { basename } = require("node:path")
const [, script = "", first = "", second = ""] = process.argv
const role = script.endsWith("bin/cornserve")
  ? first === "internal" ? second : first === "serve" ? "serve" : first === "app" ? "cli app " + second : "cli " + first
  : script.includes("vitest") ? "vitest" : basename(script, ".js") || "node"
process.on("exit", () => {
  try {
    const used = process.cpuUsage()
    appendFileSync(${JSON.stringify(roles)}, JSON.stringify({ role, cpu: (used.user + used.system) / 1e6, up: process.uptime() }) + "\\n")
  } catch {}
})
`
)

const startedAt = performance.now()
const vitest = spawn(
  process.execPath,
  [
    "node_modules/vitest/vitest.mjs",
    "run",
    "--reporter=default",
    "--reporter=json",
    `--outputFile.json=${results}`,
    ...process.argv.slice(2)
  ],
  {
    stdio: "inherit",
    env: { ...process.env, NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ""} --require ${hook}`.trim() }
  }
)
for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"]) process.on(signal, () => vitest.kill(signal))
const exitCode = await new Promise((resolve) => vitest.once("exit", (code) => resolve(code ?? 1)))
const wallSeconds = (performance.now() - startedAt) / 1000
execFileSync("accton", ["off"], { stdio: "ignore" })

// One record a process, written as it exits: comm|version|user|system|elapsed|uid|gid|memory|io|pid|ppid|flags|exit|tty|start,
// times in hundredths of a second.
const processes = new Map()
for (const line of execFileSync("dump-acct", [accounting], { maxBuffer: 1 << 30 })
  .toString()
  .trim()
  .split("\n")) {
  const field = line.split("|").map((value) => value.trim())
  const pid = Number(field[9])
  processes.set(pid, {
    comm: field[0],
    cpu: (Number(field[2]) + Number(field[3])) / 100,
    start: Date.parse(field[14]) / 1000,
    elapsed: Number(field[4]) / 100,
    pid,
    ppid: Number(field[10])
  })
}
const children = new Map()
for (const process of processes.values()) {
  if (!children.has(process.ppid)) children.set(process.ppid, [])
  children.get(process.ppid).push(process)
}
const subtree = (process) =>
  process.cpu + (children.get(process.pid) ?? []).reduce((sum, child) => sum + subtree(child), 0)
const sum = (values) => values.reduce((total, value) => total + value, 0)

const main = processes.get(vitest.pid)
const workers = main === undefined ? [] : (children.get(main.pid) ?? [])
const started = workers.flatMap((worker) => children.get(worker.pid) ?? [])
const byKind = new Map()
for (const child of started) {
  const kind = child.comm === "node" || child.comm.startsWith("ZMQbg") ? "node" : child.comm
  const entry = byKind.get(kind) ?? { processes: 0, cpu: 0 }
  entry.processes += 1 + countBelow(child)
  entry.cpu += subtree(child)
  byKind.set(kind, entry)
}
function countBelow(process) {
  return (children.get(process.pid) ?? []).reduce((count, child) => count + 1 + countBelow(child), 0)
}
const total = sum([...processes.values()].map((process) => process.cpu))
const inWorkers = sum(workers.map((worker) => worker.cpu))
const inStarted = sum(started.map(subtree))

// Files to workers: the worker that lived around the file's run the most snugly (start times are whole seconds).
const report = JSON.parse(readFileSync(results, "utf8"))
const candidates = workers.map((worker) => ({
  worker,
  from: worker.start,
  to: worker.start + worker.elapsed,
  taken: false
}))
const files = report.testResults.map((file) => {
  const from = file.startTime / 1000
  const to = file.endTime / 1000
  let best
  let bestSlack = Number.POSITIVE_INFINITY
  for (const candidate of candidates) {
    if (candidate.taken || candidate.from > from + 1.5 || candidate.to < to - 1.5) continue
    const slack = from - candidate.from + (candidate.to - to)
    if (slack < bestSlack) {
      bestSlack = slack
      best = candidate
    }
  }
  if (best !== undefined) best.taken = true
  return {
    file: file.name.slice(process.cwd().length + 1),
    wall: to - from,
    cpu: best === undefined ? undefined : subtree(best.worker),
    own: best === undefined ? undefined : best.worker.cpu
  }
})
files.sort((a, b) => (b.cpu ?? -1) - (a.cpu ?? -1))

const seconds = (value) => (value === undefined ? "?" : value.toFixed(0))
/** Seconds with two decimals under ten (a process's CPU), whole above. */
const fine = (value) => (value < 10 ? value.toFixed(2) : value.toFixed(0))
console.log(
  `\nsuite cost: ${seconds(wallSeconds)} s wall, ${seconds(total)} CPU-s in ${processes.size} processes on the machine (${seconds(total / wallSeconds)} cores busy on average)`
)
console.log(
  `  in the vitest workers themselves (imports, in-process tests): ${seconds(inWorkers)} CPU-s, ${workers.length} workers`
)
console.log(`  in what the tests start: ${seconds(inStarted)} CPU-s`)
for (const [kind, entry] of [...byKind].sort((a, b) => b[1].cpu - a[1].cpu).slice(0, 8))
  console.log(`    ${kind.padEnd(16)} ${seconds(entry.cpu).padStart(6)} CPU-s in ${entry.processes} processes`)
console.log(`  in vitest's own process: ${seconds(main?.cpu)} CPU-s`)
console.log(
  `  elsewhere (processes whose parent went first, the rest of the machine): ${seconds(total - inWorkers - inStarted - (main?.cpu ?? 0))} CPU-s`
)
const byRole = new Map()
for (const line of existsSync(roles) ? readFileSync(roles, "utf8").trim().split("\n") : []) {
  if (line === "") continue
  const { role, cpu, up } = JSON.parse(line)
  const entry = byRole.get(role) ?? { processes: 0, cpu: 0, up: 0 }
  entry.processes += 1
  entry.cpu += cpu
  entry.up += up
  byRole.set(role, entry)
}
const roleRows = [...byRole].sort((a, b) => b[1].cpu - a[1].cpu)
console.log(
  `\n by role (each Node process that ended by itself, ${seconds(sum(roleRows.map(([, entry]) => entry.cpu)))} CPU-s of them; CPU-s, processes, CPU-s each, share of a core while alive)`
)
for (const [role, entry] of roleRows.slice(0, 16))
  console.log(
    `${seconds(entry.cpu).padStart(6)} ${String(entry.processes).padStart(5)} ${fine(entry.cpu / entry.processes).padStart(6)} ${`${((100 * entry.cpu) / Math.max(entry.up, 0.01)).toFixed(0)}%`.padStart(5)}  ${role}`
  )
console.log(
  "\n CPU-s worker  wall  file (the 30 that cost most; CPU-s counts the file's worker and all it started, worker its own)"
)
for (const file of files.slice(0, 30))
  console.log(
    `${seconds(file.cpu).padStart(6)} ${seconds(file.own).padStart(6)} ${seconds(file.wall).padStart(5)}  ${file.file}`
  )
const unmatched = files.filter((file) => file.cpu === undefined).length
if (unmatched > 0) console.log(`(${unmatched} files not matched to a worker)`)
console.log(
  JSON.stringify({
    wallSeconds: Math.round(wallSeconds),
    cpuSeconds: Math.round(total),
    workerCpuSeconds: Math.round(inWorkers),
    startedCpuSeconds: Math.round(inStarted),
    vitestCpuSeconds: Math.round(main?.cpu ?? 0),
    processes: processes.size,
    roles: Object.fromEntries(roleRows.map(([role, entry]) => [role, Math.round(entry.cpu)])),
    files: Object.fromEntries(files.map((file) => [file.file, file.cpu === undefined ? null : Math.round(file.cpu)])),
    exitCode
  })
)
process.exitCode = exitCode
