import * as Schema from "effect/Schema"
import { type AdmissionSettings, admissionProblems, timeoutProblem } from "../../app-runtime/App.js"
import type { AppSchemasWire } from "../../app-runtime/driver/AppSchemas.js"
import type { FromApp, UnitTaskSpec } from "../../app-runtime/driver/protocol.js"
import { type CleanedSchemas, undescribedCleanedSchemas } from "../SchemaThread.js"
import type { AppProcess } from "./AppProcess.js"

export interface LoadedApp {
  readonly tasks: ReadonlyArray<UnitTaskSpec>
  readonly example: unknown
  readonly description: string | undefined
  readonly admission: AdmissionSettings | undefined
  /** How long its requests may take, streams included, by its own definition. */
  readonly timeoutMs: number | undefined
  /** What it takes and answers, as JSON Schema: cleaned, as the schema thread wrote them. */
  readonly schemas: CleanedSchemas
}

/** Reads the schemas an app's process sent, off the main thread: cleaned, or why they are refused. */
export type SchemasReader = (wire: AppSchemasWire) => Promise<CleanedSchemas | string>

/** The most messages a process may send between its "loaded" and the end of its schemas' reading (the SDK sends none). */
const maxHeldWhileReading = 16

/** Why an app's process could not load it: the registration's error, or a restart's. */
export class AppLoadError extends Schema.TaggedError<AppLoadError>()("AppLoadError", { message: Schema.String }) {}

/** Why an app's own admission settings, as its process sent them, are refused; undefined when they are in bounds. */
const admissionRefusal = (admission: unknown): string | undefined => {
  if (admission === undefined) return undefined
  const problems = admissionProblems(admission, "admission")
  return problems.length === 0 ? undefined : `the app's admission settings are out of bounds: ${problems.join("; ")}`
}

/** Why the settings an app's process sent at load cannot be taken (its admission, its timeout), if they cannot. */
const settingsRefusal = (message: { readonly admission?: unknown; readonly timeoutMs?: unknown }): string | undefined =>
  admissionRefusal(message.admission) ?? timeoutProblem(message.timeoutMs, "timeoutMs")

/** What an app's "loaded" message says, or why it cannot be taken; its schemas are read by `readSchemas`. */
const loadedApp = async (
  message: Extract<FromApp, { readonly t: "loaded" }>,
  readSchemas: SchemasReader
): Promise<LoadedApp | string> => {
  const refusal = settingsRefusal(message)
  if (refusal !== undefined) return refusal
  const schemas =
    message.schemas === undefined
      ? undescribedCleanedSchemas
      : await readSchemas(message.schemas).catch(
          (error: unknown) => `they could not be read (${error instanceof Error ? error.message : String(error)})`
        )
  if (typeof schemas === "string") return `the app's process sent schemas the platform cannot read: ${schemas}`
  return {
    tasks: message.tasks,
    example: message.example,
    description: message.description,
    admission: message.admission,
    timeoutMs: message.timeoutMs,
    schemas
  }
}

/**
 * One app process's load, from its start to its "loaded" message taken: the message is checked
 * and its schemas are read, off the main thread, before the app counts as loaded; what the
 * process sends meanwhile waits, to be acted on as it would have been at once. Its process failing
 * or exiting fails the load; after the load, those are the driver's (`failed`, `exited`), and so
 * is every message (`message`). Events of a process that is no longer its driver's current one
 * (`isCurrent`) are left alone.
 */
export const loadIn = (
  worker: AppProcess,
  options: {
    readonly timeoutMs: number
    readonly readSchemas: SchemasReader
    readonly isCurrent: () => boolean
    /** The app loaded: called before the load's promise resolves and the held messages are acted on. */
    readonly loaded: (app: LoadedApp) => void
    readonly message: (message: FromApp) => void
    /** The process broke the protocol. */
    readonly violation: (reason: string) => void
    readonly failed: (error: Error) => void
    readonly exited: (code: number) => void
  }
): Promise<LoadedApp> =>
  new Promise<LoadedApp>((resolve, reject) => {
    let stage: "loading" | "reading" | "loaded" | "failed" = "loading"
    const held: Array<FromApp> = []
    const fail = (error: AppLoadError) => {
      clearTimeout(timer)
      stage = "failed"
      held.length = 0
      reject(error)
    }
    const timer = setTimeout(() => {
      fail(new AppLoadError({ message: `the app did not finish loading within ${options.timeoutMs} ms` }))
      void worker.terminate()
    }, options.timeoutMs)
    const accept = async (message: Extract<FromApp, { readonly t: "loaded" }>) => {
      const app = await loadedApp(message, options.readSchemas)
      if (stage !== "reading") return
      if (typeof app === "string") {
        // defineApp and the SDK check them in the app's process; a process that skips it is checked here.
        fail(new AppLoadError({ message: app }))
        void worker.terminate()
        return
      }
      clearTimeout(timer)
      stage = "loaded"
      options.loaded(app)
      resolve(app)
      for (const message of held.splice(0)) if (options.isCurrent() && !worker.stopping) act(message)
    }
    const act = (message: FromApp) => {
      if (stage !== "loading" && (message.t === "loaded" || message.t === "load-failed")) {
        options.violation(`it sent "${message.t}" after its app had loaded`)
      } else if (message.t === "loaded") {
        stage = "reading"
        void accept(message)
      } else if (message.t === "load-failed") {
        fail(new AppLoadError({ message: message.message }))
        void worker.terminate()
      } else if (stage !== "loaded") {
        options.violation(`it sent "${message.t}" before its app had loaded`)
      } else {
        options.message(message)
      }
    }
    worker.on("message", (message: FromApp) => {
      if (!options.isCurrent() || stage === "failed") return
      if (stage !== "reading") act(message)
      else if (held.length < maxHeldWhileReading) held.push(message)
      else options.violation(`it sent more than ${maxHeldWhileReading} messages while its schemas were read`)
    })
    worker.on("error", (error) => {
      if (stage !== "loaded") {
        fail(new AppLoadError({ message: `the app failed while loading: ${error.message}` }))
      } else if (options.isCurrent()) {
        options.failed(error)
      }
    })
    worker.on("exit", (code) => {
      if (stage !== "loaded") {
        fail(new AppLoadError({ message: `the app's process exited with code ${code} while loading` }))
        return
      }
      if (options.isCurrent()) options.exited(code)
    })
  })
