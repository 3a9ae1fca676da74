/**
 * The handlers of the platform's own routes (`AdminApi.ts`), served by `HttpApiBuilder`. A handler
 * answers its errors as the endpoint declares them (`errorBody`): one it does not declare does not
 * compile. Bodies are read by the gateway's bounded reader, not `HttpApiBuilder`'s (`handleRaw`).
 */
import * as HttpApiBuilder from "@effect/platform/HttpApiBuilder"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import * as NodeHttpServerRequest from "@effect/platform-node/NodeHttpServerRequest"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Queue from "effect/Queue"
import * as Schema from "effect/Schema"
import * as Stream from "effect/Stream"
import { issueLines, readableIssues } from "../../app-runtime/SchemaIssues.js"
import { shortened } from "../../app-runtime/Shortened.js"
import type { ServeConfig } from "../../config/ServeConfig.js"
import { adminTokenPath } from "../../config/AdminTokenFile.js"
import { bearerOf, keyDigest, sameSecret } from "../../contracts/Credentials.js"
import { errorHeaders, httpStatuses } from "../../errors/HttpStatus.js"
import type { NodeAgent } from "../../node/NodeAgent.js"
import { AppDriver } from "../app-manager/AppDriver.js"
import type { AppManager, AppSummary } from "../app-manager/AppManager.js"
import {
  AppNotReady,
  BadRequest,
  Forbidden,
  type PayloadTooLarge,
  type RequestBodyTimeout,
  Unauthorized
} from "../errors.js"
import type { PlatformMetrics } from "../metrics/PlatformMetrics.js"
import type { ResourceManager } from "../resource-manager/ResourceManager.js"
import type { ProfileRecorder } from "../task-manager/ProfileRecorder.js"
import { LevelMeasured, RecordingDone, RecordRequest } from "../task-manager/ProfileRecording.js"
import type { DescribedAppText, UndescribedApp } from "../SchemaThread.js"
import { AdminApi, AdminAuth, MetricsAuth } from "./AdminApi.js"
import { adminRequestRefusal } from "./AdminGuard.js"
import { errorBody, type GatewayError } from "./ErrorResponse.js"
import { AppList, NodeList, ScaleAnswer, TaskList, TaskProfileAnswer } from "./GatewayAnswers.js"
import { RegisterRequest, ScaleRequest } from "./GatewayRequests.js"
import { parseJsonBody } from "./JsonBody.js"
import { llmPrefixCaches, prefixCacheMetrics } from "./LlmCacheMetrics.js"
import { renderMetrics } from "./Metrics.js"
import { readRequestBody } from "./RequestBody.js"

/**
 * An answer whose every field its schema declares: `HttpApiBuilder` encodes an answer with its
 * schema, which drops the fields it does not name, so a listing that grows a field must grow its
 * schema too (else this does not compile).
 */
type Declared<Shape, V> = unknown extends Shape
  ? V
  : V extends ReadonlyArray<infer E>
    ? NonNullable<Shape> extends ReadonlyArray<infer S>
      ? ReadonlyArray<Declared<S, E>>
      : never
    : V extends object
      ? { readonly [K in keyof V]: K extends keyof NonNullable<Shape> ? Declared<NonNullable<Shape>[K], V[K]> : never }
      : V
const declared =
  <S extends Schema.Schema.Any>(_schema: S) =>
  <V>(value: V & Declared<Schema.Schema.Type<S>, V>): V =>
    value

/** What the routes read of the platform: its services, and the gateway's own state. */
export interface AdminRoutesOptions {
  readonly config: typeof ServeConfig.Service
  readonly appManager: typeof AppManager.Service
  readonly resources: typeof ResourceManager.Service
  readonly recorder: typeof ProfileRecorder.Service
  readonly agent: typeof NodeAgent.Service
  readonly requestMetrics: (typeof PlatformMetrics.Service)["metrics"]
  readonly draining: () => boolean
  readonly started: () => boolean
  readonly inFlight: () => number
  /** Whether `authorization` may call app `appId` (its API-key rule). */
  readonly apiKeyAccepted: (authorization: string | undefined, appId: string) => boolean
}

