import type { ChildProcess } from "node:child_process"
import { randomUUID } from "node:crypto"
import * as Cause from "effect/Cause"
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import * as zmq from "zeromq"
import { startChild } from "../../process/ChildProcesses.js"
import { EngineUnavailable, type ExecutorError } from "./errors.js"
import { workerChild } from "./EarlySpawn.js"
import { type ExecutorConfig, ipcPath } from "./ExecutorConfig.js"
import { failureOf, messagesOf, type FromEngine, orderedSender, type ToEngine, type WorkItem } from "./wire.js"

interface Pending {
  readonly resolve: (results: ReadonlyArray<unknown>) => void
  readonly reject: (error: ExecutorError) => void
  readonly onPartial: ((item: number, value: unknown) => void) | undefined
}

export type EngineState =
  | { readonly _tag: "Starting" }
  | { readonly _tag: "Ready"; readonly workers: number }
  | { readonly _tag: "Unhealthy"; readonly reason: string }

/**
 * The program of an executor's engine (its kind's `runEngine`): it runs in the router's process,
 * beside the routes, and speaks to them over ZeroMQ as it speaks to the workers.
 */
export type EngineProgram = Effect.Effect<unknown, Error, Scope.Scope>

/**
 * The router's side of the engine: runs the engine, takes over the workers, submits requests over
 * ZeroMQ and routes the replies back. When the engine fails or a worker dies, the executor is
 * unhealthy and every request in flight fails with the reason.
 */
export class EngineClient {
  private readonly pending = new Map<string, Pending>()
  private current: EngineState = { _tag: "Starting" }
  private readonly readyWaiters: Array<() => void> = []

  private readonly sendToEngine: (message: ToEngine) => Promise<void>

  private constructor(toEngine: zmq.Push) {
    this.sendToEngine = orderedSender(toEngine)
  }

  get state(): EngineState {
    return this.current
  }

  get inFlight(): number {
    return this.pending.size
  }

  /**
   * `engine`: the engine's program, run here until the scope closes. `workers`: the workers'
   * processes as `spawnWorkers` started them ahead of this (else started now). The router is the
   * workers' parent: when one exits, the executor is unhealthy, and the engine is told so that it
   * fails what it holds.
   */
  static start(
    config: ExecutorConfig,
    engine: EngineProgram,
    workers?: ReadonlyArray<ChildProcess>
  ): Effect.Effect<EngineClient, never, Scope.Scope> {
    return Effect.gen(function* () {
      const toEngine = new zmq.Push({ linger: 0 })
      const fromEngine = new zmq.Pull()
      yield* Effect.addFinalizer(() =>
        Effect.sync(() => {
          toEngine.close()
          fromEngine.close()
        })
      )
      const client = new EngineClient(toEngine)
      yield* Effect.scoped(engine).pipe(
        Effect.catchAllCause((cause) =>
          Effect.sync(() => {
            if (!Cause.isInterruptedOnly(cause)) client.becomeUnhealthy(`the engine failed: ${engineFailure(cause)}`)
          })
        ),
        Effect.forkScoped
      )
      yield* Effect.forEach(
        config.devices,
        (device, rank) =>
          startChild({
            ...workerChild(config, rank, process.pid),
            ...(workers?.[rank] === undefined ? {} : { started: workers[rank] }),
            onUnexpectedExit: (code, signal) => {
              const reason = `worker ${rank} (${device}) exited ${signal === null ? `with code ${code}` : `on ${signal}`}`
              client.becomeUnhealthy(reason)
              void client.send({ t: "worker-lost", reason })
            }
          }),
        { discard: true }
      )
      toEngine.connect(ipcPath(config, "engine-in"))
      fromEngine.connect(ipcPath(config, "engine-out"))
      void client.receive(fromEngine)
      return client
    })
  }

  /** Resolves once every worker has loaded its model; rejects if the executor fails first. */
  whenReady(): Promise<void> {
    if (this.current._tag === "Ready") return Promise.resolve()
    if (this.current._tag === "Unhealthy")
      return Promise.reject(new EngineUnavailable({ message: this.current.reason }))
    return new Promise((resolve, reject) =>
      this.readyWaiters.push(() =>
        this.current._tag === "Ready"
          ? resolve()
          : reject(new EngineUnavailable({ message: (this.current as { reason: string }).reason }))
      )
    )
  }

