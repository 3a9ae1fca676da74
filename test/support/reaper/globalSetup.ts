import { spawn } from "node:child_process"
import { randomUUID } from "node:crypto"
import { closeSync, mkdtempSync, openSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { reaperEnv, startTimeOf } from "./registry.js"

/**
 * vitest's global setup (in the main process): starts the run's reaper (watchdog.mjs), a detached
 * process whose stdin is a pipe from this one. The kernel closes that pipe when this process exits,
 * however it exits, and the reaper then ends every process, namespace and shared-memory file of the
 * run; while the run goes on, it ends those of each worker that is gone (a fork that crashed, was
 * killed, or finished a file and left something running). Workers learn the registry's path and
 * the run's id from the environment they inherit from this process.
 */

const watchdogPath = fileURLToPath(new URL("./watchdog.mjs", import.meta.url))

/** How long the normal end waits for the reaper's last sweep. */
const finishTimeoutMs = 10_000

const environOf = (pid: number) => {
  try {
    return readFileSync(`/proc/${pid}/environ`, "latin1")
  } catch {
    return ""
  }
}

const parentOf = (pid: number) => {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8")
    return Number(stat.slice(stat.lastIndexOf(") ") + 2).split(" ")[1])
  } catch {
    return undefined
  }
}

/**
 * The processes that run vitest for npm (`npm test`, `npx vitest`: npm and the shell between),
 * found by walking up while a process was started by npm (its environment says so). When one of
 * them is killed, vitest is not (it is not their process group's business), so the reaper ends it.
 */
const runnerAncestors = () => {
  const ancestors: Array<{ pid: number; start: number }> = []
  let current = process.pid
  for (let depth = 0; depth < 16 && environOf(current).includes("\0npm_lifecycle_event="); depth++) {
    const parent = parentOf(current)
    const start = parent === undefined ? undefined : startTimeOf(parent)
    if (parent === undefined || parent <= 1 || start === undefined) break
    ancestors.push({ pid: parent, start })
    current = parent
  }
  return ancestors
}

export default function setup() {
  // It reads /proc, and what it removes (namespaces, /dev/shm) is Linux's.
  if (process.platform !== "linux") return
  const dir = mkdtempSync(join(tmpdir(), "cornserve-reaper-"))
  const registry = join(dir, "registry.jsonl")
  writeFileSync(registry, "")
  const runId = `${process.pid}-${randomUUID().slice(0, 8)}`
  const config = {
    dir,
    registry,
    runId,
    runner: { pid: process.pid, start: startTimeOf(process.pid) },
    ancestors: runnerAncestors(),
    envNames: { run: reaperEnv.run, owner: reaperEnv.owner },
    shmDir: "/dev/shm",
    tmpDir: tmpdir()
  }
  // The reaper's own environment names no run or worker: no reaper (this run's or an enclosing
  // one's) may take it for a process to end.
  const env = { ...process.env }
  delete env[reaperEnv.run]
  delete env[reaperEnv.owner]
  delete env[reaperEnv.registry]
  const logFd = openSync(join(dir, "watchdog.log"), "a")
  const watchdog = spawn(process.execPath, [watchdogPath, JSON.stringify(config)], {
    detached: true,
    stdio: ["pipe", logFd, logFd],
    env
  })
  closeSync(logFd)
  // Neither the pipe nor the child keeps vitest alive: teardown ends them, and an exit closes them.
  watchdog.unref()
  const stdin = watchdog.stdin!
  ;(stdin as unknown as { unref?: () => void }).unref?.()
  stdin.on("error", () => undefined)
  const exited = new Promise<void>((resolve) => {
    if (watchdog.exitCode !== null) resolve()
    watchdog.once("exit", () => resolve())
    watchdog.once("error", () => resolve())
  })

  process.env[reaperEnv.registry] = registry
  process.env[reaperEnv.run] = runId

  return async () => {
    delete process.env[reaperEnv.registry]
    delete process.env[reaperEnv.run]
    stdin.end()
    stdin.destroy()
    await Promise.race([exited, new Promise((resolve) => setTimeout(resolve, finishTimeoutMs).unref())])
  }
}
