/**
 * The process one app runs in (started by the platform's AppProcess, under Node's permission model):
 * evaluates the app's module, validates its export, and runs its `serve` for each request the
 * platform hands over through its channel (frames on a pipe, fd 3). The app never shares a heap, a
 * process or a secret with the platform.
 */
import { AsyncLocalStorage } from "node:async_hooks"
import { Socket } from "node:net"
import { constants } from "node:os"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import { type App, appDefinitionProblems, appUnitTasks, isApp } from "../App.js"
import { issueLines, readableIssues } from "../SchemaIssues.js"
import { shortened } from "../Shortened.js"
import { type DispatchResult, setTaskDispatcher, TaskExecutionError, TaskInputError } from "../tasks/TaskGraph.js"
import {
  type DispatchFailure,
  encodeFrame,
  FrameReader,
  frameHeaderBytes,
  type FromApp,
  type InvokeFailureCode,
  jsonExceeds,
  type LoadApp,
  responseTooLargeMessage,
  type SchemaIssue,
  type ToAppProcess
} from "./protocol.js"
import { appSchemasOf } from "./AppSchemas.js"
import { Cancellation } from "./Cancellation.js"
import { answerWindowChars, dispatchWindowChunks, ReceiveLedger, SendWindow } from "./StreamWindow.js"

/** The platform's channel: a pipe on fd 3 carrying frames (protocol.ts). */
const channel = new Socket({ fd: 3, readable: true, writable: true })
const post = (message: FromApp) => {
  channel.write(encodeFrame(message))
}

/** Where the platform's messages go: first to the loader, then to the app's server. */
let onPlatformMessage: (message: ToAppProcess) => void = () => undefined
const fromPlatform = new FrameReader(Number.MAX_SAFE_INTEGER)
const deliver = (message: unknown) => onPlatformMessage(message as ToAppProcess)
channel.on("data", (chunk: Buffer) => {
  // The platform is trusted: a frame of its that does not parse means the channel is broken.
  if (fromPlatform.read(chunk, deliver) !== undefined) process.exit(1)
})
// The platform going away, however it goes, takes the app with it.
channel.on("close", () => process.exit(0))
channel.on("error", () => process.exit(0))
// A terminal's Ctrl-C reaches this process with the platform's: the platform lets the app's
// requests in flight finish first, then stops it.
process.on("SIGINT", () => undefined)

/**
 * The permission model leaves signals alone, so an app could still kill the platform (or any process
 * of the same user) by pid. Every way to signal another process goes through `process._kill`; it
 * now signals this process only, and nothing the app runs later can put the original back.
 */
const confineSignals = () => {
  const internals = process as unknown as {
    _kill: (pid: number, signal: number) => number
    _debugProcess: (pid: number) => void
  }
  const kill = internals._kill.bind(process)
  const refuse = { writable: false, configurable: false, enumerable: false }
  Object.defineProperty(process, "_kill", {
    ...refuse,
    value: (pid: number, signal: number) => (pid === process.pid ? kill(pid, signal) : -constants.errno.EPERM)
  })
  Object.defineProperty(process, "_debugProcess", {
    ...refuse,
    value: () => {
      throw Object.assign(new Error("an app may not debug other processes"), { code: "ERR_ACCESS_DENIED" })
    }
  })
}

const requestContext = new AsyncLocalStorage<{ readonly requestId: string; readonly cancellation: Cancellation }>()

/**
 * The context `serve` is given. Its AbortSignal is made only if the app's code reads it (see
 * Cancellation); the getter is the class's, since an object literal with a getter costs a closure
 * and an accessor pair per request, which V8 promotes out of the young generation as it does an
 * AbortController.
 */
class ServeContext {
  constructor(
    readonly requestId: string,
    private readonly cancellation: Cancellation
  ) {}

  get signal(): AbortSignal {
    return this.cancellation.signal
  }
}

/** Schema issues reported for one request; a request with more has more than a client needs to see. */
const maxIssues = 20

/** Longest message the platform takes from an app's failure: an error never echoes a large value back. */
const maxMessageLength = 2_000

