import type { ChildProcess } from "node:child_process"
import { appendFileSync, readFileSync } from "node:fs"

/**
 * How test helpers tell the run's reaper (watchdog.mjs, started by globalSetup.ts) what they made,
 * so that it ends and removes them when the worker that made them is gone, or the whole run is:
 * process groups, network namespaces and links, shared-memory file prefixes, paths. Outside a
 * vitest run with the reaper (benchmarks use these helpers too) every call here does nothing.
 *
 * Registering is appending one JSON line to the registry file (one write: lines of workers side by
 * side do not interleave). Processes need no registering to be found: every process a worker
 * starts inherits its environment, which names the run and the worker (`reaperEnv`); registering
 * a process group also catches its members whose environment was replaced.
 */

export const reaperEnv = {
  /** The registry file, set by the global setup in the main process; workers inherit it. */
  registry: "CORNSERVE_REAPER_REGISTRY",
  /** The run's id, in the environment of each worker and each process it starts. */
  run: "CORNSERVE_TEST_RUN",
  /** `<pid>-<start time>` of the worker, set by workerSetup.ts; in each process it starts. */
  owner: "CORNSERVE_TEST_OWNER"
} as const

type Kind = "owner" | "group" | "netns" | "link" | "shm" | "path"

/** A process's start time (clock ticks since boot): with its pid, what tells it from a later one. */
export const startTimeOf = (pid: number): number | undefined => {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8")
    return Number(stat.slice(stat.lastIndexOf(") ") + 2).split(" ")[19])
  } catch {
    return undefined
  }
}

/** Whether a reaper watches this run: helpers then give the processes they start groups of their own. */
export const reaperActive = () => process.env[reaperEnv.registry] !== undefined

let ownerKey: string | undefined

/** This worker, as the reaper knows it: `<pid>-<start time>`. */
export const thisOwner = () => {
  ownerKey ??= `${process.pid}-${startTimeOf(process.pid) ?? 0}`
  return ownerKey
}

const write = (op: "add" | "del", kind: Kind, value: string | number, start?: number) => {
  const registry = process.env[reaperEnv.registry]
  if (registry === undefined) return
  const record = { owner: thisOwner(), op, kind, value, ...(start === undefined ? {} : { start }) }
  appendFileSync(registry, `${JSON.stringify(record)}\n`)
}

/** Marks this worker as an owner the reaper watches (workerSetup.ts does, before each test file). */
export const registerOwner = () => write("add", "owner", process.pid)

/**
 * Registers the process group that `child` leads (spawn it with `detached: true`): when this
 * worker is gone, the reaper kills the whole group.
 */
export const trackGroup = (child: ChildProcess) => {
  if (child.pid === undefined) return
  const start = startTimeOf(child.pid)
  if (start !== undefined) write("add", "group", child.pid, start)
}

/** A network namespace (`ip netns del NAME` when this worker is gone), or its undoing once deleted. */
export const trackNamespace = (name: string) => write("add", "netns", name)
export const untrackNamespace = (name: string) => write("del", "netns", name)

/** An interface in the host's namespace (`ip link del NAME`), or its undoing once deleted. */
export const trackLink = (name: string) => write("add", "link", name)
export const untrackLink = (name: string) => write("del", "link", name)

/** Files in /dev/shm whose names start with `prefix`: removed when this worker is gone. */
export const trackSharedMemoryPrefix = (prefix: string) => write("add", "shm", prefix)

/** A file or directory removed (recursively) when this worker is gone, or its undoing. */
export const trackPath = (path: string) => write("add", "path", path)
export const untrackPath = (path: string) => write("del", "path", path)
