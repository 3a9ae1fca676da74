import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as ExecutionStrategy from "effect/ExecutionStrategy"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Schedule from "effect/Schedule"
import * as Scope from "effect/Scope"
import { Admission, unlimitedAdmission } from "./Admission.js"
import { type FromApp, jsonExceeds, responseTooLargeMessage, type ToApp } from "../../app-runtime/driver/protocol.js"
import { answerWindowChars, ReceiveLedger } from "../../app-runtime/driver/StreamWindow.js"
import { type AppLoadError, type LoadedApp, loadIn, type SchemasReader } from "./AppLoading.js"
import { AppDispatches } from "./AppDispatches.js"
import { AppLog } from "./AppLog.js"
import type { OutboundRules } from "./OutboundProxy.js"
import { AppProcess, type AppProcessLimits } from "./AppProcess.js"
import { ChannelBudget, channelRateOf } from "./ChannelBudget.js"
import { restartPolicy } from "../../process/RestartPolicy.js"
import type { AppShare, GraphDispatcher, RequestObserver } from "../DispatchContract.js"
import type { Span } from "../../tracing/Tracing.js"
import { RequestClocks } from "./RequestClocks.js"
import type { ReplyHandlers } from "./ReplyHandlers.js"

/** What an app's process may use: its memory, and how long its event loop may stay busy. */
export interface AppLimits extends AppProcessLimits {
  /** An app whose event loop does not answer a ping for this long (a request spinning) is restarted. */
  readonly stallMs: number
}

/** How often the watchdog pings an app that has requests in flight. */
const watchdogPeriodMs = 1_000

/**
 * The platform's side of one app's process. Requests are tagged with a number and their
 * replies routed back to their handlers. A worker that dies is started again after the wait
 * `restartPolicy` picks (requests that arrive meanwhile wait for it); the requests it held fail, the
 * app stays registered. Each process's load is `AppLoading.ts`'s, its dispatches `AppDispatches.ts`'s.
 */
export class AppDriver {
  /** Who may run now, who waits, who is refused: set from the app's settings once it has loaded. */
  admission = new Admission(unlimitedAdmission)
  /** How long a request may take, its stream included: the registration's, else the app's (undefined: the platform's). */
  timeoutMs: number | undefined
  /** Its claim on shared tasks: set from the app's settings once it has loaded. */
  share: AppShare
  /** What its process said at its last load (each restart loads it again). */
  loaded: LoadedApp | undefined
  /** Why its process last stopped while the app stayed registered, and when (`app list` shows it). */
  lastStop: { readonly reason: string; readonly at: string } | undefined
  private worker!: AppProcess
  private readonly replies = new Map<number, ReplyHandlers>()
  /** What arrived and left of each streaming request's lines, to give the app room as they leave. */
  private readonly answerLedgers = new Map<number, ReceiveLedger>()
  /** Where each request's time goes, by rid and by request id (dispatches name their request by id). */
  private readonly clocks: RequestClocks
  private nextRid = 0
  /** The task graphs the app's process asks to run. */
  private readonly dispatches: AppDispatches
  /** Why the app's current process is being stopped, when the platform stops it (its memory, the protocol). */
  private stopReason: string | undefined
  private nextNonce = 0
  private readonly pongs = new Map<number, () => void>()
  private closing = false
  private idleWaiters: Array<() => void> = []
  private restarting: Promise<void> | undefined
  private loadedAt = 0
  /** Remembers the crashes in a row, so that each restart waits longer than the one before. */
  private readonly restarts = Effect.runSync(
    Schedule.driver(
      restartPolicy.pipe(
        Schedule.tapOutput((delay) =>
          Effect.sync(() => this.log(`app ${this.appId}: restarting its worker in ${Duration.toMillis(delay)} ms`))
        )
      )
    )
  )

  /** What the app writes to its stdout and stderr, across its processes. */
  private readonly output: AppLog
  /** What the app may write to its channel, across its processes: a process restarted for writing too fast starts with none. */
  private readonly channelBudget: ChannelBudget

  /** Asks the app's process for a sign of life, whether or not any client is still waiting on it. */
  private readonly watchdog: NodeJS.Timeout
  private watchdogPinging = false