/** What a thrown value says about itself; total, whatever the app threw (a Proxy, a throwing toString). */
const errorMessage = (error: unknown): string => {
  try {
    if (error instanceof Error)
      return shortened(`${error.name === "Error" ? "" : `${error.name}: `}${error.message}`, maxMessageLength)
    return shortened(String(error), maxMessageLength)
  } catch {
    return "the app threw a value that cannot be described"
  }
}

const loadMessage = await new Promise<LoadApp>((resolve) => {
  onPlatformMessage = (message) =>
    resolve(message.t === "load" ? message : { t: "load", code: "", maxResponseBytes: 0, maxMessageBytes: 0 })
})

const loadApp = async (code: string): Promise<App | string> => {
  confineSignals()
  let module: Record<string, unknown>
  try {
    module = await import(`data:text/javascript;base64,${Buffer.from(code).toString("base64")}`)
  } catch (error) {
    return `the app failed while loading: ${errorMessage(error)}`
  }
  const candidate = module.default
  if (candidate === undefined) return "the app has no default export: export default defineApp({ ... })"
  if (!isApp(candidate)) {
    const problems = appDefinitionProblems(candidate)
    return problems.length > 0
      ? `the default export is not a valid app: ${problems.join("; ")}`
      : 'the default export must be made with defineApp() from "cornserve/app"'
  }
  return candidate
}

const app = await loadApp(loadMessage.code)
if (typeof app === "string") {
  post({ t: "load-failed", message: app })
} else {
  serveApp(app, loadMessage.maxResponseBytes, loadMessage.maxMessageBytes)
}

