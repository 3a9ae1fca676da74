import { randomUUID } from "node:crypto"
import * as Effect from "effect/Effect"
import * as Runtime from "effect/Runtime"
import { compileApp, stopCompiler } from "../../app-runtime/AppCompiler.js"
import type { UnitTaskSpec } from "../../app-runtime/driver/protocol.js"
import { PlatformMetrics } from "../metrics/PlatformMetrics.js"
import { Dispatcher } from "../dispatcher/Dispatcher.js"
import {
  AppNameTaken,
  AppNotFound,
  AppNotReady,
  AppSyntaxError,
  DeploymentFailed,
  ForbiddenImport,
  InvalidApp,
  InvalidAppName
} from "../errors.js"
import { ResourceManager } from "../resource-manager/ResourceManager.js"
import { ServeConfig } from "../../config/ServeConfig.js"
import { AppDriver } from "./AppDriver.js"
import type { GraphDispatcher } from "../DispatchContract.js"
import { type AdmissionOverride, AppStore, type StoredApp } from "./AppStore.js"
import { disallowedModelPath } from "../../models/ModelStore.js"
import { Admission, unlimitedAdmission } from "./Admission.js"
import { AppLog } from "./AppLog.js"
import {
  admissionLimits,
  appNamePattern,
  appShare,
  type RegistrationSettings,
  reservedAppNames
} from "./AppRegistration.js"
import { parseOutboundHost } from "./OutboundProxy.js"
import { SchemaThread } from "../SchemaThread.js"

export type AppState = "registering" | "ready" | "unregistering" | "failed"

interface AppEntry {
  readonly id: string
  readonly state: AppState
  readonly source: string
  readonly registeredAt: string
  readonly tasks: ReadonlyArray<UnitTaskSpec>
  /** The key this version of the app holds its tasks under (a replaced version has another). */
  readonly user: string
  readonly driver: AppDriver | undefined
  readonly error: string | undefined
  readonly example: unknown
  readonly description: string | undefined
  readonly admission: AdmissionOverride | undefined
  /** The SHA-256 of each API key the app's own registration set (empty: none). */
  readonly apiKeyDigests: ReadonlyArray<string>
  /** The hosts the app's registration allows it to connect to (empty: none). */
  readonly outboundHosts: ReadonlyArray<string>
  /** The request timeout the registration set, over the app's own. */
  readonly timeoutMs: number | undefined
}

export interface AppSummary {
  readonly id: string
  readonly state: AppState
  readonly registeredAt: string
  readonly tasks: ReadonlyArray<{ readonly id: string; readonly name: string; readonly kind: string }>
  readonly inFlight: number
  /** Requests waiting for a turn under the app's admission limits. */
  readonly queued: number
  readonly admission?: { readonly maxConcurrency: number; readonly maxQueue: number; readonly queueTimeoutMs: number }
  /** How long its requests may take, streams included (absent: the platform's --request-timeout). */
  readonly timeoutMs?: number
  readonly error?: string
  readonly example?: unknown
  readonly description?: string
}

/** An app that compiled, loaded and validated, and now waits for its tasks to deploy. */
export interface PreparedApp {
  readonly id: string
  /** Who uses its tasks (see ResourceManager.acquire): this version of the app. */
  readonly user: string
  readonly source: string
  readonly driver: AppDriver
  readonly tasks: ReadonlyArray<UnitTaskSpec>
  readonly example: unknown
  readonly description: string | undefined
  /** What the registration set over the app's admission settings. */
  readonly admission: AdmissionOverride | undefined
  /** The SHA-256 of each API key the registration set for the app's invoke routes. */
  readonly apiKeyDigests: ReadonlyArray<string>
  readonly outboundHosts: ReadonlyArray<string>
  readonly timeoutMs: number | undefined
}

/** Why an app failed; for a registered one, why its process last stopped and was started again. */
const errorOf = (entry: AppEntry): { readonly error?: string } => {
  if (entry.error !== undefined) return { error: entry.error }
  const stopped = entry.driver?.lastStop
  if (stopped === undefined) return {}
  return {
    error: entry.driver?.isRestarting
      ? `its process is being restarted: ${stopped.reason}`
      : `its process was restarted at ${stopped.at}: ${stopped.reason}`
  }
}

const summarize = (entry: AppEntry): AppSummary => ({
  id: entry.id,
  state: entry.state,
  registeredAt: entry.registeredAt,
  tasks: entry.tasks.map((task) => ({ id: task.id, name: task.name, kind: task.kind })),
  inFlight: entry.driver?.inFlight ?? 0,
  queued: entry.driver?.admission.queued ?? 0,
  ...(entry.driver === undefined || entry.driver.admission.limits === unlimitedAdmission
    ? {}
    : { admission: entry.driver.admission.limits }),
  ...(entry.driver?.timeoutMs === undefined ? {} : { timeoutMs: entry.driver.timeoutMs }),
  ...errorOf(entry),
  ...(entry.example === undefined ? {} : { example: entry.example }),
  ...(entry.description === undefined ? {} : { description: entry.description })
})

