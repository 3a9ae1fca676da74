import * as Schema from "effect/Schema"
import type { BadRequest, RouteNotFound } from "../executors/common/errors.js"
import { shortened } from "../app-runtime/Shortened.js"

/** Errors the control plane answers with; each tag's HTTP status is in src/errors/HttpStatus.ts. */

/** How much of a client's value a message quotes: enough to recognise it, never a large value back. */
export const echoedChars = 100

export { BadRequest, RouteNotFound } from "../executors/common/errors.js"

export class AppNotFound extends Schema.TaggedError<AppNotFound>()("AppNotFound", { appId: Schema.String }) {
  override get message() {
    return `no app named "${shortened(this.appId, echoedChars)}" is registered`
  }
}

export class AppNotReady extends Schema.TaggedError<AppNotReady>()("AppNotReady", {
  appId: Schema.String,
  state: Schema.String,
  reason: Schema.optional(Schema.String)
}) {
  override get message() {
    return `app "${this.appId}" is ${this.state}${this.reason === undefined ? "" : `: ${this.reason}`}`
  }
}

export class AppNameTaken extends Schema.TaggedError<AppNameTaken>()("AppNameTaken", {
  appId: Schema.String,
  message: Schema.String
}) {}

export class InvalidAppName extends Schema.TaggedError<InvalidAppName>()("InvalidAppName", {
  name: Schema.String,
  /** Set for a well-formed name the gateway keeps for its own routes. */
  reserved: Schema.optional(Schema.Boolean)
}) {
  override get message() {
    return this.reserved === true
      ? `"${this.name}" is not a valid app name: the gateway's own routes use it (/app/${this.name}/...); choose another`
      : `"${shortened(this.name, echoedChars)}" is not a valid app name: use 1 to 63 letters, digits, "-" or "_", starting with a letter or digit`
  }
}

export class AppSyntaxError extends Schema.TaggedError<AppSyntaxError>()("AppSyntaxError", {
  message: Schema.String
}) {}

export class ForbiddenImport extends Schema.TaggedError<ForbiddenImport>()("ForbiddenImport", {
  module: Schema.String,
  message: Schema.String
}) {}

export class InvalidApp extends Schema.TaggedError<InvalidApp>()("InvalidApp", { message: Schema.String }) {}

export class RequestSchemaMismatch extends Schema.TaggedError<RequestSchemaMismatch>()("RequestSchemaMismatch", {
  message: Schema.String,
  issues: Schema.Array(Schema.Struct({ path: Schema.Array(Schema.Unknown), message: Schema.String }))
}) {}

export class TaskInputRejected extends Schema.TaggedError<TaskInputRejected>()("TaskInputRejected", {
  message: Schema.String
}) {}

/** A task the request needs has no executor able to take it right now; the client may retry. */
export class TaskUnavailable extends Schema.TaggedError<TaskUnavailable>()("TaskUnavailable", {
  message: Schema.String,
  /**
   * Nothing answered: the executor, its node or a sidecar on the way is gone (rather than an
   * executor that answered it had no room). Such a request is tried again until one is there.
   */
  unreachable: Schema.optional(Schema.Boolean)
}) {}

export class AppFailed extends Schema.TaggedError<AppFailed>()("AppFailed", {
  appId: Schema.String,
  message: Schema.String
}) {}

export class RequestTimeout extends Schema.TaggedError<RequestTimeout>()("RequestTimeout", {
  timeoutMs: Schema.Number,
  /** Whether the answer had begun streaming: it was then cut at the limit. */
  streaming: Schema.optionalWith(Schema.Boolean, { default: () => false })
}) {
  override get message() {
    return this.streaming
      ? `the request ran past its time limit of ${this.timeoutMs} ms (its stream included) and was stopped`
      : `the app did not answer within ${this.timeoutMs} ms`
  }
}

/** A body the route does not take by its content-type: an app's routes take JSON only. */
export class UnsupportedMediaType extends Schema.TaggedError<UnsupportedMediaType>()("UnsupportedMediaType", {
  message: Schema.String
}) {}

export class PayloadTooLarge extends Schema.TaggedError<PayloadTooLarge>()("PayloadTooLarge", {
  limitBytes: Schema.Number
}) {
  override get message() {
    return `the request body is larger than the limit of ${this.limitBytes} bytes`
  }
}