  /**
   * Runs a request's items; `onPartial` gets streamed pieces of results as they come. `Result` and
   * `Partial` are what the kind's worker answers for these items (its wire types: the worker's
   * messages are decoded by the wire codec on their way here).
   */
  submit<Result = unknown, Partial = never>(
    items: ReadonlyArray<WorkItem>,
    onPartial?: (item: number, value: Partial) => void
  ): { readonly id: string; readonly results: Promise<ReadonlyArray<Result>> } {
    const id = randomUUID()
    const results = new Promise<ReadonlyArray<Result>>((resolve, reject) => {
      if (this.current._tag !== "Ready") {
        return reject(
          new EngineUnavailable({
            message:
              this.current._tag === "Unhealthy"
                ? `the executor is unhealthy: ${this.current.reason}`
                : "the executor is still loading its model"
          })
        )
      }
      this.pending.set(id, {
        resolve: resolve as (results: ReadonlyArray<unknown>) => void,
        reject,
        onPartial: onPartial as ((item: number, value: unknown) => void) | undefined
      })
      void this.send({ t: "request", id, items })
    })
    return { id, results }
  }

  /** `submit` as an effect: its results, or the engine's error; interrupting it cancels the request in the engine. */
  run<Result = unknown, Partial = never>(
    items: ReadonlyArray<WorkItem>,
    onPartial?: (item: number, value: Partial) => void
  ): Effect.Effect<ReadonlyArray<Result>, ExecutorError> {
    return Effect.suspend(() => {
      const submitted = this.submit<Result, Partial>(items, onPartial)
      return Effect.tryPromise({ try: () => submitted.results, catch: (error) => error as ExecutorError }).pipe(
        Effect.onInterrupt(() => Effect.sync(() => this.cancel(submitted.id)))
      )
    })
  }

  /** `run` of one item: its result. */
  runOne<Result = unknown, Partial = never>(
    item: WorkItem,
    onPartial?: (value: Partial) => void
  ): Effect.Effect<Result, ExecutorError> {
    return Effect.map(
      this.run<Result, Partial>([item], onPartial && ((_, value) => onPartial(value))),
      (results) => results[0] as Result
    )
  }

  cancel(id: string): void {
    if (this.pending.delete(id)) void this.send({ t: "cancel", id })
  }

  private send(message: ToEngine) {
    return this.sendToEngine(message).catch(() => undefined)
  }

  private becomeUnhealthy(reason: string) {
    if (this.current._tag === "Unhealthy") return
    this.current = { _tag: "Unhealthy", reason }
    for (const pending of this.pending.values())
      pending.reject(new EngineUnavailable({ message: `the executor failed: ${reason}` }))
    this.pending.clear()
    for (const wake of this.readyWaiters.splice(0)) wake()
  }

  private async receive(socket: zmq.Pull) {
    try {
      for await (const message of messagesOf<FromEngine>(socket)) {
        switch (message.t) {
          case "ready":
            if (this.current._tag === "Starting") this.current = { _tag: "Ready", workers: message.workers }
            for (const wake of this.readyWaiters.splice(0)) wake()
            break
          case "unhealthy":
            this.becomeUnhealthy(message.reason)
            break
          case "partial":
            this.pending.get(message.id)?.onPartial?.(message.item, message.value)
            break
          case "result":
            this.pending.get(message.id)?.resolve(message.results)
            this.pending.delete(message.id)
            break
          case "failed":
            this.pending.get(message.id)?.reject(failureOf(message.error))
            this.pending.delete(message.id)
            break
        }
      }
    } catch {
      // The socket closed: the router is stopping.
    }
  }
}

/** What stopped an engine, in one line. */
const engineFailure = (cause: Cause.Cause<Error>): string => {
  const error = Cause.squash(cause)
  return error instanceof Error ? error.message : String(error)
}