function serveApp(app: App, maxResponseBytes: number, maxMessageBytes: number) {
  const decodeRequest = Schema.decodeUnknownEither(app.request)
  // Fields the schema does not name are refused unless the app drops them (`extraFields: "drop"`).
  const requestParseOptions = {
    errors: "all",
    onExcessProperty: app.extraFields === "drop" ? "ignore" : "error"
  } as const
  const encodeResponse = app.response === undefined ? undefined : Schema.encodeEither(app.response)
  const running = new Map<number, Cancellation>()
  // Only an app that declares tasks can dispatch, and only a dispatch needs to know its request:
  // the others run without the request context, whose async hooks cost every promise in the
  // process (a tenth of a millisecond per request on an idle machine).
  const unitTasks = appUnitTasks(app)
  const callsTasks = unitTasks.length > 0
  const declaredTasks = new Set(unitTasks.map((task) => task.id))
  const answerWindows = new Map<number, SendWindow>()
  const dispatches = new Map<number, PendingDispatch>()
  let nextDispatchId = 0

  /** An answer (or streamed line) as JSON, or why it cannot be sent: `what` names it in the message. */
  const toJson = (
    value: unknown,
    what: string
  ): string | { readonly code: InvokeFailureCode; readonly message: string } => {
    if (encodeResponse !== undefined) {
      const encoded = encodeResponse(value)
      if (encoded._tag === "Left") {
        // The client is told which fields; the app's author finds the whole report in the app's log.
        console.error(
          `${what} does not match the app's response schema:\n${ParseResult.TreeFormatter.formatErrorSync(encoded.left)}`
        )
        const problem = shortened(
          issueLines(readableIssues(encoded.left).slice(0, maxIssues)).join("; "),
          maxMessageLength
        )
        return {
          code: "ResponseSchemaMismatch",
          message: `${what} does not match the app's response schema: ${problem}`
        }
      }
      value = encoded.right
    }
    const json = JSON.stringify(value) ?? "null"
    // Checked here, before the answer crosses to the platform, whose heap it would otherwise fill.
    if (jsonExceeds(json, maxResponseBytes)) {
      return { code: "ResponseTooLarge", message: responseTooLargeMessage(maxResponseBytes) }
    }
    return json
  }

  const fail = (rid: number, code: InvokeFailureCode, message: string, issues?: ReadonlyArray<SchemaIssue>) =>
    post(issues === undefined ? { t: "failed", rid, code, message } : { t: "failed", rid, code, message, issues })

  const invoke = async (rid: number, requestId: string, body: string) => {
    let parsed: unknown
    try {
      parsed = JSON.parse(body)
    } catch (error) {
      return fail(rid, "BadJson", `the request body is not JSON: ${errorMessage(error)}`)
    }
    const decoded = decodeRequest(parsed, requestParseOptions)
    if (decoded._tag === "Left") {
      // Each message is cut short: schema messages quote the offending value, which may be huge.
      const issues = readableIssues(decoded.left)
        .slice(0, maxIssues)
        .map(({ path, message }) => ({ path, message: shortened(message) }))
      const summary = issueLines(issues)
      return fail(
        rid,
        "RequestSchemaMismatch",
        `the request does not match the app's schema: ${summary.join("; ")}`,
        issues
      )
    }
    const cancellation = new Cancellation()
    running.set(rid, cancellation)
    const context = new ServeContext(requestId, cancellation)
    // The request's context lives until its answer ends: an async generator's body runs while its
    // lines are taken, and a returned iterable's while it is read, so both run inside it too.
    return callsTasks
      ? requestContext.run({ requestId, cancellation }, () => answer(rid, decoded.right, context, cancellation))
      : answer(rid, decoded.right, context, cancellation)
  }

  /** Runs `serve` for a request and sends its answer: one value, or a stream of lines. */
  const answer = async (rid: number, request: unknown, context: ServeContext, cancellation: Cancellation) => {
    try {
      const result = await app.serve(request, context)
      if (cancellation.aborted) return
      if (isAsyncIterable(result)) {
        const window = new SendWindow(answerWindowChars)
        answerWindows.set(rid, window)
        post({ t: "stream-start", rid })
        for await (const chunk of result) {
          if (cancellation.aborted) return
          const json = toJson(chunk, "a streamed line")
          if (typeof json !== "string") return fail(rid, json.code, json.message)
          // The client reads slower than the app writes: pause the app's loop until its lines leave.
          if (!window.open) await window.opened(cancellation)
          if (cancellation.aborted) return
          post({ t: "chunk", rid, json })
          window.sent(json.length)
        }
        if (!cancellation.aborted) post({ t: "end", rid })
      } else {
        const json = toJson(result, "serve's answer")
        if (typeof json !== "string") return fail(rid, json.code, json.message)
        post({ t: "value", rid, json })
      }
    } catch (error) {
      if (cancellation.aborted) return
      let code: InvokeFailureCode = "AppError"
      try {
        code = failureCode(error)
      } catch {
        // An exotic thrown value (a Proxy whose traps throw) is the app's fault, like any other.
      }
      fail(rid, code, errorMessage(error))
    } finally {
      running.delete(rid)
      answerWindows.delete(rid)
    }
  }

  setTaskDispatcher(
    (graph) =>
      new Promise<DispatchResult>((resolve, reject) => {
        const context = requestContext.getStore()
        if (context === undefined)
          return reject(
            new Error(
              callsTasks
                ? "tasks can be invoked only while serving a request"
                : "the app declares no tasks: list the tasks it invokes in defineApp's tasks"
            )
          )
        if (context.cancellation.aborted) return reject(new Error("the request was cancelled"))
        // The platform stops a process that dispatches a task its app did not declare.
        const undeclared = graph.invocations.find((invocation) => !declaredTasks.has(invocation.taskId))
        if (undeclared !== undefined)
          return reject(
            new Error(
              `task ${undeclared.taskId} is not one the app declares: list the tasks it invokes in defineApp's tasks`
            )
          )
        const did = nextDispatchId++
        // Refused here, as the platform would refuse it: it stops a process that sends a larger message.
        const frame = encodeFrame({ t: "dispatch", did, requestId: context.requestId, graph } satisfies FromApp)
        if (frame.length - frameHeaderBytes > maxMessageBytes)
          return reject(
            new TaskInputError({
              message: `the task graph takes ${frame.length - frameHeaderBytes} bytes, over the limit of ${maxMessageBytes} bytes`
            })
          )
        const pending = new PendingDispatch(resolve, reject, (chunks) => post({ t: "dispatch-credit", did, chunks }))
        dispatches.set(did, pending)
        context.cancellation.onAbort(() => {
          if (dispatches.delete(did)) {
            post({ t: "dispatch-cancel", did })
            pending.fail({ code: "RequestCancelled", message: "the request was cancelled" })
          }
        })
        channel.write(frame)
      })
  )

  onPlatformMessage = (message) => {
    switch (message.t) {
      case "invoke":
        void invoke(message.rid, message.requestId, message.body)
        return
      case "cancel":
        running.get(message.rid)?.abort()
        return
      case "ping":
        post({ t: "pong", nonce: message.nonce })
        return
      case "credit":
        answerWindows.get(message.rid)?.acknowledged(message.chars)
        return
      case "dispatched":
        dispatches.get(message.did)?.resolveOutputs(message.outputs, message.streams)
        if (!message.streams) dispatches.delete(message.did)
        return
      case "dispatch-chunk":
        dispatches.get(message.did)?.push(message.chunk)
        return
      case "dispatch-end":
        dispatches.get(message.did)?.end()
        dispatches.delete(message.did)
        return
      case "dispatch-failed":
        dispatches.get(message.did)?.fail(message.failure)
        dispatches.delete(message.did)
        return
    }
  }

  post({
    t: "loaded",
    tasks: unitTasks.map((task) => ({ id: task.id, kind: task.kind, name: task.name, config: task.config })),
    example: app.example,
    description: app.description,
    admission: app.admission,
    ...(app.timeoutMs === undefined ? {} : { timeoutMs: app.timeoutMs }),
    schemas: appSchemasOf(app)
  })
}