const sseEvent = (event: string, data: unknown) => `event: ${event}\ndata: ${JSON.stringify(data)}\n\n`

const eventStreamOf = (events: Queue.Queue<string | undefined>) =>
  Stream.fromQueue(events).pipe(
    Stream.takeWhile((event): event is string => event !== undefined),
    Stream.map((event) => Buffer.from(event))
  )

const eventStreamResponse = (stream: Stream.Stream<Uint8Array>) =>
  HttpServerResponse.stream(stream, {
    contentType: "text/event-stream",
    headers: { "cache-control": "no-cache", connection: "keep-alive" }
  })

const answer = <E extends GatewayError>(error: E) => errorBody(error)

/**
 * The headers an error's answer carries by its status, from the one table: `retry-after` where every
 * tag of that status has one; and a refused body's connection is closed (its rest is not read).
 */
const headersByStatus = (() => {
  const byStatus = new Map<number, Record<string, string>>()
  for (const answer of Object.values(httpStatuses)) {
    const headers = errorHeaders(answer)
    const known = byStatus.get(answer.status)
    byStatus.set(
      answer.status,
      known === undefined ? headers : Object.fromEntries(Object.entries(known).filter(([k, v]) => headers[k] === v))
    )
  }
  for (const status of [httpStatuses.PayloadTooLarge.status, httpStatuses.RequestBodyTimeout.status])
    byStatus.set(status, { ...byStatus.get(status), connection: "close" })
  return byStatus
})()

