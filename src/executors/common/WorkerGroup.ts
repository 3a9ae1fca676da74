/**
 * An engine's workers: one process per device, started in the engine's scope, and the loop that
 * receives their replies. The router hears `ready` once every worker has loaded its model and
 * `unhealthy` as soon as one exits; the engine hears what the workers say about its batches. The
 * batch engine and the LLM's engine both run their workers through this.
 */
import { Effect, type Scope } from "effect"
import { batchBufferEnvName } from "./BatchBuffer.js"
import { startChild } from "../../process/ChildProcesses.js"
import type { EngineSockets } from "./EngineSockets.js"
import { configEnvName, type ExecutorConfig } from "./ExecutorConfig.js"
import type { ExecutorError } from "./errors.js"
import { failureOf, messagesOf, type FromWorker, type ToWorker } from "./wire.js"

/** What an engine does with its workers' replies. */
export interface WorkerReplies {
  /** Item `item` of batch `batch` sent a piece of its result before the batch ended. */
  readonly partial: (batch: number, item: number, value: unknown) => void
  /** Worker `rank` ran its shard of batch `batch`: one result per item of the shard. */
  readonly done: (batch: number, rank: number, results: ReadonlyArray<unknown>) => void
  /** Worker `rank` failed its shard of batch `batch` with `error` (decoded from its message). */
  readonly failed: (batch: number, rank: number, error: ExecutorError) => void
  /** A worker exited while the engine ran, and the router has been told so. Called once. */
  readonly lost: (reason: string) => void
}

export interface WorkerGroup {
  /** False for good once a worker has exited: the executor can no longer serve. */
  readonly healthy: boolean
  /** Hands worker `rank` a batch; one worker's messages arrive in the order they were sent. */
  readonly send: (rank: number, message: ToWorker) => void
}

/** How much lower a worker's CPU priority is than its engine's (a nice increment). */
const workerNiceness = 5

/**
 * A worker's garbage is mostly ONNX Runtime's outputs (a decode step's KV cache is tens of MB of
 * fresh ArrayBuffers), so V8 collects every step or two. Its background GC threads would then run
 * on the cores the session's intra-op threads are computing on, and a step waits for whichever
 * thread they preempted; collecting on the worker's own thread, between runs, costs less.
 */
const workerNodeFlags = ["--single-threaded-gc"]

export const startWorkerGroup = (options: {
  readonly config: ExecutorConfig
  readonly sockets: EngineSockets
  /** The path of the engine's batch buffer, for its workers to map; absent when batches carry their inputs. */
  readonly batchBuffer?: string
  readonly replies: WorkerReplies
}): Effect.Effect<WorkerGroup, never, Scope.Scope> =>
  Effect.gen(function* () {
    const { config, sockets, replies } = options
    let healthy = true
    const env = {
      [configEnvName]: JSON.stringify(config),
      ...(options.batchBuffer === undefined ? {} : { [batchBufferEnvName]: options.batchBuffer })
    }

    yield* Effect.forEach(
      config.devices,
      (device, rank) =>
        startChild({
          args: ["executor-worker", "--rank", String(rank)],
          env,
          // A worker computes as fast as its threads let it; the gateway, the dispatcher and the
          // routers answer requests and refusals in between, so a busy worker yields to them.
          lowerPriority: workerNiceness,
          nodeFlags: workerNodeFlags,
          onUnexpectedExit: (code, signal) => {
            if (!healthy) return
            healthy = false
            const reason = `worker ${rank} (${device}) exited ${signal === null ? `with code ${code}` : `on ${signal}`}`
            void sockets.sendRouter({ t: "unhealthy", reason })
            replies.lost(reason)
          }
        }),
      { discard: true }
    )

    const receive = async () => {
      let ready = 0
      for await (const message of messagesOf<FromWorker>(sockets.fromWorkers)) {
        switch (message.t) {
          case "ready":
            if (++ready === config.devices.length) void sockets.sendRouter({ t: "ready", workers: ready })
            break
          case "partial":
            replies.partial(message.batch, message.item, message.value)
            break
          case "done":
            replies.done(message.batch, message.rank, message.results)
            break
          case "failed":
            replies.failed(message.batch, message.rank, failureOf(message.error))
            break
        }
      }
    }
    void receive()

    return {
      get healthy() {
        return healthy
      },
      send: (rank, message) => void sockets.sendWorker[rank]!(message).catch(() => undefined)
    }
  })
