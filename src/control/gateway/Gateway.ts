import { listenFailure } from "../../process/Listening.js"
import * as Http from "node:http"
import * as Https from "node:https"
import type { AddressInfo } from "node:net"
import * as HttpRouter from "@effect/platform/HttpRouter"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import * as HttpServerError from "@effect/platform/HttpServerError"
import * as Cause from "effect/Cause"
import * as Effect from "effect/Effect"
import { AppManager } from "../app-manager/AppManager.js"
import { AppNotFound, echoedChars, RouteNotFound, ShuttingDown } from "../errors.js"
import { ResourceManager } from "../resource-manager/ResourceManager.js"
import { ProfileRecorder } from "../task-manager/ProfileRecorder.js"
import { ServeConfig } from "../../config/ServeConfig.js"
import { bearerOf, keyDigest, sameSecret } from "../../contracts/Credentials.js"
import { refuseUnread } from "../../contracts/RefuseUnread.js"
import { NodeAgent } from "../../node/NodeAgent.js"
import { errorResponse } from "./ErrorResponse.js"
import { docsAsset, docsContentSecurityPolicy, docsPage } from "./DocsPage.js"
import { consoleContentSecurityPolicy, consoleFile } from "./ConsolePage.js"
import { shortened } from "../../app-runtime/Shortened.js"
import { PlatformMetrics } from "../metrics/PlatformMetrics.js"
import { invokePrefix, makeInvokeRoute, makeModelsRoute } from "./InvokeRoute.js"
import { matchOpenAiRoute } from "./OpenAiApi.js"
import { adminRoutes } from "./AdminRoutes.js"

const _sseEvent = (event: string, data: unknown) => `event: ${event}\ndata: ${JSON.stringify(data)}\n\n`

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
      Effect.async<void, HttpServerError.ServeError>((resume) => {
        nodeServer.once("error", (cause) =>
          resume(Effect.fail(new HttpServerError.ServeError({ cause: listenFailure(cause, config.host, config.port) })))
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

    const { metrics: requestMetrics } = yield* PlatformMetrics
    const adminApp = yield* adminRoutes({
      config,
      appManager,
      resources,
      recorder,
      agent,
      requestMetrics,
      draining: () => draining,
      started: () => started,
      inFlight: () => inFlight,
      apiKeyAccepted: (header, appId) => apiKeyAccepted(header, appId)
    })

    const param = (name: string) => Effect.map(HttpRouter.params, (params) => params[name] ?? "")

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

    /** The pages and files: the docs and the console. */
    const pages = HttpRouter.empty.pipe(
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
    // A path the platform's API does not have is a page's or a file's.
    const routes = adminApp.pipe(
      Effect.catchAllCause((cause) => {
        const failure = Cause.squash(cause)
        return failure instanceof HttpServerError.RouteNotFound ? pages : Effect.failCause(cause)
      })
    )
    const app = Effect.zipRight(refuseWhileDraining, routes).pipe(
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
