/**
 * Starting an executor's workers, with nothing but Node's own modules: the engine's process starts
 * them first thing (`spawnWorkersEarly`, from `bin/cornserve`), so that they load their model while
 * the engine loads its own modules, and `startWorkerGroup` takes them over once it runs.
 */
import type { ChildProcess } from "node:child_process"
import { join } from "node:path"
import { type SpawnOptions, spawnChild } from "../../process/SpawnChild.js"

/** The environment variable that carries an engine's and its workers' config (JSON). */
export const configEnvName = "CORNSERVE_EXECUTOR_CONFIG"

/** Every batch buffer file's name starts with this. */
export const batchBufferPrefix = "cornserve-batches-"

/** The batch buffer of the engine with this pid. */
export const batchBufferPathOf = (enginePid: number): string => join("/dev/shm", `${batchBufferPrefix}${enginePid}`)

/** The environment variable that gives a worker the path of its engine's batch buffer. */
export const batchBufferEnvName = "CORNSERVE_BATCH_BUFFER"

/** How much lower a worker's CPU priority is than its engine's (a nice increment). */
const workerNiceness = 5

/**
 * A worker's garbage is mostly ONNX Runtime's outputs (a decode step's KV cache is tens of MB of
 * fresh ArrayBuffers), so V8 collects every step or two. Its background GC threads would then run
 * on the cores the session's intra-op threads are computing on, and a step waits for whichever
 * thread they preempted; collecting on the worker's own thread, between runs, costs less.
 */
const workerNodeFlags = ["--single-threaded-gc"]

/**
 * Worker `rank`'s process, given the executor's config as its JSON text. Every worker is told where
 * its engine's batch buffer is (this process's); one whose batches carry their inputs in their
 * messages (the LLM's) never opens it.
 */
export const workerChild = (configText: string, rank: number): SpawnOptions => ({
  args: ["executor-worker", "--rank", String(rank)],
  env: { [configEnvName]: configText, [batchBufferEnvName]: batchBufferPathOf(process.pid) },
  // A worker computes as fast as its threads let it; the gateway, the dispatcher and the
  // routers answer requests and refusals in between, so a busy worker yields to them.
  lowerPriority: workerNiceness,
  nodeFlags: workerNodeFlags
})

let early: ReadonlyArray<ChildProcess> | undefined

/**
 * In an engine's process, before it loads anything else: starts a worker per device of the config
 * in its environment. A config that does not read is left to the engine, which says why and exits
 * (its workers, if any started, stop with it).
 */
export const spawnWorkersEarly = (): void => {
  const text = process.env[configEnvName]
  if (text === undefined) return
  let devices: unknown
  try {
    devices = (JSON.parse(text) as { readonly devices?: unknown }).devices
  } catch {
    return
  }
  if (!Array.isArray(devices) || devices.length === 0) return
  early = devices.map((_, rank) => spawnChild(workerChild(text, rank)))
}

/** The workers `spawnWorkersEarly` started, for the engine to take over (once). */
export const takeEarlyWorkers = (): ReadonlyArray<ChildProcess> | undefined => {
  const workers = early
  early = undefined
  return workers
}
