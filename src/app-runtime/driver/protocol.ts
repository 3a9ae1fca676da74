import type { DispatchFailureCode, TaskGraphWire } from "../tasks/TaskGraph.js"

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

export interface DispatchFailure {
  readonly code: DispatchFailureCode
  readonly message: string
}

export interface SchemaIssue {
  readonly path: ReadonlyArray<PropertyKey>
  readonly message: string
}

/** Messages from the platform to an app's worker thread. */
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
  | { readonly t: "dispatch-end"; readonly did: number }
  | { readonly t: "dispatch-failed"; readonly did: number; readonly failure: DispatchFailure }

/** Messages from an app's worker thread to the platform. */
export type FromWorker =
  | {
      readonly t: "loaded"
      readonly tasks: ReadonlyArray<UnitTaskSpec>
      readonly example: unknown
      readonly description: string | undefined
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

/** The first message an app's process gets: the app's compiled code, to load. */
export interface LoadApp {
  readonly t: "load"
  readonly code: string
}

export type ToAppProcess = ToWorker | LoadApp
