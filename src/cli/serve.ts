import { lockStateDir } from "../config/StateDirLock.js"
import { readdir, readFile } from "node:fs/promises"
import { basename, join } from "node:path"
import { fileURLToPath } from "node:url"
import type { ServeError } from "@effect/platform/HttpServerError"
import * as Console from "effect/Console"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { AppManager, type AppSummary } from "../control/app-manager/AppManager.js"
import { appSandbox } from "../control/app-manager/AppSandbox.js"
import type { NotSupported } from "../control/errors.js"
import { Gateway } from "../control/gateway/Gateway.js"
import { PlatformMetrics } from "../control/metrics/PlatformMetrics.js"
import { Rebalancer } from "../control/resource-manager/Rebalancer.js"
import { ResourceManager } from "../control/resource-manager/ResourceManager.js"
import { ServeConfig, type ServeOptions } from "../config/ServeConfig.js"
import { TaskQueueBound } from "../control/task-manager/TaskManagers.js"
import { ClusterServer } from "../control/cluster/ClusterServer.js"
import { lostAfterMs, NodeRegistry } from "../control/cluster/NodeRegistry.js"
import { runDataPlane } from "../node/ClusterMember.js"
import { formatFootprint, measureFootprint } from "../metrics/Footprint.js"
import { NodeAgent } from "../node/NodeAgent.js"
import { traceProcess } from "../tracing/Tracing.js"
import { cliCommand } from "./Installation.js"

export const examplesDir = fileURLToPath(new URL("../../examples/", import.meta.url))

/**
 * The control plane of one node. Each service's layer brings the layers of the services it
 * declares as dependencies, so the root names only what the gateway uses. A layer reached by
 * several paths (the node agent: under the gateway, the dispatcher and the executor kinds) is one
 * value, which Effect builds once per platform. What is left to give is the configuration.
 */
export const platformLayer = (options: ServeOptions) =>
  Layer.merge(Gateway.Default, ClusterServer).pipe(
    Layer.provideMerge(
      Layer.mergeAll(
        AppManager.Default,
        ResourceManager.Default,
        Rebalancer.Default,
        NodeAgent.Default,
        NodeRegistry.Default,
        PlatformMetrics.Default
      )
    ),
    Layer.provide(Layer.mergeAll(Layer.succeed(ServeConfig, options), Layer.succeed(TaskQueueBound, options.taskQueue)))
  )

/** A data-plane node: its agent (sidecar, devices, executors) and its membership of the cluster. */
const dataPlaneLayer = (options: ServeOptions) =>
  NodeAgent.Default.pipe(Layer.provideMerge(Layer.succeed(ServeConfig, options)))

const shellQuote = (text: string) => `'${text.replaceAll("'", `'\\''`)}'`

const tryLine = (gatewayUrl: string, app: AppSummary): string => {
  const data = shellQuote(JSON.stringify(app.example))
  const cli = cliCommand()
  return `  ${app.id}:\n    curl -s ${gatewayUrl}/app/invoke/${app.id} -H 'content-type: application/json' -d ${data}\n    ${cli} app invoke ${app.id} --data ${data}`
}

/**
 * Registers every example app that is not registered yet; one that cannot deploy is reported.
 * Tasks whose executors stop when idle (`--idle-release`) are deployed released: started by their first call.
 */
const registerExamples = Effect.gen(function* () {
  const apps = yield* AppManager
  const files = (yield* Effect.promise(() => readdir(examplesDir))).filter((file) => file.endsWith(".ts")).sort()
  for (const file of files) {
    const name = basename(file, ".ts")
    if (apps.has(name)) continue
    const source = yield* Effect.promise(() => readFile(join(examplesDir, file), "utf8"))
    yield* apps
      .register(name, source, false, () => Effect.void, undefined, true)
      .pipe(
        Effect.tap(() => Effect.logInfo(`registered example ${name}`)),
        Effect.catchAll((error) => Effect.logWarning(`example ${name} is not registered: ${error.message}`))
      )
  }
})

export const serve = (
  options: ServeOptions & { readonly examples: boolean }
): Effect.Effect<never, NotSupported | ServeError | Error> =>
  Effect.gen(function* () {
    // Before anything is started or read: a second platform on the same state dir stops here. (A
    // data-plane node keeps nothing there, and several may run on one machine.)
    if (options.role !== "data-plane")
      yield* Effect.acquireRelease(
        Effect.suspend(() => {
          const lock = lockStateDir(options.stateDir)
          return typeof lock === "string" ? Effect.fail(new Error(lock)) : Effect.succeed(lock)
        }),
        (release) => Effect.sync(release)
      )
    // Traced from before the platform starts to after it stops, so that the spans of its last requests leave.
    yield* traceProcess(undefined, { "cornserve.node.role": options.role })
    return yield* options.role === "data-plane" ? runDataPlaneNode(options) : runPlatform(options)
  }).pipe(Effect.scoped)

const runDataPlaneNode = (options: ServeOptions) =>
  runDataPlane.pipe(
    Effect.catchAll((error) =>
      Effect.fail(new Error((error as { readonly message?: string }).message ?? String(error)))
    ),
    Effect.provide(dataPlaneLayer(options)),
    Effect.scoped
  )

const runPlatform = (options: ServeOptions & { readonly examples: boolean }) =>
  Effect.gen(function* () {
    const gateway = yield* Gateway
    const apps = yield* AppManager
    // Said once, before anything else: what the machine does not let the platform keep apps from doing.
    for (const gap of appSandbox().unprotected) yield* Effect.logWarning(gap)
    yield* Console.log(`cornserve: serving at ${gateway.url} (state in ${options.stateDir})`)
    // Nodes that were members come back within a heartbeat or two: the restored apps' tasks go to them.
    if (options.role === "control-plane") yield* (yield* NodeRegistry).awaitKnownNodes(2 * lostAfterMs)
    const restored = yield* apps.restore
    if (restored > 0) yield* Effect.logInfo(`restored ${restored} app(s) from ${options.stateDir}`)
    yield* (yield* NodeRegistry).settle
    if (options.examples) yield* registerExamples
    const ready = apps.list().filter((app) => app.state === "ready" && app.example !== undefined)
    if (ready.length > 0) {
      yield* Console.log(`\nApps ready to try:\n${ready.map((app) => tryLine(gateway.url, app)).join("\n")}\n`)
    }
    yield* gateway.markReady
    const readyAfterS = process.uptime()
    const footprint = yield* Effect.sync(() => measureFootprint())
    yield* Console.log(
      `cornserve: ready in ${readyAfterS.toFixed(1)} s (Ctrl-C to stop); the web console is at ${gateway.url}/console\n` +
        `cornserve: the platform holds ${formatFootprint(footprint)}`
    )
    return yield* Effect.never
  }).pipe(Effect.provide(platformLayer(options)))