/** The platform's own routes as an `HttpApp`; a path none of them has fails with `RouteNotFound`. */
export const adminRoutes = (options: AdminRoutesOptions) =>
  Effect.gen(function* () {
    const { config, appManager, resources, recorder, agent, requestMetrics } = options
    const bodyLimits = { limitBytes: config.maxBodyBytes, idleTimeoutMs: config.bodyIdleTimeoutMs }

    const readBody = (request: HttpServerRequest.HttpServerRequest) =>
      Effect.async<string, PayloadTooLarge | RequestBodyTimeout | BadRequest>((resume) =>
        readRequestBody(NodeHttpServerRequest.toIncomingMessage(request), bodyLimits, (body) =>
          resume(typeof body === "string" ? Effect.succeed(body) : Effect.fail(body))
        )
      )

    const readJson = <A, I>(request: HttpServerRequest.HttpServerRequest, schema: Schema.Schema<A, I, never>) =>
      Effect.gen(function* () {
        const parsed = parseJsonBody(yield* readBody(request), config.maxJsonDepth)
        if (!parsed.ok) return yield* new BadRequest({ message: parsed.message })
        return yield* Schema.decodeUnknown(schema)(parsed.value, { errors: "all", onExcessProperty: "error" }).pipe(
          Effect.mapError(
            (error) =>
              new BadRequest({
                message: `malformed request: ${shortened(issueLines(readableIssues(error).slice(0, 20)).join("; "), 1000)}`
              })
          )
        )
      })

    const guardOptions = { boundHost: config.host, allowedHosts: config.allowedHosts }
    const adminAuth = Layer.succeed(AdminAuth, {
      adminToken: () =>
        Effect.gen(function* () {
          const request = yield* HttpServerRequest.HttpServerRequest
          if (config.adminToken !== undefined) {
            const given = bearerOf(request.headers.authorization)
            if (given === undefined) {
              return yield* Effect.fail(
                answer(
                  new Unauthorized({
                    message: `this route needs the admin token: Authorization: Bearer <token> (on the platform's machine: ${adminTokenPath(config.stateDir)})`
                  })
                )
              )
            }
            if (!sameSecret(given, config.adminToken))
              return yield* Effect.fail(answer(new Unauthorized({ message: "the admin token is wrong" })))
          }
          // A GET carries no body: the browser rules are for the routes that change the platform.
          if (request.method === "GET") return
          const refusal = adminRequestRefusal(request.headers, guardOptions)
          if (refusal !== undefined) return yield* Effect.fail(answer(new Forbidden({ message: refusal })))
        })
    })

    const metricsAuth = Layer.succeed(MetricsAuth, {
      metricsToken: () =>
        Effect.gen(function* () {
          if (config.publicMetrics) return
          const tokens = [config.metricsToken, config.adminToken].filter((token) => token !== undefined)
          if (tokens.length === 0) return
          const request = yield* HttpServerRequest.HttpServerRequest
          const given = bearerOf(request.headers.authorization)
          if (given === undefined || !tokens.some((token) => sameSecret(given, token))) {
            return yield* Effect.fail(
              answer(
                new Unauthorized({
                  message:
                    "/metrics needs CORNSERVE_METRICS_TOKEN or the admin token as Authorization: Bearer (or serve --public-metrics)"
                })
              )
            )
          }
        })
    })

    /**
     * An app as the OpenAPI documents show it to a reader who sent `authorization`: with its schemas
     * once it is ready and the reader may call it (the API-key rule of its invoke routes), else named only.
     */
    const describedApp = (
      summary: AppSummary,
      authorization: string | undefined
    ): DescribedAppText | UndescribedApp => {
      const needsApiKey = config.apiKeys.length > 0 || appManager.apiKeyDigestsOf(summary.id).length > 0
      if (!options.apiKeyAccepted(authorization, summary.id)) {
        return {
          id: summary.id,
          needsApiKey,
          why: "Its schemas are shown to callers with an API key it takes (`/app/ID/openapi.json`)."
        }
      }
      const driver = appManager.lookup(summary.id)
      if (!(driver instanceof AppDriver) || driver.loaded === undefined) {
        return {
          id: summary.id,
          needsApiKey,
          why: `The app is ${summary.state}${summary.error === undefined ? "" : `: ${shortened(summary.error, 500)}`}; its schemas are known once it is ready.`
        }
      }
      return {
        id: summary.id,
        description: driver.loaded.description,
        example: driver.loaded.example,
        schemas: driver.loaded.schemas,
        needsApiKey,
        registeredAt: summary.registeredAt
      }
    }

    const apps = HttpApiBuilder.group(AdminApi, "apps", (handlers) =>
      handlers
        .handleRaw("registerApp", ({ request }) =>
          Effect.gen(function* () {
            const body = yield* readJson(request, RegisterRequest)
            const prepared = yield* appManager.prepare(body.name, body.source, body.replace, {
              admission: body.admission,
              apiKeyDigests: (body.apiKeys ?? []).map(keyDigest),
              outboundHosts: body.allowHosts,
              timeoutMs: body.timeoutMs
            })
            const events = yield* Queue.unbounded<string | undefined>()
            yield* events.offer(
              sseEvent("progress", {
                appId: prepared.id,
                message: `app ${prepared.id} loaded; it uses ${prepared.tasks.length} unit task(s)`,
                tasks: prepared.tasks.map((task) => ({ id: task.id, name: task.name, kind: task.kind }))
              })
            )
            yield* appManager
              .deploy(prepared, (message) => events.offer(sseEvent("progress", { appId: prepared.id, message })))
              .pipe(
                Effect.matchEffect({
                  onSuccess: (app) =>
                    events.offer(sseEvent("final", { appId: app.id, message: `app ${app.id} is ready`, app })),
                  onFailure: (error) => events.offer(sseEvent("error", { appId: prepared.id, ...errorBody(error) }))
                }),
                Effect.ensuring(events.offer(undefined)),
                Effect.forkDaemon
              )
            return eventStreamResponse(eventStreamOf(events))
          }).pipe(Effect.mapError(answer))
        )
        .handle("unregisterApp", ({ path }) =>
          appManager
            .unregister(path.id)
            .pipe(Effect.as({ appId: path.id, message: `app ${path.id} is unregistered` }), Effect.mapError(answer))
        )
        .handle("listApps", () => Effect.sync(() => declared(AppList)({ apps: appManager.list() })))
        /** What an app wrote to its stdout and stderr: an admin route, since an app's log may hold its clients' data. */
        .handle("appLogs", ({ path, urlParams }) =>
          Effect.gen(function* () {
            const tail = appManager.logsOf(path.id)
            if (typeof tail !== "string") return yield* Effect.fail(answer(tail))
            if (urlParams.follow !== "1" && urlParams.follow !== "true")
              return HttpServerResponse.text(tail, { contentType: "text/plain; charset=utf-8" })
            // The tail, then each line as the app writes it, until the client goes; a client that reads
            // slower than the app writes misses lines rather than holding them in the gateway.
            const lines = Stream.async<Uint8Array>(
              (emit) => {
                void emit.single(Buffer.from(tail))
                const stop = appManager.followLogsOf(path.id, (line) => void emit.single(Buffer.from(`${line}\n`)))
                return Effect.sync(() => {
                  if (typeof stop === "function") stop()
                })
              },
              { bufferSize: 1024, strategy: "dropping" }
            )
            return HttpServerResponse.stream(lines, {
              contentType: "text/plain; charset=utf-8",
              headers: { "cache-control": "no-cache" }
            })
          })
        )
        /** An app's document: for whoever may call it (its API-key rule), once it is ready. */
        .handle("appDocument", ({ path }) =>
          Effect.gen(function* () {
            const request = yield* HttpServerRequest.HttpServerRequest
            if (!options.apiKeyAccepted(request.headers.authorization, path.id)) {
              return yield* new Unauthorized({
                message: "this app's document needs an API key: Authorization: Bearer <key>"
              })
            }
            const driver = appManager.lookup(path.id)
            if (!(driver instanceof AppDriver)) return yield* driver
            const summary = appManager.list().find((app) => app.id === path.id)
            const described = summary === undefined ? undefined : describedApp(summary, request.headers.authorization)
            if (described === undefined || !("schemas" in described)) {
              return yield* new AppNotReady({ appId: path.id, state: summary?.state ?? "registering" })
            }
            const document = yield* Effect.promise(() => appManager.schemaThread.appDocument(described))
            return HttpServerResponse.text(document, { contentType: "application/json" })
          }).pipe(Effect.mapError(answer))
        )
    )

    const tasks = HttpApiBuilder.group(AdminApi, "tasks", (handlers) =>
      handlers
        .handle("listTasks", () =>
          Effect.sync(() => declared(TaskList)({ tasks: resources.tasks(), devices: resources.devices() }))
        )
        .handle("listNodes", () => Effect.sync(() => declared(NodeList)({ nodes: resources.nodes() })))
        .handleRaw("scaleTask", ({ request }) =>
          Effect.gen(function* () {
            const body = yield* readJson(request, ScaleRequest)
            yield* resources.scale(body.taskId, body.devices)
            return declared(ScaleAnswer)({ taskId: body.taskId, tasks: resources.tasks() })
          }).pipe(Effect.mapError(answer))
        )
        /** A task's profile: what its calls measured, and the one recorded ahead of time (null: none). */
        .handle("taskProfile", ({ path }) =>
          Effect.gen(function* () {
            const measured = yield* resources.profile(path.id)
            const recorded = recorder.recorded(path.id)
            return declared(TaskProfileAnswer)({ ...measured, recorded: recorded ?? null })
          }).pipe(Effect.mapError(answer))
        )
        /**
         * Records a task's profile ahead of time (a load sweep against its executors). Refusals are
         * answered at once; then Server-Sent Events: `started` at once, `progress` as each load level ends, and `final`
         * with the recorded profile, or `error`. A client that goes away stops the recording.
         */
        .handleRaw("recordTaskProfile", ({ path, request }) =>
          Effect.gen(function* () {
            const taskId = path.id
            const body = yield* readJson(request, RecordRequest)
            const events = yield* Queue.unbounded<string | undefined>()
            // The first event goes at once, so that the client knows the recording began (and holds the task).
            events.unsafeOffer(
              sseEvent("started", { taskId, levels: body.levels, secondsPerLevel: body.secondsPerLevel })
            )
            const recording = yield* recorder.record(taskId, body, (measured) =>
              events.unsafeOffer(sseEvent("progress", Schema.encodeSync(LevelMeasured)(measured)))
            )
            // Until the response's stream is read, the request's end is what stops the recording.
            return yield* Effect.gen(function* () {
              yield* Fiber.join(recording).pipe(
                Effect.matchEffect({
                  onSuccess: ({ profile, notKept }) =>
                    events.offer(
                      sseEvent(
                        "final",
                        Schema.encodeSync(RecordingDone)({
                          taskId,
                          message:
                            notKept === undefined
                              ? `the profile of task ${taskId} is recorded and kept in the state dir`
                              : `the profile of task ${taskId} is recorded, but not kept: ${notKept}`,
                          recorded: profile,
                          kept: notKept === undefined
                        })
                      )
                    ),
                  onFailure: (error) => events.offer(sseEvent("error", { taskId, ...errorBody(error) }))
                }),
                Effect.ensuring(events.offer(undefined)),
                Effect.forkDaemon
              )
              return eventStreamResponse(eventStreamOf(events).pipe(Stream.ensuring(Fiber.interrupt(recording))))
            }).pipe(Effect.onInterrupt(() => Fiber.interrupt(recording)))
          }).pipe(Effect.mapError(answer))
        )
    )

    const platform = HttpApiBuilder.group(AdminApi, "platform", (handlers) =>
      handlers
        .handle("health", () =>
          Effect.sync(() =>
            HttpServerResponse.unsafeJson(
              {
                status: options.draining() ? "shutting-down" : "ok",
                role: config.role,
                apps: appManager.list().length
              },
              { status: options.draining() ? 503 : 200 }
            )
          )
        )
        /**
         * Readiness, beside /health's liveness: 503 until every app restored at start is ready or
         * failed (a load balancer sends nothing yet), and while shutting down.
         */
        .handle("ready", () =>
          Effect.sync(() => {
            // A count, not names: the route is open to anyone, as /health is.
            const waiting = appManager.list().filter((app) => app.state === "registering").length
            const status = options.draining() ? "shutting-down" : options.started() ? "ready" : "starting"
            return HttpServerResponse.unsafeJson(
              { status, ...(status === "starting" ? { restoring: waiting } : {}) },
              { status: status === "ready" ? 200 : 503 }
            )
          })
        )
        .handle("metrics", () =>
          Effect.gen(function* () {
            const sidecar = yield* Effect.tryPromise(() => agent.sidecarClient().then((client) => client.stats())).pipe(
              Effect.orElseSucceed(() => undefined)
            )
            const measured = yield* Effect.promise(() => requestMetrics.text())
            const tasks = resources.tasks()
            const caches = yield* Effect.promise(() => llmPrefixCaches(tasks, config.internalSecret))
            return HttpServerResponse.text(
              `${renderMetrics({
                apps: appManager.list(),
                inFlight: options.inFlight(),
                tasks,
                sidecar,
                rebalanceMoves: resources.rebalanceMoves()
              })}${prefixCacheMetrics(caches).join("\n")}\n${measured}`,
              { contentType: "text/plain; version=0.0.4" }
            )
          })
        )
        /** Like `/app/list`, open to all; an app's schemas follow its API-key rule (see `describedApp`). */
        .handle("platformDocument", () =>
          Effect.gen(function* () {
            const request = yield* HttpServerRequest.HttpServerRequest
            const apps = appManager.list().filter((app) => app.state !== "unregistering")
            const document = yield* Effect.promise(() =>
              appManager.schemaThread.platformDocument(
                apps.map((app) => describedApp(app, request.headers.authorization)),
                {
                  adminToken: config.adminToken !== undefined,
                  metricsToken: !config.publicMetrics && (config.metricsToken ?? config.adminToken) !== undefined
                }
              )
            )
            return HttpServerResponse.text(document, { contentType: "application/json" })
          })
        )
    )

    const app = yield* HttpApiBuilder.httpApp.pipe(
      Effect.provide(
        Layer.mergeAll(
          HttpApiBuilder.api(AdminApi).pipe(
            Layer.provide(Layer.mergeAll(apps, tasks, platform)),
            Layer.provide(Layer.mergeAll(adminAuth, metricsAuth))
          ),
          HttpApiBuilder.Router.Live,
          HttpApiBuilder.Middleware.layer
        )
      )
    )
    // What `HttpApiBuilder`'s routes may ask of the server (for multipart bodies, which these routes do not take).
    const services = yield* Layer.build(NodeHttpServer.layerContext)
    return Effect.map(Effect.provide(app, services), (response) => {
      const headers = response.status >= 400 ? headersByStatus.get(response.status) : undefined
      return headers === undefined ? response : HttpServerResponse.setHeaders(response, headers)
    })
  })
