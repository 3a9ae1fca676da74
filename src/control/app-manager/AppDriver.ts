import { Duration, Effect, ExecutionStrategy, Exit, Fiber, Schedule, Schema, Scope } from "effect"
import type { AdmissionSettings } from "../../app-runtime/App.js"
import { Admission, unlimitedAdmission } from "./Admission.js"
import type { TaskGraphWire } from "../../app-runtime/tasks/TaskGraph.js"
import {
  type FromWorker,
  type InvokeFailureCode,
  jsonExceeds,
  responseTooLargeMessage,
  type SchemaIssue,
  type ToWorker,
  type UnitTaskSpec
} from "../../app-runtime/driver/protocol.js"
import { watchSignal } from "../../app-runtime/driver/Cancellation.js"
import {
  answerWindowChars,
  dispatchWindowChunks,
  ReceiveLedger,
  SendWindow
} from "../../app-runtime/driver/StreamWindow.js"
import { AppProcess, type AppProcessLimits } from "./AppProcess.js"
import { restartPolicy } from "../../process/RestartPolicy.js"
import { type AppShare, dispatchFailureOf, type GraphDispatcher, type RequestObserver } from "../DispatchContract.js"
import { BusyClock, type RequestTiming } from "../../metrics/BusyClock.js"
import { type Span, startSpan } from "../../tracing/Tracing.js"

/**
 * How a reply to one request unfolds; exactly one of value / stream-start+end / failed happens.
 * Each chunk handed to `onChunk` must be reported back with `AppDriver.delivered` once it has left
 * (the app pauses when too many characters are undelivered).
 */
export interface ReplyHandlers {
  onValue(json: string): void
  onStreamStart(): void
  onChunk(json: string): void
  onEnd(): void
  onFailed(code: InvokeFailureCode | "WorkerStopped", message: string, issues?: ReadonlyArray<SchemaIssue>): void
}

interface RequestClock {
  readonly requestId: string
  readonly started: number
  /** Made at the request's first dispatch: a request that dispatches nothing (an app without tasks) needs none. */
  timing: RequestTiming | undefined
  /** The request's time in the app, in its trace. */
  readonly span: Span
}

export interface LoadedApp {
  readonly tasks: ReadonlyArray<UnitTaskSpec>
  readonly example: unknown
  readonly description: string | undefined
  readonly admission: AdmissionSettings | undefined
}

/** Why an app's process could not load it: the registration's error, or a restart's. */
export class AppLoadError extends Schema.TaggedError<AppLoadError>()("AppLoadError", { message: Schema.String }) {}

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
 * app stays registered.
 */
export class AppDriver {
  /** Who may run now, who waits, who is refused: set from the app's settings once it has loaded. */
  admission = new Admission(unlimitedAdmission)
  /** Its claim on shared tasks: set from the app's settings once it has loaded. */
  share: AppShare
  private worker!: AppProcess
  private readonly replies = new Map<number, ReplyHandlers>()
  /** What arrived and left of each streaming request's lines, to give the app room as they leave. */
  private readonly answerLedgers = new Map<number, ReceiveLedger>()
  private readonly dispatches = new Map<number, AbortController>()
  private readonly dispatchWindows = new Map<number, SendWindow>()
  /** Where each request's time goes, by rid and by request id (dispatches name their request by id). */
  private readonly clocks = new Map<number, RequestClock>()
  private readonly clocksById = new Map<string, RequestClock>()
  private nextRid = 0
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

  /** Asks the app's process for a sign of life, whether or not any client is still waiting on it. */
  private readonly watchdog: NodeJS.Timeout
  private watchdogPinging = false

