/**
 * Starting an executor's workers, with nothing but Node's own modules: the router starts them as
 * soon as its config is known (`spawnWorkers`), before it loads its routes and its engine, so that
 * an executor's processes load side by side (most of a cold start). `EngineClient.start` takes
 * them over.
 */
import type { ChildProcess } from "node:child_process"
import { getPriority, setPriority } from "node:os"
import { join } from "node:path"
import { type SpawnOptions, spawnChild } from "../../process/SpawnChild.js"
import type { ExecutorConfig } from "./ExecutorConfig.js"

/** The environment variable that carries a worker's config (JSON). */
export const configEnvName = "CORNSERVE_EXECUTOR_CONFIG"

/** Every batch buffer file's name starts with this. */
export const batchBufferPrefix = "cornserve-batches-"

/** The batch buffer of the engine that runs in the router with this pid. */
export const batchBufferPathOf = (routerPid: number): string => join("/dev/shm", `${batchBufferPrefix}${routerPid}`)

/** The environment variable that gives a worker the path of its engine's batch buffer. */
export const batchBufferEnvName = "CORNSERVE_BATCH_BUFFER"

/**
 * How much lower a worker's CPU priority is than its router's (a nice increment), once it has
 * loaded its model: a worker computes as fast as its threads let it; the gateway, the dispatcher
 * and the routers (with their engines) answer requests and refusals in between, so a busy worker
 * yields to them. Until then it loads at its router's priority: a cold start waits for the worker's model, and the
 * router and engine loading beside it would otherwise take the cores first.
 */
const workerNiceness = 5

/** In a worker's process, once its model is loaded: lowers its priority (see workerNiceness). */
export const yieldPriority = (): void => {
  try {
    setPriority(Math.min(19, getPriority() + workerNiceness))
  } catch {
    // A platform that does not let us lower it runs the worker at its router's priority.
  }
}

/**
 * A worker's garbage is mostly ONNX Runtime's outputs (a decode step's KV cache is tens of MB of
 * fresh ArrayBuffers), so V8 collects every step or two. Its background GC threads would then run
 * on the cores the session's intra-op threads are computing on, and a step waits for whichever
 * thread they preempted; collecting on the worker's own thread, between runs, costs less.
 */
const workerNodeFlags = ["--single-threaded-gc"]

/**
 * ONNX Runtime packs each weight of a model's matrix products into a buffer of its own when it
 * loads (a 1B-parameter fp32 model: 6 GB), zeroed first; on 4 KiB pages most of that load is the
 * kernel faulting and clearing pages one at a time. glibc's malloc asks for transparent huge pages
 * instead with `glibc.malloc.hugetlb=1` (where the kernel gives them on request: THP "madvise",
 * the common default), which took such a load from 29–34 s to 13–16 s on two cores, with the
 * same peak memory. An operator's own `glibc.malloc.hugetlb` in GLIBC_TUNABLES is kept.
 */
export const workerTunables = (current: string | undefined): string =>
  current === undefined || current === ""
    ? "glibc.malloc.hugetlb=1"
    : current.includes("glibc.malloc.hugetlb=")
      ? current
      : `${current}:glibc.malloc.hugetlb=1`

/**
 * Worker `rank`'s process, given the executor's config and the pid of its router, whose engine
 * holds the batch buffer. Every worker is told where that buffer is; one whose batches carry
 * their inputs in their messages (the LLM's) never opens it.
 */
export const workerChild = (config: ExecutorConfig, rank: number, routerPid: number): SpawnOptions => ({
  args: ["executor-worker", "--rank", String(rank)],
  env: {
    [configEnvName]: JSON.stringify(config),
    [batchBufferEnvName]: batchBufferPathOf(routerPid),
    GLIBC_TUNABLES: workerTunables(process.env.GLIBC_TUNABLES)
  },
  nodeFlags: workerNodeFlags
})

/**
 * Starts a worker per device, side by side, before the router has loaded its routes and its
 * engine; `EngineClient.start` takes them over. Until then, each is held by its lifeline only: if
 * the router fails first, they stop with it.
 */
export const spawnWorkers = (config: ExecutorConfig): ReadonlyArray<ChildProcess> =>
  config.devices.map((_, rank) => spawnChild(workerChild(config, rank, process.pid)))
