import { Console, Effect } from "effect"
import { buildModel, builtinModelNames, modelCacheDir } from "../models/ModelStore.js"

/** `cornserve models build [NAME...] [--dir DIR]`: every built-in by default. */
export const buildModels = (names: ReadonlyArray<string>, dir: string | undefined) =>
  Effect.gen(function* () {
    const chosen = names.length > 0 ? names : builtinModelNames
    for (const name of chosen) {
      const started = performance.now()
      const path = yield* Effect.tryPromise({
        try: () => buildModel(name, dir ?? modelCacheDir()),
        catch: (error) =>
          new Error(`building ${name} failed: ${error instanceof Error ? error.message : String(error)}`)
      })
      yield* Console.log(`built ${name} in ${((performance.now() - started) / 1000).toFixed(2)} s → ${path}`)
    }
  })
