/**
 * How a failure another process reports becomes the error of the one that asked, and how an error
 * is told where it happened. An executor answers its error's tag as a code, an app's process its
 * request's failure code; each code maps, here and only here, to one of the control plane's errors.
 */
import type { InvokeFailureCode, SchemaIssue } from "../app-runtime/driver/protocol.js"
import type { ExecutorErrorTag } from "../executors/common/errors.js"
import {
  AppFailed,
  BadRequest,
  DispatchFailed,
  RequestSchemaMismatch,
  TaskInputRejected,
  TaskUnavailable
} from "./errors.js"

/** A failure as another process reports it: its code (the tag of its error) and message. */
export interface RemoteFailure {
  readonly code: string
  readonly message: string
  /** Where and why a request did not match its app's schema (an app's RequestSchemaMismatch). */
  readonly issues?: ReadonlyArray<SchemaIssue>
}

/** Who reported a failure: an executor that answered a call, or the process of the app that served a request. */
export type Reporter = { readonly _tag: "Executor" } | { readonly _tag: "App"; readonly appId: string }

export const fromExecutor = { _tag: "Executor" } as const satisfies Reporter

export type ExecutorCallError = TaskInputRejected | TaskUnavailable | DispatchFailed
export type AppRequestError =
  | BadRequest
  | RequestSchemaMismatch
  | TaskInputRejected
  | TaskUnavailable
  | DispatchFailed
  | AppFailed

const rejectedInput = ({ message }: RemoteFailure) => new TaskInputRejected({ message })
const unavailable = ({ message }: RemoteFailure) => new TaskUnavailable({ message })
/** An executor whose sidecar could not reach another node's: that node is likely gone. */
const unreachable = ({ message }: RemoteFailure) => new TaskUnavailable({ message, unreachable: true })
/** The executor's own fault: its code stays in the message, since the caller's error has a code of its own. */
const executorFault = ({ code, message }: RemoteFailure) => new DispatchFailed({ message: `${code}: ${message}` })

/**
 * Whose fault each executor error is. The request's input is the client's to fix; capacity is
 * retried on another executor; anything else (the platform's wiring included, such as a data id
 * that never arrived or a model the dispatcher named wrong) fails the request as the executor's.
 */
const executorErrors: { readonly [Tag in ExecutorErrorTag]: (failure: RemoteFailure) => ExecutorCallError } = {
  BadRequest: rejectedInput,
  UnsupportedModality: rejectedInput,
  ContextLengthExceeded: rejectedInput,
  EmptyPrompt: rejectedInput,
  PromptError: rejectedInput,
  MediaError: rejectedInput,
  MediaTooLarge: rejectedInput,
  EngineRejected: rejectedInput,
  EngineUnavailable: unavailable,
  SidecarUnavailable: unreachable,
  RouteNotFound: executorFault,
  ModelNotFound: executorFault,
  NoSidecar: executorFault,
  EmbeddingMissing: executorFault,
  ExecutorFailed: executorFault,
  InternalError: executorFault
}

const appFailed = ({ message }: RemoteFailure, appId: string) => new AppFailed({ appId, message })

/** An app's request failed in its process: its input, a dispatch it made (as the dispatcher failed it), or the app itself. */
const appErrors: {
  readonly [Code in InvokeFailureCode | "WorkerStopped"]: (failure: RemoteFailure, appId: string) => AppRequestError
} = {
  BadJson: ({ message }) => new BadRequest({ message }),
  RequestSchemaMismatch: ({ message, issues }) =>
    new RequestSchemaMismatch({
      message,
      issues: (issues ?? []).map((issue) => ({ path: [...issue.path], message: issue.message }))
    }),
  TaskInputRejected: rejectedInput,
  TaskUnavailable: unavailable,
  DispatchFailed: ({ message }) => new DispatchFailed({ message }),
  AppError: appFailed,
  ResponseSchemaMismatch: appFailed,
  ResponseTooLarge: appFailed,
  WorkerStopped: appFailed
}

const knows = <Table extends object>(table: Table, code: string): code is Extract<keyof Table, string> =>
  Object.hasOwn(table, code)

/**
 * A failure another process reported, as the caller's error. A code the caller does not know is
 * the reporter's own fault.
 */
export function remoteError(failure: RemoteFailure, reporter: { readonly _tag: "Executor" }): ExecutorCallError
export function remoteError(
  failure: RemoteFailure,
  reporter: { readonly _tag: "App"; readonly appId: string }
): AppRequestError
export function remoteError(failure: RemoteFailure, reporter: Reporter): ExecutorCallError | AppRequestError {
  if (reporter._tag === "Executor")
    return knows(executorErrors, failure.code) ? executorErrors[failure.code](failure) : executorFault(failure)
  return knows(appErrors, failure.code)
    ? appErrors[failure.code](failure, reporter.appId)
    : appFailed(failure, reporter.appId)
}

/** An error whose message is one of its fields, so that it can be told again. */
interface TaggedWithMessage {
  readonly _tag: string
  readonly message: string
}

/** The same error (its class and fields), its message told where it happened: `${where}: ${message}`. */
export const saidWhere = <E extends TaggedWithMessage>(error: E, where: string): E => {
  const Class = error.constructor as new (fields: object) => E
  return new Class({ ...error, message: `${where}: ${error.message}` })
}
