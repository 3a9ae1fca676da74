import { readFileSync } from "node:fs"
import { rename, writeFile } from "node:fs/promises"
import { join } from "node:path"
import * as Effect from "effect/Effect"
import * as Schema from "effect/Schema"

/**
 * How many executors each scaled task runs, kept in `<state-dir>/task-scale.json` so that a task
 * scaled by hand comes back at its scale after a restart. Tasks at their default scale (one
 * executor) have no entry; an entry goes when its task is torn down.
 */
const StoredScale = Schema.parseJson(
  Schema.Struct({ tasks: Schema.Record({ key: Schema.String, value: Schema.Int.pipe(Schema.positive()) }) })
)

export interface ScaleStore {
  /** The executors `taskId` ran when it was last scaled, or 1. */
  readonly executorsOf: (taskId: string) => number
  /** Remembers `taskId`'s executor count (1 forgets it). */
  readonly set: (taskId: string, executors: number) => Effect.Effect<void>
  readonly forget: (taskId: string) => Effect.Effect<void>
}

export const makeScaleStore = (stateDir: string) =>
  Effect.gen(function* () {
    const path = join(stateDir, "task-scale.json")
    const scales = new Map<string, number>()
    const text = yield* Effect.sync(() => {
      try {
        return readFileSync(path, "utf8")
      } catch {
        return undefined
      }
    })
    if (text !== undefined) {
      const decoded = Schema.decodeUnknownEither(StoredScale)(text)
      if (decoded._tag === "Right")
        for (const [taskId, count] of Object.entries(decoded.right.tasks)) scales.set(taskId, count)
      else yield* Effect.logWarning(`ignoring ${path}: it is not a record of task scales`)
    }
    // Writes one after another, each the whole map at that moment, through a rename (atomic).
    let writing = Promise.resolve()
    const save = () =>
      Effect.promise(() => {
        const body = JSON.stringify({ tasks: Object.fromEntries([...scales].sort()) })
        writing = writing.then(async () => {
          const temporary = `${path}.${process.pid}.tmp`
          await writeFile(temporary, body)
          await rename(temporary, path)
        })
        return writing
      })
    const store: ScaleStore = {
      executorsOf: (taskId) => scales.get(taskId) ?? 1,
      set: (taskId, executors) =>
        Effect.suspend(() => {
          if ((scales.get(taskId) ?? 1) === executors) return Effect.void
          if (executors <= 1) scales.delete(taskId)
          else scales.set(taskId, executors)
          return save()
        }),
      forget: (taskId) => Effect.suspend(() => (scales.delete(taskId) ? save() : Effect.void))
    }
    return store
  })
