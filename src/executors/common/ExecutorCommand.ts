/**
 * Entry points of an executor's two process roles: `cornserve internal executor` (the router, which
 * the node agent starts, and which runs the engine), and `executor-worker`, which the router starts
 * with the config in its environment. Each role loads only its own modules: a worker has no use
 * for the HTTP stack, nor a router for ONNX Runtime.
 */
import { mkdir, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { parseArgs } from "node:util"
import * as Cause from "effect/Cause"
import * as Console from "effect/Console"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Either from "effect/Either"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import { ExecutorSettings } from "../../contracts/ExecutorSettings.js"
import { exitWithParent } from "../../process/ChildProcesses.js"
import { executorOomScoreMargin, raiseOomScoreAdj, readOomScoreAdj } from "../../process/OomScore.js"
import { runMain } from "../../process/StopSignals.js"
import { internalSecretEnvName, takeInternalSecret } from "../../sidecar/InternalSecret.js"
import { traceProcess } from "../../tracing/Tracing.js"
import { dtypes } from "../../models/Dtype.js"
import { configEnvName, spawnWorkers } from "./EarlySpawn.js"
import type { EngineProgram } from "./EngineClient.js"
import type { RouterKind } from "./Router.js"
import { defaultMaxMediaItems, defaultMediaLimits } from "./media/MediaLimits.js"
import { decodeConfig, deviceList, ExecutorConfig, executorDefaults, standaloneRunDirPrefix } from "./ExecutorConfig.js"

export type ExecutorOptions = Omit<ExecutorConfig, "modelDir" | "runDir"> & {
  readonly runDir?: string
  /** The settings record as JSON (ExecutorSettings), over the fields given one by one. */
  readonly settings?: string
}

const decodeSettings = Schema.decodeUnknownEither(Schema.parseJson(ExecutorSettings), { onExcessProperty: "error" })

const asError = (error: unknown) => (error instanceof Error ? error : new Error(String(error)))

/** An executor's processes are one service (its kind), told apart by `cornserve.executor.process`. */
const traceExecutorProcess = (
  config: Pick<ExecutorConfig, "kind" | "model" | "devices">,
  process: "router" | "worker",
  rank?: number
) =>
  traceProcess(config.kind, {
    "cornserve.executor.process": process,
    "cornserve.executor.model": config.model,
    "cornserve.executor.devices": config.devices.join(","),
    ...(rank === undefined ? {} : { "cornserve.executor.rank": String(rank) })
  })

/** Each kind's routes, loaded only in that kind's routers (named one by one so that a bundler sees them). */
const kindRouters: Record<ExecutorConfig["kind"], () => Promise<{ readonly routerKind: RouterKind }>> = {
  llm: () => import("../llm/router.js"),
  eric: () => import("../eric/router.js"),
  geri: () => import("../geri/router.js")
}

/**
 * Each kind's engine: the batch engine serves Eric and Geri; the LLM has its own scheduling
 * (continuous batching).
 */
const kindEngines: Record<
  ExecutorConfig["kind"],
  () => Promise<{ readonly runEngine: (config: ExecutorConfig) => EngineProgram }>
> = {
  llm: () => import("../llm/engine.js"),
  eric: () => import("./Engine.js"),
  geri: () => import("./Engine.js")
}

export const runExecutor = (options: ExecutorOptions) =>
  Effect.gen(function* () {
    exitWithParent()
    const secret = takeInternalSecret()
    if (secret === undefined)
      return yield* Effect.fail(
        new Error(
          `${internalSecretEnvName} is not set: an executor takes calls only from the platform that started it, which gives it that secret`
        )
      )
    yield* traceExecutorProcess(options, "router")
    const { settings: settingsText, ...given } = options
    const settings = settingsText === undefined ? Either.right({}) : decodeSettings(settingsText)
    if (Either.isLeft(settings))
      return yield* Effect.fail(
        new Error(`--settings: ${ParseResult.TreeFormatter.formatErrorSync(settings.left).replaceAll("\n", " ")}`)
      )
    const { resolveModel } = yield* Effect.promise(() => import("../../models/ModelStore.js"))
    const modelDir = yield* Effect.tryPromise({
      try: () => resolveModel(options.model, { dtype: options.dtype }),
      catch: (error) => new Error(`model ${options.model}: ${asError(error).message}`)
    })
    const adapters = ("adapters" in settings.right ? settings.right.adapters : undefined) ?? []
    const adapterDirs = yield* Effect.forEach(adapters, (adapter) =>
      Effect.tryPromise({
        try: () => resolveModel(adapter, { dtype: options.dtype }),
        catch: (error) => new Error(`adapter model ${adapter}: ${asError(error).message}`)
      })
    )
    const config: ExecutorConfig = {
      ...given,
      ...settings.right,
      modelDir,
      ...(adapters.length === 0 ? {} : { adapterDirs }),
      runDir: options.runDir ?? join(tmpdir(), `${standaloneRunDirPrefix}${process.pid}`)
    }
    // Under memory pressure the executor goes before the platform that started it; its engine and
    // workers inherit the score.
    raiseOomScoreAdj(process.pid, (readOomScoreAdj(process.ppid) ?? 0) + executorOomScoreMargin)
    yield* Effect.acquireRelease(
      Effect.promise(() => mkdir(config.runDir, { recursive: true })),
      () => Effect.promise(() => rm(config.runDir, { recursive: true, force: true }))
    )
    // The workers before the routes and the engine are loaded: the processes load side by side,
    // which is most of a cold start.
    const workers = spawnWorkers(config)
    const [{ runRouter }, { routerKind }, { runEngine }] = yield* Effect.promise(() =>
      Promise.all([import("./Router.js"), kindRouters[config.kind](), kindEngines[config.kind]()])
    )
    return yield* runRouter(config, secret, { engine: runEngine(config), workers }, routerKind)
  }).pipe(Effect.scoped)

const configFromEnvironment = (): ExecutorConfig => {
  const text = process.env[configEnvName]
  if (text === undefined)
    throw new Error(`${configEnvName} is not set: this command is started by an executor, not by hand`)
  return decodeConfig(text)
}

export const runExecutorWorker = (rank: number) =>
  Effect.gen(function* () {
    const config = yield* Effect.try({ try: configFromEnvironment, catch: asError })
    yield* traceExecutorProcess(config, "worker", rank)
    const { runWorker } = yield* Effect.promise(() => import("./Worker.js"))
    return yield* Effect.tryPromise({ try: () => runWorker(config, rank), catch: asError })
  }).pipe(Effect.scoped)

const kinds: ReadonlyArray<string> = ExecutorConfig.fields.kind.literals

/**
 * A router's options from the command line a node agent starts it with (NodeAgent's
 * `startExecutor`: its kind, model and devices, where its sockets go, and its settings as one
 * record), every other field at its default; undefined for any other command line, which is left
 * to the CLI (its flags, its help and its errors). A platform-started router thereby starts without
 * loading the CLI, which is on a cold start's path.
 */
export const platformLaunch = (args: ReadonlyArray<string>): ExecutorOptions | undefined => {
  let values: Partial<
    Record<"kind" | "model" | "devices" | "sidecar-socket" | "run-dir" | "host" | "dtype" | "settings", string>
  >
  try {
    values = parseArgs({
      args: [...args],
      strict: true,
      allowPositionals: false,
      options: {
        kind: { type: "string" },
        model: { type: "string" },
        devices: { type: "string" },
        "sidecar-socket": { type: "string" },
        "run-dir": { type: "string" },
        host: { type: "string" },
        dtype: { type: "string" },
        settings: { type: "string" }
      }
    }).values
  } catch {
    return undefined
  }
  const { kind, model, dtype } = values
  if (kind === undefined || !kinds.includes(kind) || model === undefined) return undefined
  if (dtype !== undefined && !(dtypes as ReadonlyArray<string>).includes(dtype)) return undefined
  return {
    ...executorDefaults,
    kind: kind as ExecutorConfig["kind"],
    model,
    devices: deviceList(values.devices ?? executorDefaults.devices),
    host: values.host ?? executorDefaults.host,
    allowPrivateHosts: false,
    maxMediaItems: defaultMaxMediaItems,
    ...defaultMediaLimits,
    ...(dtype === undefined ? {} : { dtype: dtype as (typeof dtypes)[number] }),
    ...(values["sidecar-socket"] === undefined ? {} : { sidecarSocket: values["sidecar-socket"] }),
    ...(values["run-dir"] === undefined ? {} : { runDir: values["run-dir"] }),
    ...(values.settings === undefined ? {} : { settings: values.settings })
  }
}

/** Runs an executor role's program as its process's main, errors told as the CLI tells them. */
const runRole = (program: Effect.Effect<unknown, Error, never>): void =>
  runMain(
    program.pipe(
      Effect.catchAllCause((cause) => {
        if (Cause.isInterruptedOnly(cause)) return Effect.void
        process.exitCode = 1
        const error = Cause.squash(cause)
        return Console.error(`cornserve: ${error instanceof Error ? error.message : String(error)}`)
      })
    ),
    {
      disableErrorReporting: true,
      teardown: (exit, onExit) => onExit(Exit.isFailure(exit) ? 1 : Number(process.exitCode ?? 0))
    }
  )

/** `cornserve internal executor` as a node agent starts it (see platformLaunch), without the CLI. */
export const runPlatformExecutor = (options: ExecutorOptions): void => runRole(runExecutor(options))

/**
 * `cornserve internal executor-worker --rank N` as `bin/cornserve` runs it: without the CLI's
 * parser and commands, which it does not need (its config is in the environment) and which would
 * add about half a second to a cold start. `args`: what follows the role on the command line.
 */
export const runWorkerRole = (args: ReadonlyArray<string>): void => {
  const rank = args.length === 2 && args[0] === "--rank" ? Number(args[1]) : undefined
  runRole(
    rank !== undefined && Number.isSafeInteger(rank) && rank >= 0
      ? runExecutorWorker(rank)
      : Effect.fail(new Error("executor-worker takes --rank N (a device's index)"))
  )
}
