#!/usr/bin/env node
// `npm run test:loaded [-- VITEST ARGS]`: the test suite (`npm test`, with any arguments passed on
// to vitest) with four CPU-bound busy loops beside it, as on a busy host, so that a bound that only
// holds on an idle machine shows. The loops stop however the run ends (its exit, a signal to this
// script); the run's time and its exit status are printed last.
import { spawn } from "node:child_process"

const busyLoops = 4
// Each loop also ends once this script is gone, should it be killed before it could stop them.
const busyLoop =
  "const parent = process.ppid; for (let i = 0; ; i++) if (i % 1e7 === 0 && process.ppid !== parent) break"
const loops = Array.from({ length: busyLoops }, () => spawn(process.execPath, ["-e", busyLoop], { stdio: "ignore" }))
const stopLoops = () => {
  for (const loop of loops) if (loop.exitCode === null && loop.signalCode === null) loop.kill("SIGKILL")
}
process.once("exit", stopLoops)
console.log(`test:loaded: ${busyLoops} busy loops running (pids ${loops.map((loop) => loop.pid).join(", ")})`)

const startedAt = performance.now()
const npm = process.platform === "win32" ? "npm.cmd" : "npm"
const extra = process.argv.slice(2)
const run = spawn(npm, ["test", ...(extra.length > 0 ? ["--", ...extra] : [])], { stdio: "inherit" })
for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"]) {
  process.on(signal, () => {
    if (run.exitCode === null) run.kill(signal)
  })
}
run.once("exit", (code, signal) => {
  stopLoops()
  const seconds = ((performance.now() - startedAt) / 1000).toFixed(0)
  console.log(
    `test:loaded: npm test ${signal === null ? `exited with ${code}` : `ended on ${signal}`} after ${seconds} s with ${busyLoops} busy loops beside it`
  )
  process.exit(code ?? 1)
})
