import { type ChildProcess, spawn } from "node:child_process"
import { rmSync } from "node:fs"
import { fileURLToPath } from "node:url"
import * as Clock from "effect/Clock"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Schedule from "effect/Schedule"
import type * as Scope from "effect/Scope"
import { lifelineEnv } from "./Lifeline.js"
import { restartPolicy } from "./RestartPolicy.js"
import { stopHasBegun } from "./StopSignals.js"

const binPath = fileURLToPath(new URL("../../bin/cornserve", import.meta.url))

export type ProcessState<R> =
  | { readonly _tag: "Starting" }
  | { readonly _tag: "Ready"; readonly ready: R }
  | { readonly _tag: "Crashed"; readonly reason: string; readonly restartInMs: number }
  | { readonly _tag: "Stopped" }

export interface SupervisedOptions<R> {
  readonly name: string
  /** Arguments of bin/cornserve. */
  readonly args: ReadonlyArray<string>
  readonly env?: Readonly<Record<string, string>>
  /** What the process prints once it is ready (parsed from its output so far), or undefined. */
  readonly parseReady: (output: string) => R | undefined
  readonly startTimeoutMs: number
  readonly onState?: (state: ProcessState<R>) => void
  readonly log: (message: string) => void
  /**
   * The files a run with this pid makes and removes on its way out, which it cannot remove when it
   * is killed: removed once it has exited, however it exited.
   */
  readonly leaves?: (pid: number) => ReadonlyArray<string>
}

/** How one run of the process ended: how long it was up, and why it stopped. */
interface RunEnded {
  readonly uptime: Duration.Duration
  readonly reason: string
}

/** How long a process asked to stop may take before it is killed. */
const stopGrace = Duration.seconds(5)

/**
 * A child process of the node agent (a sidecar, an executor): started from the same binary, ready
 * when it says so, restarted by `restartPolicy` when it exits unexpectedly, stopped when the scope
 * closes. Its stdin is a pipe from this process, so it stops itself if the agent dies. Once this
 * process's stop has begun (see StopSignals.ts) an exit is never followed by a restart.
 */
export class SupervisedProcess<R> {
  private child: ChildProcess | undefined
  private current: ProcessState<R> = { _tag: "Starting" }

  private constructor(private readonly options: SupervisedOptions<R>) {}

  /** Starts the process and its supervision; succeeds once it is ready, fails when its first start does. */
  static start<R>(options: SupervisedOptions<R>): Effect.Effect<SupervisedProcess<R>, Error, Scope.Scope> {
    return Effect.gen(function* () {
      const supervised = new SupervisedProcess(options)
      const firstStart = yield* Deferred.make<void, Error>()
      yield* Effect.addFinalizer(() => Effect.sync(() => supervised.setState({ _tag: "Stopped" })))
      yield* Effect.forkScoped(supervised.supervise(firstStart))
      yield* Deferred.await(firstStart)
      return supervised
    })
  }

  get state(): ProcessState<R> {
    return this.current
  }

  /** The process id of the current run. */
  get pid(): number | undefined {
    return this.child?.pid
  }

  /** Kills the process (it is unhealthy) and lets the supervisor start it again. */
  restart(reason: string): void {
    if (this.child === undefined || this.current._tag !== "Ready") return
    this.options.log(`${this.options.name}: restarting it: ${reason}`)
    this.child.kill("SIGKILL")
  }

  private setState(state: ProcessState<R>) {
    this.current = state
    this.options.onState?.(state)
  }

