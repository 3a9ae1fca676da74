/**
 * The router of an executor (the process the node agent starts): HTTP in front, preprocessing in a
 * thread pool, the engine behind ZeroMQ. Each kind supplies its routes and preprocessing; `/health`
 * and `/info` are common.
 */
import type { ChildProcess } from "node:child_process"
import { mkdir, rm } from "node:fs/promises"
import * as Http from "node:http"
import { join } from "node:path"
import type * as HttpApp from "@effect/platform/HttpApp"
import * as HttpBody from "@effect/platform/HttpBody"
import * as HttpRouter from "@effect/platform/HttpRouter"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import * as Console from "effect/Console"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import * as Stream from "effect/Stream"
import { errorHeaders, httpStatusOf } from "../../errors/HttpStatus.js"
import { listening } from "../../process/Listening.js"
import { noSpan, type Span, startSpan } from "../../tracing/Tracing.js"
import { EngineClient, type EngineProgram } from "./EngineClient.js"
import { type HealthReport, healthLines, healthWatchPeriodMs } from "./Health.js"
import { type AnsweredError, answeredErrorOf, type ErrorBody, RouteNotFound } from "./errors.js"
import type { ExecutorConfig } from "./ExecutorConfig.js"
import { gatedExecutor } from "./ExecutorGate.js"
import { ThreadPool } from "./ThreadPool.js"
import { defaultShare, type Share, shareOfHeaders } from "./FairShare.js"
import type { WorkItemContext } from "./wire.js"

export interface RouterContext {
  readonly config: ExecutorConfig
  readonly engine: EngineClient
  /** Present when the kind has preprocessing to run off the event loop. */
  readonly pool: ThreadPool | undefined
}

/** What one kind of executor adds to the common router; `executors/<kind>/router.ts` exports it as `routerKind`. */
export interface RouterKind {
  /** The module whose exported functions the preprocessing threads run, if the kind preprocesses. */
  readonly preprocessModule?: string
  /**
   * Whether every request runs a preprocessing job (Eric's: media decoded, texts tokenized): then
   * one thread starts with the router, loading beside the model, so that the first request after a
   * cold start does not wait for a thread to load. Otherwise threads start with the first job.
   */
  readonly preprocessesEveryRequest?: boolean
  /** Loads what the routes need (the model's configs, a sidecar client…). */
  readonly make: (context: RouterContext) => Effect.Effect<
    {
      readonly info: Readonly<Record<string, unknown>>
      /** Handlers answer their own errors (see `errorAnswer`). */
      readonly routes: HttpRouter.HttpRouter<never, never>
    },
    Error,
    Scope.Scope
  >
}

/** `{ error: { code, message } }`, as every Cornserve HTTP API answers errors (and ends a failed stream). */
export const errorBody = (error: AnsweredError): ErrorBody => ({ error: { code: error._tag, message: error.message } })

/**
 * Any failure of a request as its answer: the status from the one table of statuses. A failure
 * that is the executor's own (a 5xx) is logged, since its caller can do nothing about it.
 */
export const errorAnswer = (failure: unknown): Effect.Effect<HttpServerResponse.HttpServerResponse> =>
  Effect.map(answeredFailure(failure), (error) => {
    const answer = httpStatusOf(error)
    return HttpServerResponse.unsafeJson(errorBody(error), { status: answer.status, headers: errorHeaders(answer) })
  })

/** A failure as the error it is answered with, logged (with its stack) when it is the executor's own. */
export const answeredFailure = (failure: unknown): Effect.Effect<AnsweredError> => {
  const error = answeredErrorOf(failure)
  const answer = httpStatusOf(error)
  if (answer.status < 500 || answer.retryAfterSeconds !== undefined) return Effect.succeed(error)
  const detail = failure instanceof Error && failure.stack !== undefined ? failure.stack : error.message
  return Effect.as(Console.error(`executor: ${error._tag}: ${detail}`), error)
}

/** The span of the request a route handler serves (its parent: the caller's `traceparent`). */
export class RequestSpan extends Context.Reference<RequestSpan>()("cornserve/executor/RequestSpan", {
  defaultValue: (): Span => noSpan
}) {}

/** The app whose call a route handler serves, and its weight, as the dispatcher named them. */
export class RequestShare extends Context.Reference<RequestShare>()("cornserve/executor/RequestShare", {
  defaultValue: (): Share => defaultShare
}) {}

/** The trace and the share a handler puts on its request's work items. */
export const workItemContext: Effect.Effect<WorkItemContext> = Effect.map(
  Effect.all([RequestSpan, RequestShare]),
  ([span, share]) => ({
    ...(span.traceparent === undefined ? {} : { trace: span.traceparent }),
    ...(share === defaultShare ? {} : { share })
  })
)

/**
 * Every request but the health and info probes is a server span, from its arrival to the end of
 * its answer (a streamed answer's last chunk), failed when the answer is a 5xx; and its app's share
 * (the dispatcher's headers) is there for its handler.
 */
