import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as ExecutionStrategy from "effect/ExecutionStrategy"
import * as Exit from "effect/Exit"
import * as Fiber from "effect/Fiber"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import * as Scope from "effect/Scope"
import { type AdmissionSettings, admissionProblems, timeoutProblem } from "../../app-runtime/App.js"
import { Admission, unlimitedAdmission } from "./Admission.js"
import type { TaskGraphWire } from "../../app-runtime/tasks/TaskGraph.js"
import {
  type FromWorker,
  jsonExceeds,
  responseTooLargeMessage,
  type ToWorker,
  type UnitTaskSpec
} from "../../app-runtime/driver/protocol.js"
import { watchSignal } from "../../app-runtime/driver/Cancellation.js"
import type { AppSchemasWire } from "../../app-runtime/driver/AppSchemas.js"
import {
  answerWindowChars,
  dispatchWindowChunks,
  ReceiveLedger,
  SendWindow
} from "../../app-runtime/driver/StreamWindow.js"
import { AppLog } from "./AppLog.js"
import type { OutboundRules } from "./OutboundProxy.js"
import { AppProcess, type AppProcessLimits } from "./AppProcess.js"
import { ChannelBudget, channelRateOf } from "./ChannelBudget.js"
import { restartPolicy } from "../../process/RestartPolicy.js"
import { type AppShare, dispatchFailureOf, type GraphDispatcher, type RequestObserver } from "../DispatchContract.js"
import type { Span } from "../../tracing/Tracing.js"
import { RequestClocks } from "./RequestClocks.js"
import type { ReplyHandlers } from "./ReplyHandlers.js"
import { type CleanedSchemas, undescribedCleanedSchemas } from "../SchemaThread.js"

export interface LoadedApp {
  readonly tasks: ReadonlyArray<UnitTaskSpec>
  readonly example: unknown
  readonly description: string | undefined
  readonly admission: AdmissionSettings | undefined
  /** How long its requests may take, streams included, by its own definition. */
  readonly timeoutMs: number | undefined
  /** What it takes and answers, as JSON Schema: cleaned, as the schema thread wrote them. */
  readonly schemas: CleanedSchemas
}

/** Reads the schemas an app's process sent, off the main thread: cleaned, or why they are refused. */
export type SchemasReader = (wire: AppSchemasWire) => Promise<CleanedSchemas | string>

/** The most messages a process may send between its "loaded" and the end of its schemas' reading (the SDK sends none). */
const maxHeldWhileReading = 16

/** Why an app's process could not load it: the registration's error, or a restart's. */
export class AppLoadError extends Schema.TaggedError<AppLoadError>()("AppLoadError", { message: Schema.String }) {}

/** What an app's process may use: its memory, and how long its event loop may stay busy. */
export interface AppLimits extends AppProcessLimits {
  /** An app whose event loop does not answer a ping for this long (a request spinning) is restarted. */
  readonly stallMs: number
}

/** How often the watchdog pings an app that has requests in flight. */
const watchdogPeriodMs = 1_000

/** Why an app's own admission settings, as its process sent them, are refused; undefined when they are in bounds. */
const admissionRefusal = (admission: unknown): string | undefined => {
  if (admission === undefined) return undefined
  const problems = admissionProblems(admission, "admission")
  return problems.length === 0 ? undefined : `the app's admission settings are out of bounds: ${problems.join("; ")}`
}

/** Why the settings an app's process sent at load cannot be taken (its admission, its timeout), if they cannot. */
const settingsRefusal = (message: { readonly admission?: unknown; readonly timeoutMs?: unknown }): string | undefined =>
  admissionRefusal(message.admission) ?? timeoutProblem(message.timeoutMs, "timeoutMs")

/** What an app's "loaded" message says, or why it cannot be taken; its schemas are read by `readSchemas`. */
const loadedApp = async (
  message: Extract<FromWorker, { readonly t: "loaded" }>,
  readSchemas: SchemasReader
): Promise<LoadedApp | string> => {
  const refusal = settingsRefusal(message)
  if (refusal !== undefined) return refusal
  const schemas =
    message.schemas === undefined
      ? undescribedCleanedSchemas
      : await readSchemas(message.schemas).catch(
          (error: unknown) => `they could not be read (${error instanceof Error ? error.message : String(error)})`
        )
  if (typeof schemas === "string") return `the app's process sent schemas the platform cannot read: ${schemas}`
  return {
    tasks: message.tasks,
    example: message.example,
    description: message.description,
    admission: message.admission,
    timeoutMs: message.timeoutMs,
    schemas
  }
}