  private constructor(
    readonly appId: string,
    private readonly code: string,
    private readonly loadTimeoutMs: number,
    private readonly limits: AppLimits,
    dispatch: GraphDispatcher,
    private readonly log: (message: string) => void,
    private readonly readSchemas: SchemasReader,
    observer: RequestObserver | undefined,
    /** Where its worker's restarts run: closed when the driver closes, or with its owner's scope. */
    private readonly scope: Scope.CloseableScope,
    /** The hosts its processes may connect to. */
    private readonly outbound: OutboundRules | undefined,
    output: AppLog | undefined
  ) {
    this.share = { app: appId, weight: 1 }
    this.output = output ?? new AppLog(appId)
    this.channelBudget = new ChannelBudget(channelRateOf(limits.maxResponseBytes))
    this.clocks = new RequestClocks(appId, observer)
    this.dispatches = new AppDispatches(
      dispatch,
      this.clocks,
      (message) => this.post(message),
      () => this.share
    )
    this.watchdog = setInterval(() => {
      if (this.watchdogPinging || this.replies.size === 0) return
      this.watchdogPinging = true
      void this.ensureResponsive(limits.stallMs).finally(() => {
        this.watchdogPinging = false
      })
    }, watchdogPeriodMs)
    this.watchdog.unref()
  }

  static async start(options: {
    readonly appId: string
    readonly code: string
    readonly loadTimeoutMs: number
    readonly limits: AppLimits
    readonly dispatch: GraphDispatcher
    readonly log: (message: string) => void
    /** Reads the schemas its process sends when it loads (the schema thread's). */
    readonly readSchemas: SchemasReader
    readonly observer?: RequestObserver
    /** The owner's scope (the app manager's): the driver's work ends with it at the latest. */
    readonly scope: Scope.Scope
    /** The hosts the app's registration allows it to connect to. */
    readonly outbound?: OutboundRules
    /** Where its processes' output goes: the app's log, kept across its versions (a new one when absent). */
    readonly output?: AppLog
  }): Promise<{ readonly driver: AppDriver; readonly loaded: LoadedApp }> {
    const driver = new AppDriver(
      options.appId,
      options.code,
      options.loadTimeoutMs,
      options.limits,
      options.dispatch,
      options.log,
      options.readSchemas,
      options.observer,
      Effect.runSync(Scope.fork(options.scope, ExecutionStrategy.sequential)),
      options.outbound,
      options.output
    )
    const loaded = await driver.spawn().catch(async (error: unknown) => {
      clearInterval(driver.watchdog)
      await Effect.runPromise(Scope.close(driver.scope, Exit.void))
      throw error
    })
    return { driver, loaded }
  }

  get inFlight(): number {
    return this.replies.size
  }

  /** Whether its process is being started again after it stopped. */
  get isRestarting(): boolean {
    return this.restarting !== undefined
  }

  /** Hands a request to the app; `parent` is the gateway's span of it. */
  invoke(requestId: string, body: string, handlers: ReplyHandlers, parent?: Span): number {
    const rid = this.nextRid++
    this.replies.set(rid, handlers)
    this.clocks.start(rid, requestId, parent)
    if (this.restarting !== undefined) {
      void this.restarting.then(
        () => this.replies.has(rid) && this.post({ t: "invoke", rid, requestId, body }),
        () => undefined
      )
    } else {
      this.post({ t: "invoke", rid, requestId, body })
    }
    return rid
  }

  /** `chars` characters of a request's streamed lines left the gateway: the app may send as many more. */
  delivered(rid: number, chars: number): void {
    const acknowledged = this.answerLedgers.get(rid)?.consumed(chars) ?? 0
    if (acknowledged > 0) this.post({ t: "credit", rid, chars: acknowledged })
  }

  /** The client went away or the request timed out: stop waiting for it and tell the app. */
  cancel(rid: number): void {
    this.answerLedgers.delete(rid)
    this.clocks.stop(rid, "cancelled")
    if (this.replies.delete(rid)) {
      this.post({ t: "cancel", rid })
      this.notifyIfIdle()
    }
  }

