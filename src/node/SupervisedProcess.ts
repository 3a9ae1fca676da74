import { type ChildProcess, spawn } from "node:child_process"
import { fileURLToPath } from "node:url"
import { Effect, type Scope } from "effect"

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
}

const backoffMs = (attempt: number) => Math.min(8_000, 250 * 2 ** attempt)
/** A process that stayed up this long is healthy again: its next crash restarts it at once. */
const stableAfterMs = 30_000

/**
 * A child process of the node agent (a sidecar, an executor): started from the same binary, ready
 * when it says so, restarted with exponential backoff when it exits unexpectedly, stopped when the
 * scope closes. Its stdin is a pipe from this process, so it stops itself if the agent dies.
 */
export class SupervisedProcess<R> {
  private child: ChildProcess | undefined
  private current: ProcessState<R> = { _tag: "Starting" }
  private stopping = false
  private attempt = 0
  private readyAt = 0
  private restartTimer: NodeJS.Timeout | undefined
  private output = ""

  private constructor(private readonly options: SupervisedOptions<R>) {}

  static start<R>(options: SupervisedOptions<R>): Effect.Effect<SupervisedProcess<R>, Error, Scope.Scope> {
    return Effect.acquireRelease(
      Effect.tryPromise({
        try: async () => {
          const supervised = new SupervisedProcess(options)
          await supervised.spawnUntilReady().catch(async (error: unknown) => {
            await supervised.stop()
            throw error
          })
          return supervised
        },
        catch: (error) => (error instanceof Error ? error : new Error(String(error)))
      }),
      (supervised) => Effect.promise(() => supervised.stop())
    )
  }

  get state(): ProcessState<R> {
    return this.current
  }

  get pid(): number | undefined {
    return this.child?.pid
  }

  /** Everything the current run printed. */
  get log(): string {
    return this.output
  }

  /** Kills the process (it is unhealthy) and lets the supervisor start it again. */
  restart(reason: string): void {
    if (this.stopping || this.child === undefined || this.current._tag !== "Ready") return
    this.options.log(`${this.options.name}: restarting it: ${reason}`)
    this.child.kill("SIGKILL")
  }

  async stop(): Promise<void> {
    this.stopping = true
    if (this.restartTimer !== undefined) clearTimeout(this.restartTimer)
    const child = this.child
    if (child !== undefined && child.exitCode === null && child.signalCode === null) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(() => child.kill("SIGKILL"), 5_000)
        child.once("exit", () => {
          clearTimeout(timer)
          resolve()
        })
        child.kill("SIGTERM")
      })
    }
    this.setState({ _tag: "Stopped" })
  }

  private setState(state: ProcessState<R>) {
    this.current = state
    this.options.onState?.(state)
  }

  private spawnUntilReady(): Promise<R> {
    this.output = ""
    this.setState({ _tag: "Starting" })
    const child = spawn(process.execPath, [binPath, ...this.options.args], {
      stdio: ["pipe", "pipe", "pipe"],
      env: { ...process.env, ...this.options.env }
    })
    this.child = child
    return new Promise<R>((resolve, reject) => {
      let ready = false
      const timer = setTimeout(() => {
        child.kill("SIGKILL")
        reject(
          new Error(
            `${this.options.name} was not ready within ${this.options.startTimeoutMs} ms:\n${this.output.slice(-2_000)}`
          )
        )
      }, this.options.startTimeoutMs)
      const onData = (chunk: Buffer) => {
        this.output = (this.output + chunk.toString()).slice(-64_000)
        if (ready) return
        const parsed = this.options.parseReady(this.output)
        if (parsed === undefined) return
        ready = true
        clearTimeout(timer)
        this.readyAt = Date.now()
        this.setState({ _tag: "Ready", ready: parsed })
        resolve(parsed)
      }
      child.stdout!.on("data", onData)
      child.stderr!.on("data", onData)
      child.once("exit", (code, signal) => {
        clearTimeout(timer)
        const reason = `${this.options.name} exited ${signal === null ? `with code ${code}` : `on ${signal}`}`
        if (!ready) reject(new Error(`${reason} before it was ready:\n${this.output.slice(-2_000)}`))
        if (this.stopping || this.child !== child) return
        if (ready) this.scheduleRestart(reason)
      })
    })
  }

  private scheduleRestart(reason: string) {
    if (Date.now() - this.readyAt > stableAfterMs) this.attempt = 0
    const delay = backoffMs(this.attempt++)
    this.options.log(`${reason}; restarting it in ${delay} ms`)
    this.setState({ _tag: "Crashed", reason, restartInMs: delay })
    this.restartTimer = setTimeout(() => {
      if (this.stopping) return
      this.spawnUntilReady().catch((error: Error) => this.scheduleRestart(error.message.split("\n")[0]!))
    }, delay)
  }
}
