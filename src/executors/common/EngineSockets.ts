import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import * as zmq from "zeromq"
import { type ExecutorConfig, ipcPath } from "./ExecutorConfig.js"
import { type FromEngine, orderedSender, type ToWorker } from "./wire.js"

export interface EngineSockets {
  /** Requests and cancellations from the router. */
  readonly fromRouter: zmq.Pull
  /** Replies of every worker. */
  readonly fromWorkers: zmq.Pull
  /** To the router, in order; a message the router can no longer take is dropped. */
  readonly sendRouter: (message: FromEngine) => Promise<void>
  /** To each worker, by rank, in order. */
  readonly sendWorker: ReadonlyArray<(message: ToWorker) => Promise<void>>
}

/**
 * An engine's ZeroMQ sockets, bound on the executor's ipc paths (the router and the workers
 * connect) and closed with the scope. Every engine, the batch engine and the LLM's, talks through
 * these.
 */
export const bindEngineSockets = (config: ExecutorConfig): Effect.Effect<EngineSockets, never, Scope.Scope> =>
  Effect.gen(function* () {
    const fromRouter = new zmq.Pull()
    const toRouter = new zmq.Push({ linger: 0 })
    const fromWorkers = new zmq.Pull()
    const toWorkers = config.devices.map(() => new zmq.Push({ linger: 0 }))
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        for (const socket of [fromRouter, toRouter, fromWorkers, ...toWorkers]) socket.close()
      })
    )
    yield* Effect.promise(() =>
      Promise.all([
        fromRouter.bind(ipcPath(config, "engine-in")),
        toRouter.bind(ipcPath(config, "engine-out")),
        fromWorkers.bind(ipcPath(config, "workers-out")),
        ...toWorkers.map((socket, rank) => socket.bind(ipcPath(config, `worker-${rank}`)))
      ])
    )
    const toRouterInOrder = orderedSender<FromEngine>(toRouter)
    return {
      fromRouter,
      fromWorkers,
      sendRouter: (message: FromEngine) => toRouterInOrder(message).catch(() => undefined),
      sendWorker: toWorkers.map((socket) => orderedSender<ToWorker>(socket))
    }
  })
