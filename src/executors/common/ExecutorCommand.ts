/**
 * Entry points of an executor's three process roles: `cornserve internal executor` (the router,
 * which the node agent starts), and `executor-engine` / `executor-worker`, which the router and the
 * engine start in turn with the config in their environment. Each role loads only its own modules:
 * a worker has no use for the HTTP stack, nor a router for ONNX Runtime.
 */
import { mkdir, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
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
import { configEnvName, decodeConfig, type ExecutorConfig } from "./ExecutorConfig.js"

export type ExecutorOptions = Omit<ExecutorConfig, "modelDir" | "runDir"> & {
  readonly runDir?: string
  /** The settings record as JSON (ExecutorSettings), over the fields given one by one. */
  readonly settings?: string
}

const decodeSettings = Schema.decodeUnknownEither(Schema.parseJson(ExecutorSettings), { onExcessProperty: "error" })

const asError = (error: unknown) => (error instanceof Error ? error : new Error(String(error)))

/** An executor's three processes are one service (its kind), told apart by `cornserve.executor.process`. */
const traceExecutorProcess = (
  config: Pick<ExecutorConfig, "kind" | "model" | "devices">,
  process: "router" | "engine" | "worker",
  rank?: number
) =>
  traceProcess(config.kind, {
    "cornserve.executor.process": process,
    "cornserve.executor.model": config.model,
    "cornserve.executor.devices": config.devices.join(","),
    ...(rank === undefined ? {} : { "cornserve.executor.rank": String(rank) })
  })

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
    const config: ExecutorConfig = {
      ...given,
      ...settings.right,
      modelDir,
      runDir: options.runDir ?? join(tmpdir(), `cornserve-executor-${process.pid}`)
    }
    // Under memory pressure the executor goes before the platform that started it; its engine and
    // workers inherit the score.
    raiseOomScoreAdj(process.pid, (readOomScoreAdj(process.ppid) ?? 0) + executorOomScoreMargin)
    yield* Effect.acquireRelease(
      Effect.promise(() => mkdir(config.runDir, { recursive: true })),
      () => Effect.promise(() => rm(config.runDir, { recursive: true, force: true }))
    )
    // The engine (which starts the workers) before the routes are loaded: the three processes
    // load side by side, which is most of a cold start.
    const { spawnEngine } = yield* Effect.promise(() => import("./EngineClient.js"))
    const engineProcess = spawnEngine(config)
    const { runRouter } = yield* Effect.promise(() => import("./Router.js"))
    return yield* runRouter(config, secret, engineProcess)
  }).pipe(Effect.scoped)

const configFromEnvironment = (): ExecutorConfig => {
  const text = process.env[configEnvName]
  if (text === undefined)
    throw new Error(`${configEnvName} is not set: this command is started by an executor, not by hand`)
  return decodeConfig(text)
}

/**
 * The batch engine serves Eric and Geri; a kind with its own scheduling (the LLM's continuous
 * batching) supplies `executors/<kind>/engine.ts` exporting `runEngine`.
 */
export const runExecutorEngine = () =>
  Effect.gen(function* () {
    const config = configFromEnvironment()
    yield* traceExecutorProcess(config, "engine")
    const module =
      config.kind === "llm"
        ? new URL(`../${config.kind}/engine.js`, import.meta.url).href
        : new URL("./Engine.js", import.meta.url).href
    const { runEngine } = (yield* Effect.promise(() => import(module))) as {
      readonly runEngine: (config: ExecutorConfig) => Effect.Effect<never, Error, import("effect").Scope.Scope>
    }
    return yield* runEngine(config)
  }).pipe(Effect.scoped)

export const runExecutorWorker = (rank: number) =>
  Effect.gen(function* () {
    const config = yield* Effect.try({ try: configFromEnvironment, catch: asError })
    yield* traceExecutorProcess(config, "worker", rank)
    const { runWorker } = yield* Effect.promise(() => import("./Worker.js"))
    return yield* Effect.tryPromise({ try: () => runWorker(config, rank), catch: asError })
  }).pipe(Effect.scoped)

/**
 * `cornserve internal executor-engine` and `executor-worker --rank N` as `bin/cornserve` runs them:
 * without the CLI's parser and commands, which neither needs (their config is in the environment)
 * and which would add about half a second to each of an executor's starts, one after the other on
 * a cold start's path. `args`: what follows the role on the command line.
 */
export const runExecutorRole = (role: "executor-engine" | "executor-worker", args: ReadonlyArray<string>): void => {
  const rank = role === "executor-worker" && args.length === 2 && args[0] === "--rank" ? Number(args[1]) : undefined
  const usage =
    role === "executor-engine"
      ? args.length === 0
        ? undefined
        : "executor-engine takes no arguments"
      : rank !== undefined && Number.isSafeInteger(rank) && rank >= 0
        ? undefined
        : "executor-worker takes --rank N (a device's index)"
  const program =
    usage !== undefined
      ? Effect.fail(new Error(usage))
      : role === "executor-engine"
        ? runExecutorEngine()
        : runExecutorWorker(rank!)
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
}