/**
 * The platform's side of one app's process. Requests are tagged with a number and their
 * replies routed back to their handlers. A worker that dies is started again after the wait
 * `restartPolicy` picks (requests that arrive meanwhile wait for it); the requests it held fail, the
 * app stays registered.
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
  private readonly dispatches = new Map<number, AbortController>()
  private readonly dispatchWindows = new Map<number, SendWindow>()
  /** Where each request's time goes, by rid and by request id (dispatches name their request by id). */
  private readonly clocks: RequestClocks
  private nextRid = 0
  /** The lowest dispatch id the app's current process has not used: its ids only grow. */
  private nextDispatchId = 0
  /** The unit tasks the app declared when it loaded: the only ones it may dispatch. */
  private declaredTasks: ReadonlySet<string> = new Set()
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
    private readonly dispatch: GraphDispatcher,
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
    for (const controller of this.dispatches.values()) controller.abort()
    this.failAll("the app was unloaded")
    await this.worker.terminate()
  }

  private post(message: ToWorker) {
    this.worker.postMessage(message)
  }

  private spawn(): Promise<LoadedApp> {
    const worker = new AppProcess(this.code, this.limits, this.output, this.outbound, this.channelBudget)
    this.worker = worker
    this.nextDispatchId = 0
    this.stopReason = undefined
    return new Promise<LoadedApp>((resolve, reject) => {
      /**
       * Its schemas are read once it says it loaded, off the main thread; it is loaded once they are.
       * What it sends meanwhile waits, to be acted on as it would have been at once.
       */
      let stage: "loading" | "reading" | "loaded" | "failed" = "loading"
      const held: Array<FromWorker> = []
      const fail = (error: AppLoadError) => {
        clearTimeout(timer)
        stage = "failed"
        held.length = 0
        reject(error)
      }
      const timer = setTimeout(() => {
        fail(new AppLoadError({ message: `the app did not finish loading within ${this.loadTimeoutMs} ms` }))
        void worker.terminate()
      }, this.loadTimeoutMs)
      const accept = async (message: Extract<FromWorker, { readonly t: "loaded" }>) => {
        const app = await loadedApp(message, this.readSchemas)
        if (stage !== "reading") return
        if (typeof app === "string") {
          // defineApp and the SDK check them in the app's process; a process that skips it is checked here.
          fail(new AppLoadError({ message: app }))
          void worker.terminate()
          return
        }
        clearTimeout(timer)
        stage = "loaded"
        this.loadedAt = Date.now()
        this.declaredTasks = new Set(app.tasks.map((task) => task.id))
        this.loaded = app
        resolve(app)
        for (const message of held.splice(0)) if (this.worker === worker && !worker.stopping) act(message)
      }
      const act = (message: FromWorker) => {
        if (stage !== "loading" && (message.t === "loaded" || message.t === "load-failed")) {
          this.violation(`it sent "${message.t}" after its app had loaded`)
        } else if (message.t === "loaded") {
          stage = "reading"
          void accept(message)
        } else if (message.t === "load-failed") {
          fail(new AppLoadError({ message: message.message }))
          void worker.terminate()
        } else if (stage !== "loaded") {
          this.violation(`it sent "${message.t}" before its app had loaded`)
        } else {
          this.onMessage(message)
        }
      }
      worker.on("message", (message: FromWorker) => {
        if (this.worker !== worker || stage === "failed") return
        if (stage !== "reading") act(message)
        else if (held.length < maxHeldWhileReading) held.push(message)
        else this.violation(`it sent more than ${maxHeldWhileReading} messages while its schemas were read`)
      })
      worker.on("error", (error) => {
        if (stage !== "loaded") {
          fail(new AppLoadError({ message: `the app failed while loading: ${error.message}` }))
        } else if (this.worker === worker) {
          this.stopReason = error.message
          this.log(`app ${this.appId}: its worker failed: ${error.message}`)
        }
      })
      worker.on("exit", (code) => {
        if (stage !== "loaded") {
          fail(new AppLoadError({ message: `the app's process exited with code ${code} while loading` }))
          return
        }
        if (!this.closing && this.worker === worker) this.restart(code)
      })
    })
  }

  private restart(exitCode: number) {
    const reason = this.stopReason ?? `the app's worker stopped (exit code ${exitCode})`
    this.lastStop = { reason, at: new Date().toISOString() }
    this.output.note(`${reason}; it is being restarted`)
    this.failAll(`${reason}; it is being restarted`)
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
  private onMessage(message: FromWorker) {
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
        if (message.did < this.nextDispatchId) return this.violation(`it used dispatch id ${message.did} again`)
        const undeclared = message.graph.invocations.find((invocation) => !this.declaredTasks.has(invocation.taskId))
        if (undeclared !== undefined)
          return this.violation(`it dispatched task ${undeclared.taskId.slice(0, 200)}, which its app does not declare`)
        this.nextDispatchId = message.did + 1
        void this.runDispatch(message.did, message.requestId, message.graph)
        return
      }
      case "dispatch-cancel":
        if (this.unknownDispatch(message.did, message.t)) return
        this.dispatches.get(message.did)?.abort()
        this.dispatches.delete(message.did)
        this.dispatchWindows.delete(message.did)
        return
      case "dispatch-credit":
        if (this.unknownDispatch(message.did, message.t)) return
        this.dispatchWindows.get(message.did)?.acknowledged(message.chunks)
        return
    }
  }

  /**
   * Where request `rid` stands, for a message of the app's about it: waiting for its answer, streaming
   * it, or ended (a cancelled request's late messages cross the cancel). A request the app was never
   * given breaks the protocol: undefined.
   */
  private standing(rid: number, kind: FromWorker["t"]): "waiting" | "streaming" | "ended" | undefined {
    if (rid < 0 || rid >= this.nextRid) {
      this.violation(`it sent "${kind}" for request ${rid}, which it was never given`)
      return undefined
    }
    if (!this.replies.has(rid)) return "ended"
    return this.answerLedgers.has(rid) ? "streaming" : "waiting"
  }

  /** Whether `did` names no dispatch the app's process made (which breaks the protocol); an ended one is known. */
  private unknownDispatch(did: number, kind: FromWorker["t"]): boolean {
    if (did >= 0 && did < this.nextDispatchId) return false
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

  private async runDispatch(did: number, requestId: string, graph: TaskGraphWire) {
    const controller = new AbortController()
    this.dispatches.set(did, controller)
    const request = this.clocks.dispatchOf(requestId)
    request.timing?.dispatches.enter()
    try {
      const outcome = await this.dispatch(graph, requestId, controller.signal, { ...request, share: this.share })
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
      request.timing?.dispatches.leave()
      // A restarted process numbers its dispatches from 0 again: leave its dispatch of the same id alone.
      if (this.dispatches.get(did) === controller) {
        this.dispatches.delete(did)
        this.dispatchWindows.delete(did)
      }
    }
  }
}