  /**
   * Runs the process again each time it ends, after the wait the restart policy picks. A start
   * that fails before the process was ever ready fails `firstStart` and ends the supervision:
   * the process cannot run as configured. Later failed starts are crashes like any other. A run
   * that ends once the stop has begun ends the supervision.
   */
  private supervise(firstStart: Deferred.Deferred<void, Error>): Effect.Effect<void> {
    const restarts = Schedule.mapInput(restartPolicy, (ended: RunEnded) => ended.uptime).pipe(
      Schedule.intersect(Schedule.identity<RunEnded>()),
      Schedule.tapOutput(([delay, ended]) =>
        Effect.sync(() => {
          const restartInMs = Duration.toMillis(delay)
          this.options.log(`${ended.reason}; restarting it in ${restartInMs} ms`)
          this.setState({ _tag: "Crashed", reason: ended.reason, restartInMs })
        })
      )
    )
    const runOnce = this.run(Deferred.succeed(firstStart, undefined)).pipe(
      Effect.catchAll((error) =>
        Effect.if(Deferred.isDone(firstStart), {
          onTrue: () => Effect.succeed<RunEnded>({ uptime: Duration.zero, reason: error.message.split("\n")[0]! }),
          onFalse: () => Effect.zipRight(Deferred.fail(firstStart, error), Effect.fail(error))
        })
      )
    )
    const runUntilStop = Effect.flatMap(runOnce, (ended) => {
      if (!stopHasBegun()) return Effect.succeed(ended)
      this.options.log(`${ended.reason} while the platform stops; not restarted`)
      this.setState({ _tag: "Stopped" })
      return Effect.fail(new Error("stopping"))
    })
    // A failed first start was handed to the caller through `firstStart`; a stop ends the repeat.
    return Effect.repeat(runUntilStop, restarts).pipe(Effect.ignore)
  }

  /** Starts the process, waits until it is ready (then runs `onReady`), and returns once it exits. */
  private run(onReady: Effect.Effect<unknown>): Effect.Effect<RunEnded, Error> {
    const { name, startTimeoutMs } = this.options
    return Effect.gen(this, function* () {
      const ready = yield* Deferred.make<R>()
      const exited = yield* Deferred.make<string>()
      let output = ""
      const tail = () => output.slice(-2_000)
      this.setState({ _tag: "Starting" })
      yield* Effect.acquireRelease(
        Effect.sync(() => this.spawnChild(ready, exited, (chunk) => (output = (output + chunk).slice(-64_000)))),
        (child) => stopChild(child, exited)
      )
      const parsed = yield* Deferred.await(ready).pipe(
        Effect.raceFirst(
          Effect.flatMap(Deferred.await(exited), (reason) =>
            Effect.fail(new Error(`${reason} before it was ready:\n${tail()}`))
          )
        ),
        Effect.timeoutFail({
          duration: Duration.millis(startTimeoutMs),
          onTimeout: () => new Error(`${name} was not ready within ${startTimeoutMs} ms:\n${tail()}`)
        })
      )
      const readyAt = yield* Clock.currentTimeMillis
      this.setState({ _tag: "Ready", ready: parsed })
      yield* onReady
      const reason = yield* Deferred.await(exited)
      const uptime = Duration.millis((yield* Clock.currentTimeMillis) - readyAt)
      return { uptime, reason }
    }).pipe(Effect.scoped)
  }

  private spawnChild(
    ready: Deferred.Deferred<R>,
    exited: Deferred.Deferred<string>,
    append: (chunk: string) => string
  ) {
    const child = spawn(process.execPath, [binPath, ...this.options.args], {
      stdio: ["pipe", "pipe", "pipe"],
      env: lifelineEnv({ ...process.env, ...this.options.env })
    })
    this.child = child
    let isReady = false
    const onData = (chunk: Buffer) => {
      const output = append(chunk.toString())
      if (isReady) return
      const parsed = this.options.parseReady(output)
      if (parsed === undefined) return
      isReady = true
      Deferred.unsafeDone(ready, Exit.succeed(parsed))
    }
    child.stdout!.on("data", onData)
    child.stderr!.on("data", onData)
    child.once("exit", (code, signal) => {
      for (const path of child.pid === undefined ? [] : (this.options.leaves?.(child.pid) ?? [])) {
        try {
          rmSync(path, { force: true })
        } catch {
          // Not ours to remove after all; the next start's sweep (AbandonedFiles) tries again.
        }
      }
      const how = signal === null ? `with code ${code}` : `on ${signal}`
      Deferred.unsafeDone(exited, Exit.succeed(`${this.options.name} exited ${how}`))
    })
    return child
  }
}

/** Asks the child to stop (SIGTERM) and kills it if it has not within the grace period. */
const stopChild = (child: ChildProcess, exited: Deferred.Deferred<string>) =>
  Effect.gen(function* () {
    if (yield* Deferred.isDone(exited)) return
    child.kill("SIGTERM")
    const stopped = yield* Deferred.await(exited).pipe(Effect.timeout(stopGrace), Effect.option)
    if (stopped._tag === "None") {
      child.kill("SIGKILL")
      yield* Deferred.await(exited)
    }
  })
