import { Schema } from "effect"
import { distinctUnitTasks, Task, type AnyUnitTask } from "./tasks/Task.js"

/** What `serve` receives besides the request. */
export interface ServeContext {
  /** The gateway's id for this request (also in its logs). */
  readonly requestId: string
  /** Aborted when the client goes away or the request times out. */
  readonly signal: AbortSignal
}

export type ServeResult<Res> = Res | Promise<Res> | AsyncIterable<Res> | Promise<AsyncIterable<Res>>

export interface AppDefinition<Req, ReqEncoded, Res, ResEncoded> {
  /** Every task `serve` may invoke, by name. Their unit tasks are deployed when the app registers. */
  readonly tasks: Readonly<Record<string, Task<any, any>>>
  /** The request body's schema; requests that fail it are answered 422 before `serve` runs. */
  readonly request: Schema.Schema<Req, ReqEncoded, never>
  /** The schema of the answer, or of each streamed line; encodes what `serve` returns. */
  readonly response?: Schema.Schema<Res, ResEncoded, never>
  /** Returns the answer, or an async iterable of lines for a streaming app. */
  readonly serve: (request: Req, context: ServeContext) => ServeResult<Res>
  /** A request to show users (printed when the platform starts with the examples). */
  readonly example?: ReqEncoded
  readonly description?: string
}

export const AppTypeId: unique symbol = Symbol.for("cornserve/App") as any

export interface App<Req = any, ReqEncoded = any, Res = any, ResEncoded = any>
  extends AppDefinition<Req, ReqEncoded, Res, ResEncoded> {
  readonly [AppTypeId]: typeof AppTypeId
}

/** Every problem with an app definition, one per line; empty when the definition is sound. */
export const appDefinitionProblems = (definition: unknown): Array<string> => {
  if (typeof definition !== "object" || definition === null) return ["the app definition must be an object"]
  const candidate = definition as Record<string, unknown>
  const problems: Array<string> = []
  if (typeof candidate.serve !== "function") problems.push("`serve` must be a function")
  if (!Schema.isSchema(candidate.request)) problems.push("`request` must be an Effect Schema")
  if (candidate.response !== undefined && !Schema.isSchema(candidate.response)) {
    problems.push("`response` must be an Effect Schema when given")
  }
  if (typeof candidate.tasks !== "object" || candidate.tasks === null) {
    problems.push("`tasks` must be an object of tasks (use {} when the app calls none)")
  } else {
    for (const [name, task] of Object.entries(candidate.tasks)) {
      if (!(task instanceof Task)) problems.push(`tasks.${name} is not a task`)
    }
  }
  return problems
}

/** Declares an app: the default export of an app file. */
export const defineApp = <Req, ReqEncoded, Res = unknown, ResEncoded = Res>(
  definition: AppDefinition<Req, ReqEncoded, Res, ResEncoded>
): App<Req, ReqEncoded, Res, ResEncoded> => {
  const problems = appDefinitionProblems(definition)
  if (problems.length > 0) throw new TypeError(`defineApp: ${problems.join("; ")}`)
  return Object.freeze({ ...definition, [AppTypeId]: AppTypeId })
}

export const isApp = (value: unknown): value is App =>
  typeof value === "object" && value !== null && (value as Record<PropertyKey, unknown>)[AppTypeId] === AppTypeId

/** The distinct unit tasks an app needs deployed. */
export const appUnitTasks = (app: App): ReadonlyArray<AnyUnitTask> => distinctUnitTasks(Object.values(app.tasks))