export class RequestBodyTimeout extends Schema.TaggedError<RequestBodyTimeout>()("RequestBodyTimeout", {
  idleTimeoutMs: Schema.Number
}) {
  override get message() {
    return `the request body sent nothing for ${this.idleTimeoutMs / 1000} s; the connection is closed`
  }
}

export class Unauthorized extends Schema.TaggedError<Unauthorized>()("Unauthorized", { message: Schema.String }) {}

/** An admin request that arrives the way a cross-site page or a rebound DNS name would send it. */
export class Forbidden extends Schema.TaggedError<Forbidden>()("Forbidden", { message: Schema.String }) {}

export class ShuttingDown extends Schema.TaggedError<ShuttingDown>()("ShuttingDown", {}) {
  override get message() {
    return "the platform is shutting down"
  }
}

export class NoExecutorForKind extends Schema.TaggedError<NoExecutorForKind>()("NoExecutorForKind", {
  kind: Schema.String,
  taskId: Schema.String
}) {
  override get message() {
    return `no executor for task kind "${this.kind}" (task ${this.taskId}) on this platform`
  }
}

export class DeploymentFailed extends Schema.TaggedError<DeploymentFailed>()("DeploymentFailed", {
  message: Schema.String
}) {}

export class TaskNotFound extends Schema.TaggedError<TaskNotFound>()("TaskNotFound", { taskId: Schema.String }) {
  override get message() {
    return `no task "${shortened(this.taskId, echoedChars)}" is deployed`
  }
}

export class DevicesExhausted extends Schema.TaggedError<DevicesExhausted>()("DevicesExhausted", {
  message: Schema.String
}) {}

/** An executor failed on a task of the request (its own fault, not the request's). */
export class DispatchFailed extends Schema.TaggedError<DispatchFailed>()("DispatchFailed", {
  message: Schema.String
}) {}

/** The app recorded a task graph the platform cannot run (its data wiring, an unknown operation). */
export class InvalidTaskGraph extends Schema.TaggedError<InvalidTaskGraph>()("InvalidTaskGraph", {
  message: Schema.String
}) {}

/** The request was cancelled (its client went away) while its task graph ran. */
export class RequestCancelled extends Schema.TaggedError<RequestCancelled>()("RequestCancelled", {
  requestId: Schema.String
}) {
  override get message() {
    return `request ${this.requestId} was cancelled`
  }
}

export class NotSupported extends Schema.TaggedError<NotSupported>()("NotSupported", { message: Schema.String }) {}

/** The app has as many requests running and queued as it allows: the client should come back later. */
export class AppOverloaded extends Schema.TaggedError<AppOverloaded>()("AppOverloaded", {
  appId: Schema.String,
  maxConcurrency: Schema.Number,
  maxQueue: Schema.Number
}) {
  override get message() {
    return `app ${this.appId} has ${this.maxConcurrency} request(s) running and ${this.maxQueue} queued, its limit`
  }
}

/** A request waited in its app's queue for as long as the app allows, and was not started. */
export class QueueTimeout extends Schema.TaggedError<QueueTimeout>()("QueueTimeout", {
  appId: Schema.String,
  waitedMs: Schema.Number
}) {
  override get message() {
    return `the request waited ${this.waitedMs} ms in app ${this.appId}'s queue and was not started`
  }
}

/** A recording of the task's profile is running already. */
export class RecordingInProgress extends Schema.TaggedError<RecordingInProgress>()("RecordingInProgress", {
  taskId: Schema.String
}) {
  override get message() {
    return `a profile of task ${this.taskId} is being recorded already; wait for it to end`
  }
}

export type RegistrationError = AppNameTaken | InvalidAppName | AppSyntaxError | ForbiddenImport | InvalidApp

export type ControlPlaneError =
  | AppNotFound
  | AppNotReady
  | AppNameTaken
  | RecordingInProgress
  | InvalidAppName
  | AppSyntaxError
  | ForbiddenImport
  | InvalidApp
  | BadRequest
  | RouteNotFound
  | RequestSchemaMismatch
  | TaskInputRejected
  | AppFailed
  | TaskUnavailable
  | RequestTimeout
  | PayloadTooLarge
  | UnsupportedMediaType
  | RequestBodyTimeout
  | Unauthorized
  | Forbidden
  | ShuttingDown
  | NoExecutorForKind
  | DeploymentFailed
  | TaskNotFound
  | DevicesExhausted
  | DispatchFailed
  | InvalidTaskGraph
  | RequestCancelled
  | NotSupported
  | AppOverloaded
  | QueueTimeout
