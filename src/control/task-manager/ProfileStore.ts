import { randomUUID } from "node:crypto"
import { mkdir, readFile, rename, rm, writeFile } from "node:fs/promises"
import { join } from "node:path"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import { RecordedProfile } from "./ProfileRecording.js"

/**
 * Recorded profiles, one file per task: `<state-dir>/profiles/<task id>.json`, so that a task's
 * recorded curve is there again after a restart, and when the task is deployed again later (its id
 * names its kind and config: the same model on the same settings). A file that cannot be read as a
 * recorded profile is ignored, with a warning.
 */
export interface ProfileStore {
  /** The task's recorded profile, or undefined when none was recorded (or it is not readable). */
  readonly load: (taskId: string) => Effect.Effect<RecordedProfile | undefined>
  /** Keeps it, replacing the one before; a reader sees the old file or the new one, never part of one. */
  readonly save: (taskId: string, profile: RecordedProfile) => Effect.Effect<void, Error>
}

const StoredProfile = Schema.parseJson(RecordedProfile)

export const makeProfileStore = (stateDir: string): ProfileStore => {
  const dir = join(stateDir, "profiles")
  const pathOf = (taskId: string) => join(dir, `${taskId}.json`)
  return {
    load: (taskId) =>
      Effect.gen(function* () {
        const path = pathOf(taskId)
        const text = yield* Effect.tryPromise(() => readFile(path, "utf8")).pipe(
          Effect.catchAll((error) =>
            (error.error as NodeJS.ErrnoException).code === "ENOENT"
              ? Effect.succeed(undefined)
              : Effect.as(Effect.logWarning(`ignoring ${path}: ${(error.error as Error).message}`), undefined)
          )
        )
        if (text === undefined) return undefined
        const decoded = Schema.decodeUnknownEither(StoredProfile)(text)
        if (Either.isRight(decoded)) return decoded.right
        const [issue] = ParseResult.ArrayFormatter.formatErrorSync(decoded.left)
        const where = issue === undefined || issue.path.length === 0 ? "" : `${issue.path.join(".")}: `
        yield* Effect.logWarning(`ignoring ${path}: it is not a recorded profile (${where}${issue?.message ?? "?"})`)
        return undefined
      }),
    save: (taskId, profile) =>
      Effect.tryPromise({
        try: async () => {
          await mkdir(dir, { recursive: true })
          const path = pathOf(taskId)
          const temporary = `${path}.${process.pid}.${randomUUID()}.tmp`
          try {
            await writeFile(temporary, `${Schema.encodeSync(StoredProfile)(profile)}\n`)
            await rename(temporary, path)
          } catch (error) {
            await rm(temporary, { force: true })
            throw error
          }
        },
        catch: (error) => (error instanceof Error ? error : new Error(String(error)))
      })
  }
}