/** What the client is told when `serve` throws: a task input the request made wrong, capacity, or the app's failure. */
const failureCode = (error: unknown): InvokeFailureCode => {
  if (error instanceof TaskInputError) return "TaskInputRejected"
  if (error instanceof TaskExecutionError) return dispatchFailureCodes[error.code]
  return "AppError"
}

/** An unhandled dispatch failure is the client's answer, except where the app's own graph is at fault. */
const dispatchFailureCodes: { readonly [Code in DispatchFailure["code"]]: InvokeFailureCode } = {
  TaskInputRejected: "TaskInputRejected",
  TaskUnavailable: "TaskUnavailable",
  DispatchFailed: "DispatchFailed",
  InvalidTaskGraph: "AppError",
  RequestCancelled: "AppError"
}

const isAsyncIterable = (value: unknown): value is AsyncIterable<unknown> =>
  typeof value === "object" && value !== null && Symbol.asyncIterator in value

/**
 * A dispatched graph waiting for its outputs, and then for the chunks of its streaming output. The
 * chunks the app's code takes are acknowledged, so that the platform reads the executor's stream
 * only as fast as the app consumes it.
 */
class PendingDispatch {
  private readonly chunks: Array<unknown> = []
  private readonly ledger = new ReceiveLedger(dispatchWindowChunks)
  private done = false
  private failure: Error | undefined
  private wake: (() => void) | undefined

  constructor(
    private readonly resolve: (result: DispatchResult) => void,
    private readonly reject: (error: Error) => void,
    private readonly acknowledge: (chunks: number) => void
  ) {}

  resolveOutputs(outputs: ReadonlyArray<unknown>, streams: boolean) {
    this.resolve(streams ? { outputs, stream: this.stream() } : { outputs })
  }

  push(chunk: unknown) {
    this.ledger.received(1)
    this.chunks.push(chunk)
    this.notify()
  }

  end() {
    this.done = true
    this.notify()
  }

  fail(failure: DispatchFailure) {
    this.failure = new TaskExecutionError(failure)
    this.reject(this.failure)
    this.notify()
  }

  private notify() {
    const wake = this.wake
    this.wake = undefined
    wake?.()
  }

  private async *stream(): AsyncIterable<unknown> {
    while (true) {
      if (this.chunks.length > 0) {
        const chunk = this.chunks.shift()
        const acknowledged = this.ledger.consumed(1)
        if (acknowledged > 0) this.acknowledge(acknowledged)
        yield chunk
      } else if (this.failure !== undefined) {
        throw this.failure
      } else if (this.done) {
        return
      } else {
        await new Promise<void>((wake) => (this.wake = wake))
      }
    }
  }
}
