import * as Effect from "effect/Effect"
import * as Runtime from "effect/Runtime"

/**
 * Logging for the sidecar's socket callbacks, which run outside any fiber: each line goes through
 * the Effect logger of the program that started the sidecar, so it carries the same format and
 * annotations as the rest of the process.
 */
export interface SidecarLog {
  readonly info: (message: string) => void
  readonly warn: (message: string) => void
}

export const makeSidecarLog = Effect.gen(function* () {
  const run = Runtime.runFork(yield* Effect.runtime<never>())
  const log: SidecarLog = {
    info: (message) => void run(Effect.logInfo(message)),
    warn: (message) => void run(Effect.logWarning(message))
  }
  return log
})
