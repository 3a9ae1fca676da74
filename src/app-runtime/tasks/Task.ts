import { createHash } from "node:crypto"
import type * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import { issueLines, readableIssues } from "../SchemaIssues.js"
import { reviveDataForwards } from "./DataForward.js"
import { composeUnit, invokeGraph, type RecordableUnitTask } from "./TaskGraph.js"

/** A task was declared with a config its kind does not take: the app's fault, found when it loads. */
export class TaskConfigError extends Schema.TaggedError<TaskConfigError>()("TaskConfigError", {
  message: Schema.String
}) {
  /** The config's problems, one line per field (`maxBatchSize: expected ...`). */
  static of(what: string, error: ParseResult.ParseError): TaskConfigError {
    const lines = issueLines(readableIssues(error))
    return new TaskConfigError({
      message: `invalid ${what} task config:\n${lines.map((line) => `  ${line}`).join("\n")}`
    })
  }
}

/**
 * A task an app can invoke. `compose` builds the task's graph synchronously out of unit-task calls;
 * `invoke` records that graph, dispatches it once, and replays `compose` over the real outputs.
 */
export abstract class Task<I, O> {
  abstract readonly name: string

  /** Synchronous: must depend only on `input`, since it runs once to record and once to replay. */
  abstract compose(input: I): O

  /** The distinct unit tasks this task is built from (what gets deployed). */
  abstract unitTasks(): ReadonlyArray<AnyUnitTask>

  invoke(input: I): Promise<O> {
    return invokeGraph((value: I) => this.compose(value), input)
  }
}

/** Task kinds, one executor kind each. */
export type UnitTaskKind =
  | "encoder"
  | "text-embedder"
  | "speech-recognizer"
  | "speech-synthesizer"
  | "codec-decoder"
  | "llm"
  | "image-generator"
  | "audio-generator"

const canonicalJson = (value: unknown): string => {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`
  if (typeof value === "object" && value !== null) {
    const entries = Object.entries(value)
      .filter(([, item]) => item !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    return `{${entries.map(([key, item]) => `${JSON.stringify(key)}:${canonicalJson(item)}`).join(",")}}`
  }
  return JSON.stringify(value)
}

/** The last path segment of a model id, made safe for names: "org/My_Model" → "my-model". */
/**
 * Bounds on a unit task's executors for rebalancing (`cornserve serve --autoscale`): it keeps at
 * least `minExecutors` (default 1) and is never grown past `maxExecutors` (default: no bound).
 * `idleReleaseS`: seconds without a call after which its executors stop, their devices freed,
 * until the next call starts them again (0: they are kept; default: `serve --idle-release`).
 * Part of the config: two tasks that differ in them are two deployments.
 */
export const ScalingBounds = {
  minExecutors: Schema.optional(Schema.Int.pipe(Schema.positive())),
  maxExecutors: Schema.optional(Schema.Int.pipe(Schema.positive())),
  idleReleaseS: Schema.optional(Schema.Number.pipe(Schema.nonNegative(), Schema.lessThanOrEqualTo(86_400 * 365)))
}

export const modelShortName = (model: string): string =>
  (
    model
      .split("/")
      .filter((part) => part.length > 0)
      .pop() ?? model
  )
    .toLowerCase()
    .replace(/[^a-z0-9.]+/g, "-")

/**
 * The smallest deployable task. Two unit tasks of the same kind with the same canonical config
 * (defaults applied, keys sorted) get the same id and so share one deployment across apps.
 */
export abstract class UnitTask<I, O, C> extends Task<I, O> implements RecordableUnitTask {
  readonly id: string
  readonly config: C
  abstract readonly operation: string
  protected abstract readonly inputSchema: Schema.Schema<I, any, never>

  constructor(
    readonly kind: UnitTaskKind,
    configSchema: Schema.Schema<C, any, never>,
    config: unknown
  ) {
    super()
    const decoded = Schema.decodeUnknownEither(configSchema)(config, { errors: "all", onExcessProperty: "error" })
    if (decoded._tag === "Left") {
      throw TaskConfigError.of(kind, decoded.left)
    }
    this.config = Schema.encodeSync(configSchema)(decoded.right) as C
    const digest = createHash("sha256")
      .update(canonicalJson({ kind, config: this.config }))
      .digest("hex")
      .slice(0, 10)
    this.id = `${kind}-${digest}`
  }

  protected abstract makeRecordOutput(input: I): O

  protected reviveOutput(output: unknown): O {
    return reviveDataForwards(output) as O
  }

  compose(input: I): O {
    return composeUnit(
      this,
      this.inputSchema,
      input,
      (value) => this.makeRecordOutput(value),
      (value) => this.reviveOutput(value)
    )
  }

  unitTasks(): ReadonlyArray<AnyUnitTask> {
    return [this]
  }
}

export type AnyUnitTask = UnitTask<any, any, any>

/** A task built from other tasks; subclasses register their parts with `use`. */
export abstract class CompositeTask<I, O> extends Task<I, O> {
  private readonly parts: Array<Task<any, any>> = []

  protected use<T extends Task<any, any>>(task: T): T {
    this.parts.push(task)
    return task
  }

  unitTasks(): ReadonlyArray<AnyUnitTask> {
    return distinctUnitTasks(this.parts)
  }
}

/** The unit tasks of several tasks, each id once, in first-seen order. */
export const distinctUnitTasks = (tasks: Iterable<Task<any, any>>): ReadonlyArray<AnyUnitTask> => {
  const byId = new Map<string, AnyUnitTask>()
  for (const task of tasks) {
    for (const unit of task.unitTasks()) if (!byId.has(unit.id)) byId.set(unit.id, unit)
  }
  return [...byId.values()]
}