/**
 * Registered apps: compiles and loads each in a sandboxed process of its own, deploys its unit tasks through
 * the resource manager, keeps it in the state directory, and hands requests to its driver.
 */
export class AppManager extends Effect.Service<AppManager>()("cornserve/AppManager", {
  scoped: Effect.gen(function* () {
    const config = yield* ServeConfig
    const store = yield* AppStore
    const resources = yield* ResourceManager
    const dispatcher = yield* Dispatcher
    const { metrics } = yield* PlatformMetrics
    const runtime = yield* Effect.runtime<never>()
    /** The drivers' restarts end with the manager, at the latest. */
    const scope = yield* Effect.scope
    const apps = new Map<string, AppEntry>()
    /** Each app's log, kept across its versions (a replace, a restart of its process) until it is unregistered. */
    const appLogs = new Map<string, AppLog>()
    const appLogOf = (id: string) => {
      let log = appLogs.get(id)
      if (log === undefined) {
        log = new AppLog(id)
        appLogs.set(id, log)
      }
      return log
    }
    const pending = new Set<string>()
    /** Reads the apps' schemas and writes their documents, off the main thread. */
    const schemaThread = yield* Effect.acquireRelease(
      Effect.sync(() => new SchemaThread()),
      (thread) => Effect.promise(() => thread.close())
    )

    const log = (message: string) => Runtime.runSync(runtime)(Effect.logWarning(message))
    /**
     * App `user`'s dispatches. Its call to one of its tasks starts its other released tasks too:
     * they start side by side, not each at the app's first call to it.
     */
    const dispatchOf =
      (user: string): GraphDispatcher =>
      (graph, requestId, signal, request) => {
        resources.wakeTasksOf(user)
        return dispatcher.dispatch(graph, requestId, signal, request)
      }

    yield* Effect.addFinalizer(() =>
      Effect.gen(function* () {
        const drivers = [...apps.values()].flatMap((entry) => (entry.driver === undefined ? [] : [entry.driver]))
        yield* Effect.promise(() => Promise.all(drivers.map((driver) => driver.close())))
        yield* Effect.promise(() => stopCompiler())
      })
    )

    const prepare = (name: string, source: string, replace: boolean, settings: RegistrationSettings = {}) =>
      Effect.gen(function* () {
        const { admission } = settings
        const apiKeyDigests = settings.apiKeyDigests ?? []
        const outboundHosts = settings.outboundHosts ?? []
        if (!appNamePattern.test(name)) return yield* new InvalidAppName({ name })
        if (reservedAppNames.has(name)) return yield* new InvalidAppName({ name, reserved: true })
        if (pending.has(name)) {
          return yield* new AppNameTaken({ appId: name, message: `app "${name}" is being registered right now` })
        }
        const existing = apps.get(name)
        if (existing !== undefined && existing.state !== "failed" && !replace) {
          return yield* new AppNameTaken({
            appId: name,
            message: `an app named "${name}" is already registered; unregister it first or register with --replace`
          })
        }
        pending.add(name)
        const user = `${name}#${randomUUID()}`
        const compiled = yield* Effect.promise(() => compileApp(source, `${name}.ts`))
        if (compiled._tag === "SyntaxError") return yield* new AppSyntaxError({ message: compiled.message })
        if (compiled._tag === "ForbiddenImport") {
          return yield* new ForbiddenImport({ module: compiled.module, message: compiled.message })
        }
        const started = yield* Effect.tryPromise({
          try: () =>
            AppDriver.start({
              appId: name,
              code: compiled.code,
              loadTimeoutMs: config.appLoadTimeoutMs,
              limits: config.appLimits,
              dispatch: dispatchOf(user),
              log,
              readSchemas: (wire) => schemaThread.read(wire),
              observer: metrics.requestObserver,
              scope,
              output: appLogOf(name),
              outbound: {
                hosts: outboundHosts.flatMap((text) => {
                  const host = parseOutboundHost(text)
                  return typeof host === "string" ? [] : [host]
                }),
                allowPrivate: config.allowPrivateOutbound
              }
            }),
          catch: (error) => new InvalidApp({ message: error instanceof Error ? error.message : String(error) })
        })
        // (The driver has checked the admission settings the app's process sent: see AppDriver.)
        // On one machine the node's model roots are this process's: a model path it would refuse is
        // refused now, as a 400, rather than when the node prepares the model.
        const refusedModel =
          config.role === "all"
            ? started.loaded.tasks
                .map((task) => (task.config as { readonly model?: unknown }).model)
                .flatMap((model) => (typeof model === "string" ? [disallowedModelPath(model)] : []))
                .find((refusal) => refusal !== undefined)
            : undefined
        if (refusedModel !== undefined) {
          yield* Effect.promise(() => started.driver.close())
          return yield* new InvalidApp({ message: refusedModel.message })
        }
        started.driver.admission = new Admission(admissionLimits(started.loaded.admission, admission))
        started.driver.share = appShare(name, started.loaded.admission, admission)
        started.driver.timeoutMs = settings.timeoutMs ?? started.loaded.timeoutMs
        return {
          id: name,
          user,
          source,
          driver: started.driver,
          tasks: started.loaded.tasks,
          example: started.loaded.example,
          description: started.loaded.description,
          admission,
          apiKeyDigests,
          outboundHosts,
          timeoutMs: settings.timeoutMs
        } satisfies PreparedApp
      }).pipe(Effect.onError(() => Effect.sync(() => pending.delete(name))))

    /** Gives up on a prepared app that will not be deployed. */
    const discard = (prepared: PreparedApp) =>
      Effect.promise(() => prepared.driver.close()).pipe(
        Effect.ensuring(Effect.sync(() => pending.delete(prepared.id)))
      )

    /** Retires a replaced or unregistered version once its requests finish (or the grace runs out). */
    const retire = (entry: AppEntry) =>
      Effect.gen(function* () {
        if (entry.driver !== undefined) {
          const drained = yield* Effect.promise(() => entry.driver!.drain(config.unregisterGraceMs))
          if (!drained) {
            yield* Effect.logWarning(
              `app ${entry.id}: requests still running after ${config.unregisterGraceMs} ms; stopping them`
            )
          }
          yield* Effect.promise(() => entry.driver!.close())
        }
        yield* resources.release(entry.user, entry.tasks)
      })

    /** `released`: its tasks whose executors stop when idle start released (see ResourceManager.acquire). */
    const deploy = (prepared: PreparedApp, onProgress: (message: string) => Effect.Effect<void>, released = false) =>
      Effect.gen(function* () {
        const { user } = prepared
        yield* onProgress(`deploying ${prepared.tasks.length} unit task(s) for app ${prepared.id}`)
        yield* resources
          .acquire(user, prepared.tasks, onProgress, released)
          .pipe(
            Effect.catchAll((error) =>
              Effect.zipRight(discard(prepared), Effect.fail(new DeploymentFailed({ message: error.message })))
            )
          )
        const previous = apps.get(prepared.id)
        const entry: AppEntry = {
          id: prepared.id,
          state: "ready",
          source: prepared.source,
          registeredAt: new Date().toISOString(),
          tasks: prepared.tasks,
          user,
          driver: prepared.driver,
          error: undefined,
          example: prepared.example,
          description: prepared.description,
          admission: prepared.admission,
          apiKeyDigests: prepared.apiKeyDigests,
          outboundHosts: prepared.outboundHosts,
          timeoutMs: prepared.timeoutMs
        }
        apps.set(prepared.id, entry)
        pending.delete(prepared.id)
        yield* store.save({
          id: entry.id,
          source: entry.source,
          registeredAt: entry.registeredAt,
          ...(entry.admission === undefined ? {} : { admission: entry.admission }),
          ...(entry.apiKeyDigests.length === 0 ? {} : { apiKeyDigests: entry.apiKeyDigests }),
          ...(entry.outboundHosts.length === 0 ? {} : { outboundHosts: entry.outboundHosts }),
          ...(entry.timeoutMs === undefined ? {} : { timeoutMs: entry.timeoutMs })
        })
        // A stored app waiting to be restored holds nothing to retire.
        if (previous?.driver !== undefined) yield* Effect.forkDaemon(retire(previous))
        return summarize(entry)
      })

    const register = (
      name: string,
      source: string,
      replace: boolean,
      onProgress: (message: string) => Effect.Effect<void>,
      settings?: RegistrationSettings,
      released = false
    ) => Effect.flatMap(prepare(name, source, replace, settings), (prepared) => deploy(prepared, onProgress, released))

    const unregister = (id: string) =>
      Effect.gen(function* () {
        const entry = apps.get(id)
        if (entry === undefined || entry.state === "unregistering") return yield* new AppNotFound({ appId: id })
        apps.set(id, { ...entry, state: "unregistering" })
        yield* retire(entry).pipe(
          Effect.ensuring(
            Effect.zipRight(
              store.remove(id),
              Effect.sync(() => {
                apps.delete(id)
                appLogs.delete(id)
              })
            )
          )
        )
      })

    /** The driver of a ready app, for a request; synchronous, since every request asks. */
    const lookup = (id: string): AppDriver | AppNotFound | AppNotReady => {
      const entry = apps.get(id)
      if (entry === undefined || entry.state === "unregistering") return new AppNotFound({ appId: id })
      if (entry.state !== "ready" || entry.driver === undefined) {
        return new AppNotReady(
          entry.error === undefined
            ? { appId: id, state: entry.state }
            : { appId: id, state: entry.state, reason: entry.error }
        )
      }
      return entry.driver
    }

    /**
     * The digests of the API keys an app's own registration set (empty: none), for the invoke routes;
     * synchronous, since every request asks. A stored app being restored has them already.
     */
    const apiKeyDigestsOf = (id: string): ReadonlyArray<string> => apps.get(id)?.apiKeyDigests ?? []

    const openAiModelKinds = new Set(["llm", "text-embedder", "speech-recognizer", "speech-synthesizer"])
    /** The models an app's LLM, text-embedding and speech tasks serve, for its OpenAI routes (`/v1/models`, the `model` check). */
    const modelsOf = (id: string): ReadonlyArray<string> => [
      ...new Set(
        (apps.get(id)?.tasks ?? []).flatMap((task) => {
          if (!openAiModelKinds.has(task.kind)) return []
          const model = (task.config as { readonly model?: unknown } | null)?.model
          return typeof model === "string" ? [model] : []
        })
      )
    ]

    /** The last lines an app's processes wrote to stdout and stderr (none before its process started). */
    const logsOf = (id: string): string | AppNotFound => {
      const entry = apps.get(id)
      if (entry === undefined) return new AppNotFound({ appId: id })
      return appLogs.get(id)?.tail() ?? ""
    }

    /** Calls `listener` with each line an app writes from now on, across its versions; answers how to stop. */
    const followLogsOf = (id: string, listener: (line: string) => void): (() => void) | AppNotFound =>
      apps.has(id) || pending.has(id) ? appLogOf(id).follow(listener) : new AppNotFound({ appId: id })

    /** A stored app as it stands before (or without) its process: registering, or failed with why. */
    const storedEntry = (app: StoredApp, state: "registering" | "failed", error?: string): AppEntry => ({
      id: app.id,
      state,
      source: app.source,
      registeredAt: app.registeredAt,
      tasks: [],
      user: app.id,
      driver: undefined,
      error,
      example: undefined,
      description: undefined,
      admission: app.admission,
      apiKeyDigests: app.apiKeyDigests ?? [],
      outboundHosts: app.outboundHosts ?? [],
      timeoutMs: app.timeoutMs
    })

    // The apps of the state dir are known from the start, before the gateway listens: until each is
    // back it answers 503 AppNotReady, never 404.
    const stored = yield* store.loadAll
    for (const app of stored) apps.set(app.id, storedEntry(app, "registering"))

    /**
     * Brings back every app of the state directory, as it was registered. Until each is back it
     * answers as registering (503), not as unknown; each comes back as soon as its own tasks are
     * placed, so that an app without tasks is ready at once and one whose tasks find no place
     * fails with the reason, without waiting for the others. At most four compile at a time.
     */
    const restore = Effect.gen(function* () {
      const compiling = yield* Effect.makeSemaphore(4)
      yield* Effect.forEach(
        stored,
        (app) => {
          const onProgress = (message: string) => Effect.logInfo(`restoring ${app.id}: ${message}`)
          return compiling
            .withPermits(1)(prepare(app.id, app.source, true, app))
            .pipe(
              // Its tasks that stop when idle wait for their first call: the platform is ready sooner.
              Effect.flatMap((prepared) => deploy(prepared, onProgress, true)),
              Effect.tap(() => Effect.logInfo(`restored app ${app.id}`)),
              Effect.catchAll((error) =>
                Effect.zipRight(
                  Effect.logError(`app ${app.id} could not be restored: ${error.message}`),
                  Effect.sync(() => apps.set(app.id, storedEntry(app, "failed", error.message)))
                )
              )
            )
        },
        { concurrency: "unbounded", discard: true }
      )
      return stored.length
    })

    return {
      prepare,
      discard,
      deploy,
      register,
      unregister,
      lookup,
      logsOf,
      followLogsOf,
      apiKeyDigestsOf,
      modelsOf,
      restore,
      schemaThread,
      has: (id: string) => apps.has(id) || pending.has(id),
      list: (): ReadonlyArray<AppSummary> => [...apps.values()].map(summarize),
      inFlight: () => [...apps.values()].reduce((sum, entry) => sum + (entry.driver?.inFlight ?? 0), 0)
    }
  }),
  dependencies: [AppStore.Default, ResourceManager.Default, Dispatcher.Default, PlatformMetrics.Default]
}) {}
