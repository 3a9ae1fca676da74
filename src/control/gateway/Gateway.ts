import { listenFailure } from "../../process/Listening.js"
import { issueLines, readableIssues } from "../../app-runtime/SchemaIssues.js"
import {
  type AppList,
  type HealthAnswer,
  type NodeList,
  type ReadyAnswer,
  RegisterRequest,
  type ScaleAnswer,
  ScaleRequest,
  type TaskList,
  type TaskProfileAnswer,
  type UnregisterAnswer
} from "./GatewayAnswers.js"
import * as Http from "node:http"
import * as Https from "node:https"
import type { AddressInfo } from "node:net"
import * as HttpRouter from "@effect/platform/HttpRouter"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import * as NodeHttpServerRequest from "@effect/platform-node/NodeHttpServerRequest"
import { ServeError } from "@effect/platform/HttpServerError"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Queue from "effect/Queue"
import * as Schema from "effect/Schema"
import * as Stream from "effect/Stream"
import { AppDriver } from "../app-manager/AppDriver.js"
import { AppManager, type AppSummary } from "../app-manager/AppManager.js"
import {
  AppNotFound,
  AppNotReady,
  BadRequest,
  echoedChars,
  Forbidden,
  type PayloadTooLarge,
  type RequestBodyTimeout,
  RouteNotFound,
  ShuttingDown,
  Unauthorized
} from "../errors.js"
import { ResourceManager } from "../resource-manager/ResourceManager.js"
import { ProfileRecorder } from "../task-manager/ProfileRecorder.js"
import { LevelMeasured, RecordedProfile, RecordingDone, RecordRequest } from "../task-manager/ProfileRecording.js"
import { ServeConfig } from "../../config/ServeConfig.js"
import { adminTokenPath } from "../../config/AdminTokenFile.js"
import { bearerOf, keyDigest, sameSecret } from "../../contracts/Credentials.js"
import { refuseUnread } from "../../contracts/RefuseUnread.js"
import { NodeAgent } from "../../node/NodeAgent.js"
import { adminRequestRefusal } from "./AdminGuard.js"
import { errorBody, errorResponse } from "./ErrorResponse.js"
import { docsAsset, docsContentSecurityPolicy, docsPage } from "./DocsPage.js"
import { consoleContentSecurityPolicy, consoleFile } from "./ConsolePage.js"
import type { DescribedAppText, UndescribedApp } from "../SchemaThread.js"
import { shortened } from "../../app-runtime/Shortened.js"
import { parseJsonBody } from "./JsonBody.js"
import { llmPrefixCaches, prefixCacheMetrics } from "./LlmCacheMetrics.js"
import { renderMetrics } from "./Metrics.js"
import { PlatformMetrics } from "../metrics/PlatformMetrics.js"
import { invokePrefix, makeInvokeRoute, makeModelsRoute } from "./InvokeRoute.js"
import { matchOpenAiRoute } from "./OpenAiApi.js"
import { readRequestBody } from "./RequestBody.js"

const sseEvent = (event: string, data: unknown) => `event: ${event}\ndata: ${JSON.stringify(data)}\n\n`

/**
 * The platform's HTTP front door: app registration (SSE), invocation (JSON or NDJSON), listing,
 * task scaling, task profiles (recording one: SSE) and health. On shutdown it stops taking requests and lets those in flight finish
 * within the grace period.
 */
