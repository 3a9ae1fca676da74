import { Schema } from "effect"
import { type DispatchFailureCode, TaskGraphWire } from "../tasks/TaskGraph.js"

/** A unit task an app needs deployed, as the control plane sees it. */
export const UnitTaskSpec = Schema.Struct({
  id: Schema.String,
  kind: Schema.String,
  name: Schema.String,
  config: Schema.Unknown
})
export type UnitTaskSpec = typeof UnitTaskSpec.Type

/** Why an app's request failed, as its process reports it. */
export const InvokeFailureCode = Schema.Literal(
  "BadJson",
  "RequestSchemaMismatch",
  "TaskInputRejected",
  "TaskUnavailable",
  "DispatchFailed",
  "AppError",
  "ResponseSchemaMismatch",
  "ResponseTooLarge"
)
export type InvokeFailureCode = typeof InvokeFailureCode.Type

export interface DispatchFailure {
  readonly code: DispatchFailureCode
  readonly message: string
}

/** Where a request did not match its app's schema (a JSON body's keys are strings and indices), and why. */
export const SchemaIssue = Schema.Struct({
  path: Schema.Array(Schema.Union(Schema.String, Schema.Number)),
  message: Schema.String
})
export type SchemaIssue = typeof SchemaIssue.Type

/** Messages from the platform to an app's process. */
export type ToWorker =
  | { readonly t: "invoke"; readonly rid: number; readonly requestId: string; readonly body: string }
  | { readonly t: "cancel"; readonly rid: number }
  | { readonly t: "ping"; readonly nonce: number }
  | {
      readonly t: "dispatched"
      readonly did: number
      readonly outputs: ReadonlyArray<unknown>
      readonly streams: boolean
    }
  | { readonly t: "dispatch-chunk"; readonly did: number; readonly chunk: unknown }
  /** Room for this many more characters of a request's streamed lines (they left for the client). */
  | { readonly t: "credit"; readonly rid: number; readonly chars: number }
  | { readonly t: "dispatch-end"; readonly did: number }
  | { readonly t: "dispatch-failed"; readonly did: number; readonly failure: DispatchFailure }

const Rid = Schema.Int
const Did = Schema.Int
const Count = Schema.Int.pipe(Schema.greaterThanOrEqualTo(0))
/** Absent rather than undefined: an app's settings keep the shape `defineApp` gave them. */
const exactOptional = <S extends Schema.Schema.Any>(schema: S) => Schema.optionalWith(schema, { exact: true })

const AdmissionSettingsWire = Schema.Struct({
  maxConcurrency: exactOptional(Schema.Number),
  maxQueue: exactOptional(Schema.Number),
  queueTimeoutMs: exactOptional(Schema.Number),
  weight: exactOptional(Schema.Number),
  maxCallsPerTask: exactOptional(Schema.Number)
})

/**
 * Messages from an app's process to the platform. The process runs the app's code, so the
 * platform decodes each one before acting on it. Its IPC channel carries JSON: an undefined field
 * arrives absent.
 */
export const FromWorker = Schema.Union(
  Schema.Struct({
    t: Schema.Literal("loaded"),
    tasks: Schema.Array(UnitTaskSpec),
    example: Schema.Unknown,
    description: Schema.optional(Schema.String),
    admission: Schema.optional(AdmissionSettingsWire)
  }),
  Schema.Struct({ t: Schema.Literal("load-failed"), message: Schema.String }),
  Schema.Struct({ t: Schema.Literal("pong"), nonce: Count }),
  Schema.Struct({ t: Schema.Literal("value"), rid: Rid, json: Schema.String }),
  Schema.Struct({ t: Schema.Literal("stream-start"), rid: Rid }),
  Schema.Struct({ t: Schema.Literal("chunk"), rid: Rid, json: Schema.String }),
  Schema.Struct({ t: Schema.Literal("end"), rid: Rid }),
  Schema.Struct({
    t: Schema.Literal("failed"),
    rid: Rid,
    code: InvokeFailureCode,
    message: Schema.String,
    issues: exactOptional(Schema.Array(SchemaIssue))
  }),
  Schema.Struct({ t: Schema.Literal("dispatch"), did: Did, requestId: Schema.String, graph: TaskGraphWire }),
  Schema.Struct({ t: Schema.Literal("dispatch-cancel"), did: Did }),
  /** Room for this many more chunks of a dispatch's stream (the app's code took them). */
  Schema.Struct({ t: Schema.Literal("dispatch-credit"), did: Did, chunks: Count })
)
export type FromWorker = typeof FromWorker.Type

/** The first message an app's process gets: the app's compiled code, to load, and its answers' bound. */
export interface LoadApp {
  readonly t: "load"
  readonly code: string
  /** The largest answer (or streamed line) the app may send, in bytes of JSON. */
  readonly maxResponseBytes: number
}

/** The message an app's answer (or streamed line) larger than the limit fails with. */
export const responseTooLargeMessage = (maxResponseBytes: number) =>
  `the app's answer is larger than the limit of ${maxResponseBytes} bytes`

/** Whether `json` takes more than `limitBytes` bytes as UTF-8, without encoding it when its length decides. */
export const jsonExceeds = (json: string, limitBytes: number): boolean =>
  json.length > limitBytes || (json.length * 3 > limitBytes && Buffer.byteLength(json) > limitBytes)

export type ToAppProcess = ToWorker | LoadApp
