import * as Either from "effect/Either"

/**
 * Asks for one key's work and gets a promise of its outcome; the keys asked for in one turn of the
 * event loop are handed to `run` together, which answers one outcome per key, in their order (its
 * own failure fails them all). The resource manager's cold starts: an app's tasks, woken by one
 * call, are placed and started as one batch.
 */
export const batchedByTurn = <E extends { readonly message: string }>(
  run: (keys: ReadonlyArray<string>) => Promise<ReadonlyArray<Either.Either<unknown, E>>>
): ((key: string) => Promise<void>) => {
  let asked = new Map<string, Array<{ resolve: () => void; reject: (error: Error) => void }>>()
  const runAsked = () => {
    const batch = asked
    asked = new Map()
    run([...batch.keys()]).then(
      (outcomes) =>
        [...batch.values()].forEach((waiters, index) => {
          const outcome = outcomes[index]!
          for (const waiter of waiters)
            Either.isRight(outcome) ? waiter.resolve() : waiter.reject(new Error(outcome.left.message))
        }),
      (error: unknown) => {
        for (const waiters of batch.values()) for (const waiter of waiters) waiter.reject(error as Error)
      }
    )
  }
  return (key) =>
    new Promise<void>((resolve, reject) => {
      if (asked.size === 0) setImmediate(runAsked)
      const waiters = asked.get(key) ?? []
      waiters.push({ resolve, reject })
      asked.set(key, waiters)
    })
}