const traced = <E, R>(app: HttpApp.Default<E, R>): HttpApp.Default<E, R> =>
  Effect.gen(function* () {
    const request = yield* HttpServerRequest.HttpServerRequest
    const path = request.url.split("?", 1)[0]!
    if (request.method === "GET") return yield* app
    const share = shareOfHeaders(request.headers)
    const span = startSpan(`${request.method} ${path}`, {
      parent: request.headers.traceparent,
      kind: "server",
      attributes: { "http.request.method": request.method, "http.route": path }
    })
    if (span === noSpan)
      return yield* share.app === defaultShare.app && share.weight === defaultShare.weight
        ? app
        : Effect.provideService(app, RequestShare, share)
    const end = (response: HttpServerResponse.HttpServerResponse) => {
      span.attribute("http.response.status_code", response.status)
      span.end(response.status >= 500 ? { _tag: "ExecutorError", message: `answered ${response.status}` } : undefined)
    }
    const response = yield* app.pipe(
      Effect.provideService(RequestSpan, span),
      Effect.provideService(RequestShare, share),
      Effect.tapErrorCause((cause) => Effect.sync(() => span.end(cause)))
    )
    const body = response.body
    if (body._tag !== "Stream") {
      end(response)
      return response
    }
    return HttpServerResponse.setBody(
      response,
      HttpBody.stream(
        body.stream.pipe(Stream.ensuring(Effect.sync(() => end(response)))),
        body.contentType,
        body.contentLength
      )
    )
  })

/**
 * `secret`: the internal secret every call but a health probe carries (see ExecutorGate).
 * `engine`: the kind's engine, run in this process. `workers`: the workers, started by
 * `ExecutorCommand` as soon as the config was known, in the run directory it made (see `spawnWorkers`). `routerKind`: what the executor's kind adds.
 */
export const runRouter = (
  config: ExecutorConfig,
  secret: string,
  processes: { readonly engine: EngineProgram; readonly workers: ReadonlyArray<ChildProcess> },
  routerKind: RouterKind
) =>
  Effect.gen(function* () {
    // Where media decodes keep their files: emptied of what a router killed outright left there
    // (a restarted executor has the same run directory).
    const scratchDir = join(config.runDir, "media")
    yield* Effect.promise(async () => {
      await rm(scratchDir, { recursive: true, force: true })
      await mkdir(scratchDir, { mode: 0o700 })
    })
    const engine = yield* EngineClient.start(config, processes.engine, processes.workers)
    const pool =
      routerKind.preprocessModule === undefined
        ? undefined
        : yield* ThreadPool.make({
            moduleUrl: routerKind.preprocessModule,
            size: config.preprocessThreads,
            scratchDir,
            startOne: routerKind.preprocessesEveryRequest === true
          })
    const { info, routes } = yield* routerKind.make({ config, engine, pool })

    const healthReport = (): HealthReport => {
      // Preprocessing threads that keep dying: every request with media would fail.
      const poolFailure = pool?.failure
      if (poolFailure !== undefined) return { status: "unhealthy", reason: poolFailure }
      const state = engine.state
      if (state._tag === "Ready") return { status: "ready", workers: state.workers, inFlight: engine.inFlight }
      return state._tag === "Starting" ? { status: "starting" } : { status: "unhealthy", reason: state.reason }
    }
    const health = Effect.sync(() => {
      const report = healthReport()
      return report.status === "ready"
        ? HttpServerResponse.unsafeJson(report)
        : HttpServerResponse.unsafeJson(report, {
            status: 503,
            headers: errorHeaders(httpStatusOf({ _tag: "EngineUnavailable" }))
          })
    })
    // A plain timer looks: on an idle executor its wake-ups are most of what the router does, and
    // one through a schedule costs several times as much.
    const healthWatch = Effect.sync(() =>
      HttpServerResponse.stream(
        Stream.async<string>((emit) => {
          const lineOf = healthLines()
          const look = () => {
            const line = lineOf(healthReport())
            if (line !== undefined) void emit.single(line)
          }
          look()
          const timer = setInterval(look, healthWatchPeriodMs)
          return Effect.sync(() => clearInterval(timer))
        }).pipe(Stream.encodeText),
        { contentType: "application/x-ndjson" }
      )
    )
    const app = routes.pipe(
      HttpRouter.get("/health", health),
      HttpRouter.get("/health/watch", healthWatch),
      HttpRouter.get(
        "/info",
        Effect.sync(() =>
          HttpServerResponse.unsafeJson({
            kind: config.kind,
            model: config.model,
            devices: config.devices,
            threadsPerDevice: config.threadsPerDevice,
            limits: {
              maxBatchSize: config.maxBatchSize,
              maxBatchDelayMs: config.maxBatchDelayMs,
              maxQueuedRequests: config.maxQueuedRequests,
              maxMediaBytes: config.maxMediaBytes
            },
            ...info
          })
        )
      ),
      Effect.catchTag("RouteNotFound", () => errorAnswer(new RouteNotFound({ message: "no such route" })))
    )
    // The secret is checked from the headers, before the body is read: see ExecutorGate.
    const handler = gatedExecutor(secret, yield* NodeHttpServer.makeHandler(traced(app)))
    const address = yield* listening(Http.createServer({ keepAliveTimeout: 65_000 }, handler), config.port, config.host)
    yield* Console.log(
      `executor: serving at http://${config.host}:${address.port} (${config.kind}, ${config.model}, ${config.devices.join(",")})`
    )
    // Served while the workers load (health answers "loading"); an executor whose workers cannot
    // load its model (a worker exited: a broken file, a tower an adapter does not share) ends,
    // saying why, so that whoever started it learns at once instead of waiting out its bound.
    yield* Effect.tryPromise({ try: () => engine.whenReady(), catch: (error) => error as Error }).pipe(
      Effect.tap(() => Console.log("executor: ready")),
      Effect.tapError((error) => Console.error(`executor: not ready: ${error.message}`))
    )
    return yield* Effect.never
  })