  private constructor(
    readonly appId: string,
    private readonly code: string,
    private readonly loadTimeoutMs: number,
    private readonly limits: AppLimits,
    private readonly dispatch: GraphDispatcher,
    private readonly log: (message: string) => void,
    private readonly observer: RequestObserver | undefined,
    /** Where its worker's restarts run: closed when the driver closes, or with its owner's scope. */
    private readonly scope: Scope.CloseableScope
  ) {
    this.share = { app: appId, weight: 1 }
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
    readonly observer?: RequestObserver
    /** The owner's scope (the app manager's): the driver's work ends with it at the latest. */
    readonly scope: Scope.Scope
  }): Promise<{ readonly driver: AppDriver; readonly loaded: LoadedApp }> {
    const driver = new AppDriver(
      options.appId,
      options.code,
      options.loadTimeoutMs,
      options.limits,
      options.dispatch,
      options.log,
      options.observer,
      Effect.runSync(Scope.fork(options.scope, ExecutionStrategy.sequential))
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

  /** Hands a request to the app; `parent` is the gateway's span of it. */
  invoke(requestId: string, body: string, handlers: ReplyHandlers, parent?: Span): number {
    const rid = this.nextRid++
    this.replies.set(rid, handlers)
    const span = startSpan(`app ${this.appId}`, {
      parent,
      attributes: { "cornserve.app": this.appId, "cornserve.request_id": requestId }
    })
    const clock: RequestClock = { requestId, started: performance.now(), timing: undefined, span }
    this.clocks.set(rid, clock)
    this.clocksById.set(requestId, clock)
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
    this.stopClock(rid, "cancelled")
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

  async close(): Promise<void> {
    this.closing = true
    clearInterval(this.watchdog)
    // A restart under way stops here: its fiber is the scope's.
    await Effect.runPromise(Scope.close(this.scope, Exit.void))
    for (const controller of this.dispatches.values()) controller.abort()
    this.failAll("the app was unloaded")
    await this.worker.terminate()
  }

  private post(message: ToWorker) {
    this.worker.postMessage(message)
  }

  private spawn(): Promise<LoadedApp> {
    const worker = new AppProcess(this.code, this.limits)
    this.worker = worker
    return new Promise<LoadedApp>((resolve, reject) => {
      let loaded = false
      const timer = setTimeout(() => {
        reject(new AppLoadError({ message: `the app did not finish loading within ${this.loadTimeoutMs} ms` }))
        void worker.terminate()
      }, this.loadTimeoutMs)
      worker.on("message", (message: FromWorker) => {
        if (message.t === "loaded") {
          loaded = true
          this.loadedAt = Date.now()
          clearTimeout(timer)
          resolve({
            tasks: message.tasks,
            example: message.example,
            description: message.description,
            admission: message.admission
          })
        } else if (message.t === "load-failed") {
          clearTimeout(timer)
          reject(new AppLoadError({ message: message.message }))
          void worker.terminate()
        } else {
          this.onMessage(message)
        }
      })
      worker.on("error", (error) => {
        if (!loaded) {
          clearTimeout(timer)
          reject(new AppLoadError({ message: `the app failed while loading: ${error.message}` }))
        } else {
          this.log(`app ${this.appId}: its worker failed: ${error.stack ?? error.message}`)
        }
      })
      worker.on("exit", (code) => {
        clearTimeout(timer)
        if (!loaded) {
          reject(new AppLoadError({ message: `the app's process exited with code ${code} while loading` }))
          return
        }
        if (!this.closing && this.worker === worker) this.restart(code)
      })
    })
  }

  private restart(exitCode: number) {
    this.failAll(`the app's worker stopped (exit code ${exitCode}); it is being restarted`)
    for (const controller of this.dispatches.values()) controller.abort()
    this.dispatches.clear()
    this.dispatchWindows.clear()
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
    for (const rid of this.replies.keys()) this.stopClock(rid, { _tag: "WorkerStopped", message })
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

  /**
   * A request ended (failed with `failure`, or cancelled by its client): its span ends, where its
   * time went goes to the observer.
   */
  private stopClock(rid: number, failure?: { readonly _tag: string; readonly message: string } | "cancelled") {
    const clock = this.clocks.get(rid)
    if (clock === undefined) return
    this.clocks.delete(rid)
    this.clocksById.delete(clock.requestId)
    if (failure === "cancelled") {
      clock.span.attribute("cornserve.cancelled", true)
      clock.span.end()
    } else clock.span.end(failure)
    const now = performance.now()
    this.observer?.ended(
      this.appId,
      (now - clock.started) / 1000,
      (clock.timing?.dispatches.busyMs(now) ?? 0) / 1000,
      (clock.timing?.executors.busyMs(now) ?? 0) / 1000
    )
  }

  private settle(
    rid: number,
    failure?: { readonly _tag: string; readonly message: string }
  ): ReplyHandlers | undefined {
    this.stopClock(rid, failure)
    const handlers = this.replies.get(rid)
    this.replies.delete(rid)
    this.answerLedgers.delete(rid)
    this.notifyIfIdle()
    return handlers
  }

  private onMessage(message: FromWorker) {
    switch (message.t) {
      case "value":
        if (this.oversized(message.rid, message.json)) return
        this.settle(message.rid)?.onValue(message.json)
        return
      case "stream-start":
        if (!this.replies.has(message.rid)) return
        this.answerLedgers.set(message.rid, new ReceiveLedger(answerWindowChars))
        this.replies.get(message.rid)?.onStreamStart()
        return
      case "chunk": {
        const ledger = this.answerLedgers.get(message.rid)
        if (ledger === undefined) return
        if (!ledger.received(message.json.length)) {
          // Only an app that replaced the SDK's sending code gets here; it would fill the platform's heap.
          this.log(`app ${this.appId}: its process streamed past its window; restarting it`)
          void this.worker.terminate()
          return
        }
        if (this.oversized(message.rid, message.json)) return
        this.replies.get(message.rid)?.onChunk(message.json)
        return
      }
      case "end":
        this.settle(message.rid)?.onEnd()
        return
      case "failed":
        this.settle(message.rid, { _tag: message.code, message: message.message })?.onFailed(
          message.code,
          message.message,
          message.issues
        )
        return
      case "pong":
        this.pongs.get(message.nonce)?.()
        this.pongs.delete(message.nonce)
        return
      case "dispatch":
        void this.runDispatch(message.did, message.requestId, message.graph)
        return
      case "dispatch-cancel":
        this.dispatches.get(message.did)?.abort()
        this.dispatches.delete(message.did)
        return
      case "dispatch-credit":
        this.dispatchWindows.get(message.did)?.acknowledged(message.chunks)
        return
    }
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

  private async runDispatch(did: number, requestId: string, graph: TaskGraphWire) {
    const controller = new AbortController()
    this.dispatches.set(did, controller)
    const request = this.clocksById.get(requestId)
    if (request !== undefined) request.timing ??= { dispatches: new BusyClock(), executors: new BusyClock() }
    const clock = request?.timing
    clock?.dispatches.enter()
    try {
      const outcome = await this.dispatch(graph, requestId, controller.signal, {
        ...(clock === undefined ? {} : { timing: clock }),
        ...(request === undefined ? {} : { span: request.span }),
        share: this.share
      })
      if (controller.signal.aborted) return
      this.post({ t: "dispatched", did, outputs: outcome.outputs, streams: outcome.stream !== undefined })
      if (outcome.stream !== undefined) {
        const window = new SendWindow(dispatchWindowChunks)
        this.dispatchWindows.set(did, window)
        for await (const chunk of outcome.stream) {
          if (controller.signal.aborted) return
          // Not pulling the next chunk leaves the executor's response body unread: its TCP stream pauses.
          if (!window.open) await window.opened(watchSignal(controller.signal))
          if (controller.signal.aborted) return
          this.post({ t: "dispatch-chunk", did, chunk })
          window.sent(1)
        }
        this.post({ t: "dispatch-end", did })
      }
    } catch (error) {
      if (!controller.signal.aborted) {
        this.post({ t: "dispatch-failed", did, failure: dispatchFailureOf(error) })
      }
    } finally {
      clock?.dispatches.leave()
      this.dispatches.delete(did)
      this.dispatchWindows.delete(did)
    }
  }
}
