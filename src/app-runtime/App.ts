import * as Schema from "effect/Schema"
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
  /**
   * Admission control: how many requests may run at once, how many more may wait for a turn, and for
   * how long (default 10 s). A request over the limit is answered 429 at once, one that waited too
   * long 503; both with Retry-After. Registration may override each (`app register --max-concurrency`).
   * On tasks it shares with other apps: its `weight` against theirs (default 1; an executor's queue
   * serves the apps by weighted fair queuing), and `maxCallsPerTask`, the calls it may have in flight
   * to any one task (more wait their turn at the dispatcher).
   */
  readonly admission?: AdmissionSettings
  /**
   * How long a request may take, its stream included, in milliseconds (default: `serve
   * --request-timeout`). Past it, a request not yet answered gets 504, and a stream ends with an
   * error line; either way its task calls in flight are cancelled. `app register --timeout S`
   * overrides it.
   */
  readonly timeoutMs?: number
  /**
   * What a request's fields that the request schema does not name get: `"refuse"` (the default: a
   * 422 naming each, as a misspelt field should) or `"drop"` (they are ignored).
   */
  readonly extraFields?: "refuse" | "drop"
}

/** The bounds of an app's request timeout: a millisecond to a day (a Node timer takes at most 2^31-1 ms). */
export const timeoutBounds = { least: 1, most: 86_400_000 } as const

/** What is wrong with a request timeout, when one is given. */
export const timeoutProblem = (timeoutMs: unknown, where: string): string | undefined =>
  timeoutMs === undefined ||
  (Number.isSafeInteger(timeoutMs) &&
    (timeoutMs as number) >= timeoutBounds.least &&
    (timeoutMs as number) <= timeoutBounds.most)
    ? undefined
    : `\`${where}\` must be a whole number of milliseconds from ${timeoutBounds.least} to ${timeoutBounds.most}`

export interface AdmissionSettings {
  readonly maxConcurrency?: number
  readonly maxQueue?: number
  readonly queueTimeoutMs?: number
  readonly weight?: number
  readonly maxCallsPerTask?: number
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
  if (candidate.admission !== undefined) problems.push(...admissionProblems(candidate.admission, "admission"))
  if (candidate.extraFields !== undefined && candidate.extraFields !== "refuse" && candidate.extraFields !== "drop") {
    problems.push('`extraFields` must be "refuse" or "drop"')
  }
  const timeout = timeoutProblem(candidate.timeoutMs, "timeoutMs")
  if (timeout !== undefined) problems.push(timeout)
  if (typeof candidate.tasks !== "object" || candidate.tasks === null) {
    problems.push("`tasks` must be an object of tasks (use {} when the app calls none)")
  } else {
    for (const [name, task] of Object.entries(candidate.tasks)) {
      if (!(task instanceof Task)) problems.push(`tasks.${name} is not a task`)
    }
  }
  return problems
}

/**
 * The most each admission setting may be. A queue timeout is a Node timer, which fires at once when
 * given more than 2^31-1 ms (and so would refuse every queued request); a day is far below that and
 * far above any sane wait. The counts bound what one app may hold in memory and in flight.
 */
export const admissionMaxima = {
  maxConcurrency: 100_000,
  maxQueue: 100_000,
  queueTimeoutMs: 86_400_000,
  maxCallsPerTask: 100_000
} as const

/** The least each admission setting may be: one request running, an empty queue, one millisecond. */
export const admissionMinima = {
  maxConcurrency: 1,
  maxQueue: 0,
  queueTimeoutMs: 1,
  maxCallsPerTask: 1
} as const

/** What is wrong with admission settings (each, when given, a whole number within its bounds). */
export const admissionProblems = (limits: unknown, where: string): Array<string> => {
  if (typeof limits !== "object" || limits === null) return [`\`${where}\` must be an object`]
  const problems: Array<string> = []
  for (const name of Object.keys(admissionMaxima) as Array<keyof typeof admissionMaxima>) {
    const value = (limits as Record<string, unknown>)[name]
    const least = admissionMinima[name]
    const most = admissionMaxima[name]
    if (
      value !== undefined &&
      !(Number.isSafeInteger(value) && (value as number) >= least && (value as number) <= most)
    ) {
      problems.push(`\`${where}.${name}\` must be a whole number from ${least} to ${most}`)
    }
  }
  const weight = (limits as Record<string, unknown>).weight
  if (weight !== undefined && !(typeof weight === "number" && weight > 0 && weight <= 1000)) {
    problems.push(`\`${where}.weight\` must be a number above 0, at most 1000`)
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
