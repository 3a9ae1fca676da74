/**
 * Entry points of an executor's three process roles: `cornserve internal executor` (the router,
 * which the node agent starts), and `executor-engine` / `executor-worker`, which the router and the
 * engine start in turn with the config in their environment.
 */
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import { resolveModel } from "../../models/ModelStore.js"
import { runEngine } from "./Engine.js"
import { configEnvName, decodeConfig, type ExecutorConfig } from "./ExecutorConfig.js"
import { runRouter } from "./Router.js"
import { runWorker } from "./Worker.js"

export type ExecutorOptions = Omit<ExecutorConfig, "modelDir" | "runDir">

export const runExecutor = (options: ExecutorOptions) =>
  Effect.gen(function* () {
    const modelDir = yield* Effect.tryPromise({
      try: () => resolveModel(options.model),
      catch: (error) => new Error(`model ${options.model}: ${error instanceof Error ? error.message : String(error)}`)
    })
    const config: ExecutorConfig = { ...options, modelDir, runDir: join(tmpdir(), `cornserve-executor-${process.pid}`) }
    return yield* runRouter(config)
  }).pipe(Effect.scoped)

const configFromEnvironment = (): ExecutorConfig => {
  const text = process.env[configEnvName]
  if (text === undefined) throw new Error(`${configEnvName} is not set: this command is started by an executor, not by hand`)
  return decodeConfig(text)
}

/**
 * The batch engine serves Eric and Geri; a kind with its own scheduling (the LLM's continuous
 * batching) supplies `executors/<kind>/engine.ts` exporting `runEngine`.
 */
export const runExecutorEngine = () =>
  Effect.gen(function* () {
    const config = configFromEnvironment()
    if (config.kind !== "llm") return yield* runEngine(config)
    const kindEngine = (yield* Effect.promise(() => import(new URL(`../${config.kind}/engine.js`, import.meta.url).href))) as {
      readonly runEngine: typeof runEngine
    }
    return yield* kindEngine.runEngine(config)
  }).pipe(Effect.scoped)

export const runExecutorWorker = (rank: number) =>
  Effect.tryPromise({ try: () => runWorker(configFromEnvironment(), rank), catch: (error) => (error instanceof Error ? error : new Error(String(error))) })
