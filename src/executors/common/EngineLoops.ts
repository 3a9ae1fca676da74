import * as Effect from "effect/Effect"

/** A loop of an engine: plain async code that ends when `stop` aborts (it checks at each turn). */
export type EngineLoop = (stop: AbortSignal) => Promise<void>

/**
 * Runs an engine's loops as the engine's own work, for as long as the engine runs: a loop that fails
 * fails the engine with the loop's error (its executor is then unhealthy: EngineClient); the engine
 * ending (interrupted, its scope closing, another loop failing) aborts every loop's `stop`. A loop
 * that returns (its socket closed) leaves the others running.
 */
export const runEngineLoops = (loops: ReadonlyArray<EngineLoop>): Effect.Effect<never, Error> =>
  Effect.forEach(
    loops,
    (loop) =>
      Effect.tryPromise({
        try: (stop) => loop(stop),
        catch: (error) => (error instanceof Error ? error : new Error(String(error)))
      }),
    { concurrency: "unbounded", discard: true }
  ).pipe(Effect.zipRight(Effect.never))
