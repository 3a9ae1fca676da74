import { issueLines, readableIssues } from "../SchemaIssues.js"
import * as Schema from "effect/Schema"
import { TaskStream } from "./TaskStream.js"

/** One call of a unit task inside a recorded graph, as it travels to the task dispatcher. */
export const TaskInvocationWire = Schema.Struct({
  taskId: Schema.String,
  kind: Schema.String,
  /** What is asked of the task's executor (an LLM task can chat, or embed a prompt). */
  operation: Schema.String,
  config: Schema.Unknown,
  input: Schema.Unknown,
  output: Schema.Unknown,
  streams: Schema.Boolean
})
export type TaskInvocationWire = typeof TaskInvocationWire.Type

/** A whole recorded graph: dispatched in one call. Only its last invocation may stream. */
export const TaskGraphWire = Schema.Struct({
  invocations: Schema.NonEmptyArray(TaskInvocationWire)
})
export type TaskGraphWire = typeof TaskGraphWire.Type

/** What the dispatcher answers: one output per invocation, in order; a streaming last output. */
export interface DispatchResult {
  readonly outputs: ReadonlyArray<unknown>
  readonly stream?: AsyncIterable<unknown>
}

export type TaskDispatcher = (graph: TaskGraphWire) => Promise<DispatchResult>

/** The minimal surface of a unit task that the recorder needs. */
export interface RecordableUnitTask {
  readonly id: string
  readonly kind: string
  readonly operation: string
  readonly config: unknown
}

interface Invocation {
  readonly task: RecordableUnitTask
  readonly input: unknown
  readonly output: unknown
}

type Phase =
  | { readonly mode: "record"; readonly invocations: Array<Invocation> }
  | { readonly mode: "replay"; readonly outputs: Map<string, Array<unknown>> }

let phase: Phase | undefined
let dispatcher: TaskDispatcher | undefined

/** Installed by the app driver; apps never call it. */
export const setTaskDispatcher = (next: TaskDispatcher | undefined): void => {
  dispatcher = next
}

/** A task was given an input it does not take: the request's fault. */
export class TaskInputError extends Schema.TaggedError<TaskInputError>()("TaskInputError", {
  message: Schema.String
}) {}

/** Why the platform could not run a dispatched task graph: the tag of the control plane's error. */
export const DispatchFailureCode = Schema.Literal(
  "TaskInputRejected",
  "TaskUnavailable",
  "DispatchFailed",
  "InvalidTaskGraph",
  "RequestCancelled"
)
export type DispatchFailureCode = typeof DispatchFailureCode.Type

/** A dispatched graph failed; `code` says why (the request's input, capacity, an executor's failure). */
export class TaskExecutionError extends Schema.TaggedError<TaskExecutionError>()("TaskExecutionError", {
  code: DispatchFailureCode,
  message: Schema.String
}) {}

const runPhase = <A>(next: Phase, f: () => A): A => {
  phase = next
  try {
    return f()
  } finally {
    phase = undefined
  }
}

const toWire = (value: unknown): unknown => JSON.parse(JSON.stringify(value))

/**
 * The record → dispatch → replay protocol. `compose` runs synchronously, so the module-level phase
 * can never be seen by another invocation: concurrent `invoke`s do not mix.
 */
export const invokeGraph = async <I, O>(compose: (input: I) => O, input: I): Promise<O> => {
  if (phase !== undefined) {
    throw new Error("task.invoke() cannot be called while a task graph is being composed; call compose() instead")
  }
  const invocations: Array<Invocation> = []
  const recorded = runPhase({ mode: "record", invocations }, () => compose(input))
  if (invocations.length === 0) return recorded
  invocations.forEach((invocation, index) => {
    if (invocation.output instanceof TaskStream && index !== invocations.length - 1) {
      throw new Error(
        `only the last task of a graph may stream, but task ${invocation.task.id} streams and is followed by others`
      )
    }
  })
  if (dispatcher === undefined) {
    throw new Error("task.invoke() runs only inside a registered app's serve()")
  }
  const last = invocations[invocations.length - 1]!
  const graph: TaskGraphWire = {
    invocations: invocations.map((invocation) => ({
      taskId: invocation.task.id,
      kind: invocation.task.kind,
      operation: invocation.task.operation,
      config: invocation.task.config,
      input: toWire(invocation.input),
      output: toWire(invocation.output),
      streams: invocation.output instanceof TaskStream
    })) as unknown as TaskGraphWire["invocations"]
  }
  const result = await dispatcher(graph)
  if (result.outputs.length !== invocations.length) {
    throw new Error(`the dispatcher answered ${result.outputs.length} outputs for ${invocations.length} invocations`)
  }
  const outputs = new Map<string, Array<unknown>>()
  invocations.forEach((invocation, index) => {
    const real =
      invocation === last && last.output instanceof TaskStream
        ? TaskStream.of(result.stream ?? emptyStream())
        : result.outputs[index]
    const queue = outputs.get(invocation.task.id) ?? []
    queue.push(real)
    outputs.set(invocation.task.id, queue)
  })
  return runPhase({ mode: "replay", outputs }, () => compose(input))
}

async function* emptyStream(): AsyncIterable<unknown> {}

/** What a unit task does when it is composed: record the call, or hand back its real output. */
export const composeUnit = <I, O>(
  task: RecordableUnitTask,
  inputSchema: Schema.Schema<I, any, never>,
  input: I,
  makeRecordOutput: (input: I) => O,
  reviveOutput: (output: unknown) => O
): O => {
  if (phase === undefined) {
    throw new Error(`compose() of task ${task.id} runs only inside task.invoke()`)
  }
  if (phase.mode === "record") {
    const decoded = Schema.decodeUnknownEither(inputSchema)(input, { errors: "all" })
    if (decoded._tag === "Left") {
      throw new TaskInputError({
        message: `invalid input for task ${task.id}: ${issueLines(readableIssues(decoded.left)).join("; ")}`
      })
    }
    const output = makeRecordOutput(decoded.right)
    phase.invocations.push({ task, input: decoded.right, output })
    return output
  }
  const queue = phase.outputs.get(task.id)
  if (queue === undefined || queue.length === 0) {
    throw new Error(
      `task ${task.id} was called more often on replay than on record: compose() must depend only on its input`
    )
  }
  const output = queue.shift()
  return output instanceof TaskStream ? (output as O) : reviveOutput(output)
}
