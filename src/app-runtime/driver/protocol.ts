import type { DispatchFailureCode, TaskGraphWire } from "../tasks/TaskGraph.js"
import type { AdmissionSettings } from "../App.js"

/** A unit task an app needs deployed, as the control plane sees it. */
export interface UnitTaskSpec {
  readonly id: string
  readonly kind: string
  readonly name: string
  readonly config: unknown
}

export type InvokeFailureCode =
  | "BadJson"
  | "RequestSchemaMismatch"
  | "TaskInputRejected"
  | "TaskUnavailable"
  | "DispatchFailed"
  | "AppError"
  | "ResponseSchemaMismatch"
  | "ResponseTooLarge"

export interface DispatchFailure {
  readonly code: DispatchFailureCode
  readonly message: string
}

export interface SchemaIssue {
  readonly path: ReadonlyArray<PropertyKey>
  readonly message: string
}

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

/** Messages from an app's process to the platform. */
export type FromWorker =
  | {
      readonly t: "loaded"
      readonly tasks: ReadonlyArray<UnitTaskSpec>
      readonly example: unknown
      readonly description: string | undefined
      readonly admission: AdmissionSettings | undefined
    }
  | { readonly t: "load-failed"; readonly message: string }
  | { readonly t: "pong"; readonly nonce: number }
  | { readonly t: "value"; readonly rid: number; readonly json: string }
  | { readonly t: "stream-start"; readonly rid: number }
  | { readonly t: "chunk"; readonly rid: number; readonly json: string }
  | { readonly t: "end"; readonly rid: number }
  | {
      readonly t: "failed"
      readonly rid: number
      readonly code: InvokeFailureCode
      readonly message: string
      readonly issues?: ReadonlyArray<SchemaIssue>
    }
  | { readonly t: "dispatch"; readonly did: number; readonly requestId: string; readonly graph: TaskGraphWire }
  | { readonly t: "dispatch-cancel"; readonly did: number }
  /** Room for this many more chunks of a dispatch's stream (the app's code took them). */
  | { readonly t: "dispatch-credit"; readonly did: number; readonly chunks: number }

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
