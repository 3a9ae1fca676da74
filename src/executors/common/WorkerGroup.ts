/**
 * An engine's workers: one process per device, which the router starts beside the engine (see
 * EarlySpawn) and watches, and the loop that receives their replies. The router hears `ready` once
 * every worker has loaded its model; the engine hears what the workers say about its batches, and
 * from the router that one exited (`lose`). The batch engine and the LLM's engine both run their
 * workers through this.
 */
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import type { EngineSockets } from "./EngineSockets.js"
import type { ExecutorConfig } from "./ExecutorConfig.js"
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
  /** A worker exited while the engine ran (the router saw it, and told the engine). Called once. */
  readonly lost: (reason: string) => void
}

export interface WorkerGroup {
  /** False for good once a worker has exited: the executor can no longer serve. */
  readonly healthy: boolean
  /** Hands worker `rank` a batch; one worker's messages arrive in the order they were sent. */
  readonly send: (rank: number, message: ToWorker) => void
  /** A worker exited, for `reason`: the group is unhealthy for good, and the engine's `lost` runs. */
  readonly lose: (reason: string) => void
}

export const startWorkerGroup = (options: {
  readonly config: ExecutorConfig
  readonly sockets: EngineSockets
  readonly replies: WorkerReplies
}): Effect.Effect<WorkerGroup, never, Scope.Scope> =>
  Effect.gen(function* () {
    const { config, sockets, replies } = options
    let healthy = true
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
      send: (rank, message) => void sockets.sendWorker[rank]!(message).catch(() => undefined),
      lose: (reason) => {
        if (!healthy) return
        healthy = false
        replies.lost(reason)
      }
    }
  })