export class Gateway extends Effect.Service<Gateway>()("cornserve/Gateway", {
  scoped: Effect.gen(function* () {
    const config = yield* ServeConfig
    const appManager = yield* AppManager
    const resources = yield* ResourceManager
    const recorder = yield* ProfileRecorder
    const agent = yield* NodeAgent
    let draining = false
    /** Set once `serve` has restored the apps of its state dir (and registered the examples): /ready is 200 from then. */
    let started = false
    let inFlight = 0
    let idle: (() => void) | undefined

    const bodyLimits = { limitBytes: config.maxBodyBytes, idleTimeoutMs: config.bodyIdleTimeoutMs }
    const serverOptions: Http.ServerOptions = {
      keepAliveTimeout: 65_000,
      // node:http answers 408 and closes a connection whose headers, or whole request, come too slowly.
      // It refuses a headers timeout longer than the request's; the request's then bounds both.
      headersTimeout: Math.min(config.headersTimeoutMs, config.receiveTimeoutMs),
      requestTimeout: config.receiveTimeoutMs,
      // How often those timeouts are checked (30 s by default, which would stretch a 10 s timeout to 40).
      connectionsCheckingInterval: 1_000
    }
    const nodeServer: Http.Server =
      config.tls === undefined
        ? Http.createServer(serverOptions)
        : Https.createServer({ ...serverOptions, cert: config.tls.cert, key: config.tls.key })
    yield* Effect.acquireRelease(
      Effect.async<void, ServeError>((resume) => {
        nodeServer.once("error", (cause) =>
          resume(Effect.fail(new ServeError({ cause: listenFailure(cause, config.host, config.port) })))
        )
        nodeServer.listen(config.port, config.host, () => resume(Effect.void))
      }),
      () =>
        Effect.async<void>((resume) => {
          if (nodeServer.listening) nodeServer.close(() => resume(Effect.void))
          else resume(Effect.void)
        })
    )

    yield* Effect.addFinalizer(() =>
      Effect.gen(function* () {
        draining = true
        nodeServer.close()
        if (inFlight > 0) {
          yield* Effect.logInfo(`waiting up to ${config.shutdownGraceMs} ms for ${inFlight} request(s) in flight`)
          const drained = yield* Effect.async<boolean>((resume) => {
            const timer = setTimeout(() => resume(Effect.succeed(false)), config.shutdownGraceMs)
            idle = () => {
              clearTimeout(timer)
              resume(Effect.succeed(true))
            }
            if (inFlight === 0) idle()
          })
          if (!drained)
            yield* Effect.logWarning(`${inFlight} request(s) still running after the grace period; closing them`)
        }
        nodeServer.closeAllConnections()
      })
    )

    const readBody = Effect.gen(function* () {
      const request = yield* HttpServerRequest.HttpServerRequest
      const raw = NodeHttpServerRequest.toIncomingMessage(request)
      return yield* Effect.async<string, PayloadTooLarge | RequestBodyTimeout | BadRequest>((resume) =>
        readRequestBody(raw, bodyLimits, (body) =>
          resume(typeof body === "string" ? Effect.succeed(body) : Effect.fail(body))
        )
      )
    })

    const readJson = <A, I>(schema: Schema.Schema<A, I, never>) =>
      Effect.gen(function* () {
        const text = yield* readBody
        const parsed = parseJsonBody(text, config.maxJsonDepth)
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
    /** The admin token, when the platform has one (all but --insecure-no-auth). */
    const requireAdminToken = (request: HttpServerRequest.HttpServerRequest) =>
      Effect.gen(function* () {
        if (config.adminToken === undefined) return
        const given = bearerOf(request.headers.authorization)
        if (given === undefined) {
          return yield* new Unauthorized({
            message: `this route needs the admin token: Authorization: Bearer <token> (on the platform's machine: ${adminTokenPath(config.stateDir)})`
          })
        }
        if (!sameSecret(given, config.adminToken))
          return yield* new Unauthorized({ message: "the admin token is wrong" })
      })
    const requireAdmin = Effect.gen(function* () {
      const request = yield* HttpServerRequest.HttpServerRequest
      yield* requireAdminToken(request)
      const refusal = adminRequestRefusal(request.headers, guardOptions)
      if (refusal !== undefined) return yield* new Forbidden({ message: refusal })
    })

    /** `/metrics` needs the metrics token or the admin token, unless the operator made it public. */
    const requireMetricsReader = Effect.gen(function* () {
      if (config.publicMetrics) return
      const tokens = [config.metricsToken, config.adminToken].filter((token) => token !== undefined)
      if (tokens.length === 0) return
      const request = yield* HttpServerRequest.HttpServerRequest
      const given = bearerOf(request.headers.authorization)
      if (given === undefined || !tokens.some((token) => sameSecret(given, token))) {
        return yield* new Unauthorized({
          message:
            "/metrics needs CORNSERVE_METRICS_TOKEN or the admin token as Authorization: Bearer (or serve --public-metrics)"
        })
      }
    })

    const param = (name: string) => Effect.map(HttpRouter.params, (params) => params[name] ?? "")

    const register = Effect.gen(function* () {
      yield* requireAdmin
      const body = yield* readJson(RegisterRequest)
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
      const stream = Stream.fromQueue(events).pipe(
        Stream.takeWhile((event): event is string => event !== undefined),
        Stream.map((event) => Buffer.from(event))
      )
      return HttpServerResponse.stream(stream, {
        contentType: "text/event-stream",
        headers: { "cache-control": "no-cache", connection: "keep-alive" }
      })
    })

    /** What an app wrote to its stdout and stderr: an admin route, since an app's log may hold its clients' data. */
    const logs = Effect.gen(function* () {
      const request = yield* HttpServerRequest.HttpServerRequest
      // A GET carries no body: the admin guard's content-type rule is for the routes that take one.
      yield* requireAdminToken(request)
      const appId = yield* param("id")
      const tail = appManager.logsOf(appId)
      if (typeof tail !== "string") return yield* tail
      const follow = /[?&]follow=(?:1|true)(?:&|$)/.test(request.url)
      if (!follow) return HttpServerResponse.text(tail, { contentType: "text/plain; charset=utf-8" })
      // The tail, then each line as the app writes it, until the client goes; a client that reads
      // slower than the app writes misses lines rather than holding them in the gateway.
      const lines = Stream.async<Uint8Array>(
        (emit) => {
          void emit.single(Buffer.from(tail))
          const stop = appManager.followLogsOf(appId, (line) => void emit.single(Buffer.from(`${line}\n`)))
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

    const unregister = Effect.gen(function* () {
      yield* requireAdmin
      const appId = yield* param("id")
      yield* appManager.unregister(appId)
      return HttpServerResponse.unsafeJson({
        appId,
        message: `app ${appId} is unregistered`
      } satisfies typeof UnregisterAnswer.Encoded)
    })

    const scale = Effect.gen(function* () {
      yield* requireAdmin
      const body = yield* readJson(ScaleRequest)
      yield* resources.scale(body.taskId, body.devices)
      return HttpServerResponse.unsafeJson({
        taskId: body.taskId,
        tasks: resources.tasks()
      } satisfies typeof ScaleAnswer.Encoded)
    })

    /** A task's profile: what its calls measured, and the one recorded ahead of time (null: none). */
    const profile = Effect.gen(function* () {
      const taskId = yield* param("id")
      const measured = yield* resources.profile(taskId)
      const recorded = recorder.recorded(taskId)
      return HttpServerResponse.unsafeJson({
        ...measured,
        recorded: recorded === undefined ? null : Schema.encodeSync(RecordedProfile)(recorded)
      } satisfies typeof TaskProfileAnswer.Encoded)
    })

    /**
     * Records a task's profile ahead of time (a load sweep against its executors). Refusals are
     * answered at once; then Server-Sent Events: `started` at once, `progress` as each load level ends, and `final`
     * with the recorded profile, or `error`. A client that goes away stops the recording.
     */
    const recordProfile = Effect.gen(function* () {
      yield* requireAdmin
      const taskId = yield* param("id")
      const body = yield* readJson(RecordRequest)
      const events = yield* Queue.unbounded<string | undefined>()
      // The first event goes at once, so that the client knows the recording began (and holds the task).
      events.unsafeOffer(sseEvent("started", { taskId, levels: body.levels, secondsPerLevel: body.secondsPerLevel }))
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
        const stream = Stream.fromQueue(events).pipe(
          Stream.takeWhile((event): event is string => event !== undefined),
          Stream.map((event) => Buffer.from(event)),
          Stream.ensuring(Fiber.interrupt(recording))
        )
        return HttpServerResponse.stream(stream, {
          contentType: "text/event-stream",
          headers: { "cache-control": "no-cache", connection: "keep-alive" }
        })
      }).pipe(Effect.onInterrupt(() => Fiber.interrupt(recording)))
    })

    const health = Effect.sync(() =>
      HttpServerResponse.unsafeJson(
        {
          status: draining ? "shutting-down" : "ok",
          role: config.role,
          apps: appManager.list().length
        } satisfies typeof HealthAnswer.Encoded,
        { status: draining ? 503 : 200 }
      )
    )

    /**
     * Readiness, beside /health's liveness: 503 until every app restored at start is ready or
     * failed (a load balancer sends nothing yet), and while shutting down.
     */
    const ready = Effect.sync(() => {
      // A count, not names: the route is open to anyone, as /health is.
      const waiting = appManager.list().filter((app) => app.state === "registering").length
      const status = draining ? "shutting-down" : started ? "ready" : "starting"
      return HttpServerResponse.unsafeJson(
        { status, ...(status === "starting" ? { restoring: waiting } : {}) } satisfies typeof ReadyAnswer.Encoded,
        { status: status === "ready" ? 200 : 503 }
      )
    })

    const { metrics: requestMetrics } = yield* PlatformMetrics

    const metrics = Effect.gen(function* () {
      yield* requireMetricsReader
      const sidecar = yield* Effect.tryPromise(() => agent.sidecarClient().then((client) => client.stats())).pipe(
        Effect.orElseSucceed(() => undefined)
      )
      const measured = yield* Effect.promise(() => requestMetrics.text())
      const tasks = resources.tasks()
      const caches = yield* Effect.promise(() => llmPrefixCaches(tasks, config.internalSecret))
      return HttpServerResponse.text(
        `${renderMetrics({
          apps: appManager.list(),
          inFlight,
          tasks,
          sidecar,
          rebalanceMoves: resources.rebalanceMoves()
        })}${prefixCacheMetrics(caches).join("\n")}\n${measured}`,
        {
          contentType: "text/plain; version=0.0.4"
        }
      )
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
      if (!apiKeyAccepted(authorization, summary.id)) {
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

    /** Like `/app/list`, open to all; an app's schemas follow its API-key rule (see `describedApp`). */
    const platformOpenApi = Effect.gen(function* () {
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

    /** An app's document: for whoever may call it (its API-key rule), once it is ready. */
    const appOpenApi = Effect.gen(function* () {
      const request = yield* HttpServerRequest.HttpServerRequest
      const appId = yield* param("id")
      if (!apiKeyAccepted(request.headers.authorization, appId)) {
        return yield* new Unauthorized({ message: "this app's document needs an API key: Authorization: Bearer <key>" })
      }
      const driver = appManager.lookup(appId)
      if (!(driver instanceof AppDriver)) return yield* driver
      const summary = appManager.list().find((app) => app.id === appId)
      const described = summary === undefined ? undefined : describedApp(summary, request.headers.authorization)
      if (described === undefined || !("schemas" in described)) {
        return yield* new AppNotReady({ appId, state: summary?.state ?? "registering" })
      }
      const document = yield* Effect.promise(() => appManager.schemaThread.appDocument(described))
      return HttpServerResponse.text(document, { contentType: "application/json" })
    })

    const htmlPage = (html: string) =>
      HttpServerResponse.text(html, {
        contentType: "text/html; charset=utf-8",
        headers: { "content-security-policy": docsContentSecurityPolicy, "x-content-type-options": "nosniff" }
      })

    const appDocsPage = Effect.gen(function* () {
      const appId = yield* param("id")
      if (!appManager.has(appId)) return yield* new AppNotFound({ appId })
      return htmlPage(docsPage(`${appId} · Cornserve`, `/app/${encodeURIComponent(appId)}/openapi.json`))
    })

    const docsFile = Effect.gen(function* () {
      const name = yield* param("file")
      const asset = docsAsset(name)
      if (asset === undefined) {
        return yield* new RouteNotFound({ message: `no file ${shortened(name, echoedChars)} under /docs` })
      }
      return HttpServerResponse.uint8Array(asset.body, {
        contentType: asset.contentType,
        headers: { "cache-control": "public, max-age=3600", "x-content-type-options": "nosniff" }
      })
    })

    /** A file of the web console: its page at `/console`, `/console/NAME` and `/console/assets/NAME`. */
    const consoleRoute = (folder: "top" | "assets", fixedName?: string) =>
      Effect.gen(function* () {
        const name = fixedName ?? (yield* param("file"))
        const file = yield* Effect.promise(() => consoleFile(name, folder))
        if (file === undefined) {
          const request = yield* HttpServerRequest.HttpServerRequest
          return yield* new RouteNotFound({
            message: `no file ${shortened(request.url, echoedChars)} in the console (npm run build builds it)`
          })
        }
        return HttpServerResponse.uint8Array(file.body, {
          contentType: file.contentType,
          headers: {
            "cache-control": file.cacheControl,
            "content-security-policy": consoleContentSecurityPolicy,
            "x-content-type-options": "nosniff",
            "referrer-policy": "no-referrer"
          }
        })
      })

    const router = HttpRouter.empty.pipe(
      HttpRouter.post("/app/register", register),
      HttpRouter.post("/app/unregister/:id", unregister),
      HttpRouter.get("/app/logs/:id", logs),
      HttpRouter.get(
        "/app/list",
        Effect.sync(() => HttpServerResponse.unsafeJson({ apps: appManager.list() } satisfies typeof AppList.Encoded))
      ),
      HttpRouter.get(
        "/tasks/list",
        Effect.sync(() =>
          HttpServerResponse.unsafeJson({
            tasks: resources.tasks(),
            devices: resources.devices()
          } satisfies typeof TaskList.Encoded)
        )
      ),
      HttpRouter.get(
        "/nodes/list",
        Effect.sync(() => HttpServerResponse.unsafeJson({ nodes: resources.nodes() } satisfies typeof NodeList.Encoded))
      ),
      HttpRouter.get("/tasks/:id/profile", profile),
      HttpRouter.post("/tasks/:id/profile/record", recordProfile),
      HttpRouter.post("/task/scale", scale),
      HttpRouter.get("/health", health),
      HttpRouter.get("/ready", ready),
      HttpRouter.get("/metrics", metrics),
      HttpRouter.get("/openapi.json", platformOpenApi),
      HttpRouter.get("/app/:id/openapi.json", appOpenApi),
      HttpRouter.get("/app/:id/docs", appDocsPage),
      HttpRouter.get(
        "/docs",
        Effect.sync(() => htmlPage(docsPage("Cornserve", "/openapi.json")))
      ),
      HttpRouter.get("/docs/:file", docsFile),
      // `/console/` as well: the router ignores a trailing slash.
      HttpRouter.get("/console", consoleRoute("top", "index.html")),
      HttpRouter.get("/console/assets/:file", consoleRoute("assets")),
      HttpRouter.get("/console/:file", consoleRoute("top"))
    )

    const refuseWhileDraining = Effect.suspend(() => (draining ? Effect.fail(new ShuttingDown()) : Effect.void))
    const app = Effect.zipRight(refuseWhileDraining, router).pipe(
      Effect.catchTags({
        RouteNotFound: () =>
          Effect.gen(function* () {
            const request = yield* HttpServerRequest.HttpServerRequest
            return errorResponse(
              new RouteNotFound({
                message: `no route for ${request.method} ${shortened(request.url, echoedChars)}`
              })
            )
          })
      }),
      Effect.catchAll((error) => Effect.succeed(errorResponse(error)))
    )

    /**
     * With API keys configured (the platform's, or the app's own from its registration), an app's
     * invoke and OpenAI routes need one of them (or the admin token).
     */
    const platformKeys = [...config.apiKeys, ...(config.adminToken === undefined ? [] : [config.adminToken])]
    const apiKeyAccepted = (header: string | undefined, appId: string): boolean => {
      const own = appManager.apiKeyDigestsOf(appId)
      if (config.apiKeys.length === 0 && own.length === 0) return true
      const given = bearerOf(header)
      if (given === undefined) return false
      if (platformKeys.some((key) => sameSecret(given, key))) return true
      const digest = keyDigest(given)
      return own.some((kept) => sameSecret(digest, kept))
    }
    const refuseApiKey = (response: Http.ServerResponse) =>
      refuseUnread(response, 401, "Unauthorized", "this route needs an API key: Authorization: Bearer <key>")

    const effectRoutes = yield* NodeHttpServer.makeHandler(app)
    const invokeOptions = {
      lookup: appManager.lookup,
      draining: () => draining,
      bodyLimits,
      maxJsonDepth: config.maxJsonDepth,
      requestTimeoutMs: config.requestTimeoutMs,
      maxResponseBytes: config.appLimits.maxResponseBytes,
      metrics: requestMetrics,
      modelsOf: appManager.modelsOf,
      registeredAt: (appId: string) => {
        const registered = appManager.list().find((app) => app.id === appId)?.registeredAt
        return registered === undefined ? 0 : Math.floor(Date.parse(registered) / 1000)
      }
    }
    const invokeRoute = makeInvokeRoute(invokeOptions)
    const modelsRoute = makeModelsRoute(invokeOptions)
    nodeServer.on("request", (request, response) => {
      inFlight++
      response.once("close", () => {
        inFlight--
        if (inFlight === 0) idle?.()
      })
      const path = request.url!.split("?", 1)[0]!
      if (request.method === "POST" && path.startsWith(invokePrefix)) {
        const appId = path.slice(invokePrefix.length)
        if (!apiKeyAccepted(request.headers.authorization, appId)) return refuseApiKey(response)
        return invokeRoute(request, response, appId, "native")
      }
      const openAi = path.startsWith("/app/") ? matchOpenAiRoute(request.method, path) : undefined
      if (openAi !== undefined) {
        if (!apiKeyAccepted(request.headers.authorization, openAi.appId)) return refuseApiKey(response)
        if (openAi.route === "models") {
          request.resume()
          return modelsRoute(response, openAi.appId, openAi.model)
        }
        return invokeRoute(request, response, openAi.appId, openAi.route)
      }
      effectRoutes(request, response)
    })
    const address = nodeServer.address() as AddressInfo
    return {
      url: `${config.tls === undefined ? "http" : "https"}://${address.family === "IPv6" ? `[${address.address}]` : address.address}:${address.port}`,
      port: address.port,
      /** The platform has started: the apps of its state dir are back (ready or failed). */
      markReady: Effect.sync(() => {
        started = true
      })
    }
  }),
  dependencies: [ProfileRecorder.Default]
}) {}