  /** Whether the worker's event loop answers within `timeoutMs`; restarts it when it does not. */
  async ensureResponsive(timeoutMs: number): Promise<boolean> {
    if (this.closing || this.restarting !== undefined) return true
    const nonce = this.nextNonce++
    const answered = await new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => {
        this.pongs.delete(nonce)
        resolve(false)
      }, timeoutMs)
      this.pongs.set(nonce, () => {
        clearTimeout(timer)
        resolve(true)
      })
      this.post({ t: "ping", nonce })
    })
    if (!answered && !this.closing) {
      this.log(`app ${this.appId}: its worker is stuck (no answer in ${timeoutMs} ms); restarting it`)
      this.stopReason = `the app's process was stopped: its code did not yield to the event loop for ${timeoutMs} ms (a loop that never awaits?)`
      await this.worker.terminate()
    }
    return answered
  }

  /** Resolves when no request is in flight, or after `timeoutMs`; true when it drained. */
  drain(timeoutMs: number): Promise<boolean> {
    if (this.replies.size === 0) return Promise.resolve(true)
    return new Promise((resolve) => {
      const timer = setTimeout(() => resolve(false), timeoutMs)
      this.idleWaiters.push(() => {
        clearTimeout(timer)
        resolve(true)
      })
    })
  }

  /** The last lines the app wrote to its stdout and stderr, across its restarts. */
  logTail(): string {
    return this.output.tail()
  }

  async close(): Promise<void> {
    this.closing = true
    clearInterval(this.watchdog)
    // A restart under way stops here: its fiber is the scope's.
    await Effect.runPromise(Scope.close(this.scope, Exit.void))
    this.dispatches.abortAll(false)
    this.failAll("the app was unloaded")
    await this.worker.terminate()
  }

  private post(message: ToApp) {
    this.worker.postMessage(message)
  }

  private spawn(): Promise<LoadedApp> {
    const worker = new AppProcess(this.code, this.limits, this.output, this.outbound, this.channelBudget)
    this.worker = worker
    this.dispatches.newProcess()
    this.stopReason = undefined
    return loadIn(worker, {
      timeoutMs: this.loadTimeoutMs,
      readSchemas: this.readSchemas,
      isCurrent: () => this.worker === worker,
      loaded: (app) => {
        this.loadedAt = Date.now()
        this.dispatches.declare(app.tasks.map((task) => task.id))
        this.loaded = app
      },
      message: (message) => this.onMessage(message),
      violation: (reason) => this.violation(reason),
      failed: (error) => {
        this.stopReason = error.message
        this.log(`app ${this.appId}: its worker failed: ${error.message}`)
      },
      exited: (code) => {
        if (!this.closing) this.restart(code)
      }
    })
  }

  private restart(exitCode: number) {
    const reason = this.stopReason ?? `the app's worker stopped (exit code ${exitCode})`
    this.lastStop = { reason, at: new Date().toISOString() }
    this.output.note(`${reason}; it is being restarted`)
    this.failAll(`${reason}; it is being restarted`)
    this.dispatches.abortAll(true)
    this.log(`app ${this.appId}: its process exited with code ${exitCode}`)
    const respawning = Effect.runSync(
      Effect.forkIn(this.respawnAfter(Duration.millis(Date.now() - this.loadedAt)), this.scope)
    )
    this.restarting = Effect.runPromise(Fiber.await(respawning)).then(() => {
      this.restarting = undefined
    })
  }

  /** Waits as long as the restart policy says, then starts the worker again, until one loads. */
  private respawnAfter(uptime: Duration.Duration): Effect.Effect<void> {
    const respawn = Effect.tryPromise({ try: () => this.spawn(), catch: (error) => error as AppLoadError })
    return this.restarts.next(uptime).pipe(
      // The policy never runs out: it says how long to wait, not whether to restart.
      Effect.orDie,
      Effect.zipRight(respawn),
      Effect.asVoid,
      Effect.catchAll((error) => {
        this.log(`app ${this.appId}: its worker did not start again: ${error.message}`)
        return this.respawnAfter(Duration.zero)
      })
    )
  }

  private failAll(message: string) {
    for (const rid of this.replies.keys()) this.clocks.stop(rid, { _tag: "WorkerStopped", message })
    const handlers = [...this.replies.values()]
    this.replies.clear()
    this.answerLedgers.clear()
    for (const handler of handlers) handler.onFailed("WorkerStopped", message)
    this.notifyIfIdle()
  }

  private notifyIfIdle() {
    if (this.replies.size > 0) return
    const waiters = this.idleWaiters
    this.idleWaiters = []
    for (const wake of waiters) wake()
  }

  private settle(
    rid: number,
    failure?: { readonly _tag: string; readonly message: string }
  ): ReplyHandlers | undefined {
    this.clocks.stop(rid, failure)
    const handlers = this.replies.get(rid)
    this.replies.delete(rid)
    this.answerLedgers.delete(rid)
    this.notifyIfIdle()
    return handlers
  }

  /**
   * Acts on a message of the app's process, which runs the app's code: a message that does not fit
   * what the process was asked (a request it was not given, a stream out of order, a task its app did
   * not declare, a dispatch it did not make) breaks the protocol, and the process is stopped.
   */
  private onMessage(message: FromApp) {
    switch (message.t) {
      case "value": {
        const standing = this.standing(message.rid, message.t)
        if (standing === "streaming")
          return this.violation(`it sent a value for request ${message.rid}, whose stream had started`)
        if (standing !== "waiting" || this.oversized(message.rid, message.json)) return
        this.settle(message.rid)?.onValue(message.json)
        return
      }
      case "stream-start": {
        const standing = this.standing(message.rid, message.t)
        if (standing === "streaming") return this.violation(`it started the stream of request ${message.rid} twice`)
        if (standing !== "waiting") return
        this.answerLedgers.set(message.rid, new ReceiveLedger(answerWindowChars))
        this.replies.get(message.rid)?.onStreamStart()
        return
      }
      case "chunk": {
        const standing = this.standing(message.rid, message.t)
        if (standing === "waiting")
          return this.violation(`it sent a chunk for request ${message.rid} before starting its stream`)
        const ledger = this.answerLedgers.get(message.rid)
        if (standing !== "streaming" || ledger === undefined) return
        // Only an app that replaced the SDK's sending code gets here; it would fill the platform's heap.
        if (!ledger.received(message.json.length))
          return this.violation(`it streamed request ${message.rid} past its window`)
        if (this.oversized(message.rid, message.json)) return
        this.replies.get(message.rid)?.onChunk(message.json)
        return
      }
      case "end": {
        const standing = this.standing(message.rid, message.t)
        if (standing === "waiting")
          return this.violation(`it ended the stream of request ${message.rid}, which it had not started`)
        if (standing === "streaming") this.settle(message.rid)?.onEnd()
        return
      }
      case "failed": {
        const standing = this.standing(message.rid, message.t)
        if (standing !== "waiting" && standing !== "streaming") return
        this.settle(message.rid, { _tag: message.code, message: message.message })?.onFailed(
          message.code,
          message.message,
          message.issues
        )
        return
      }
      case "pong":
        this.pongs.get(message.nonce)?.()
        this.pongs.delete(message.nonce)
        return
      case "dispatch": {
        const refusal = this.dispatches.start(message)
        if (refusal !== undefined) this.violation(refusal)
        return
      }
      case "dispatch-cancel":
        if (this.unknownDispatch(message.did, message.t)) return
        this.dispatches.cancel(message.did)
        return
      case "dispatch-credit":
        if (this.unknownDispatch(message.did, message.t)) return
        this.dispatches.credit(message.did, message.chunks)
        return
    }
  }

  /**
   * Where request `rid` stands, for a message of the app's about it: waiting for its answer, streaming
   * it, or ended (a cancelled request's late messages cross the cancel). A request the app was never
   * given breaks the protocol: undefined.
   */
  private standing(rid: number, kind: FromApp["t"]): "waiting" | "streaming" | "ended" | undefined {
    if (rid < 0 || rid >= this.nextRid) {
      this.violation(`it sent "${kind}" for request ${rid}, which it was never given`)
      return undefined
    }
    if (!this.replies.has(rid)) return "ended"
    return this.answerLedgers.has(rid) ? "streaming" : "waiting"
  }

  /** Whether `did` names no dispatch the app's process made (which breaks the protocol); an ended one is known. */
  private unknownDispatch(did: number, kind: FromApp["t"]): boolean {
    if (this.dispatches.made(did)) return false
    this.violation(`it sent "${kind}" for dispatch ${did}, which it never made`)
    return true
  }

  /** The app's process broke the protocol: it is stopped, its requests fail, it is restarted. */
  private violation(reason: string) {
    this.worker.stop(`the app's process broke the protocol: ${reason}`)
  }

  /**
   * Fails a request whose answer or line is over the limit. The app's process checks before it sends;
   * this catches an app that replaced that check, before the answer goes any further.
   */
  private oversized(rid: number, json: string): boolean {
    if (!jsonExceeds(json, this.limits.maxResponseBytes)) return false
    const message = responseTooLargeMessage(this.limits.maxResponseBytes)
    this.settle(rid, { _tag: "ResponseTooLarge", message })?.onFailed("ResponseTooLarge", message)
    this.post({ t: "cancel", rid })
    return true
  }
}
