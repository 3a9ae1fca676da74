import { HttpServerResponse } from "@effect/platform"
import type * as Errors from "../errors.js"

export type GatewayError =
  | Errors.AppNotFound
  | Errors.AppNotReady
  | Errors.AppNameTaken
  | Errors.InvalidAppName
  | Errors.AppSyntaxError
  | Errors.ForbiddenImport
  | Errors.InvalidApp
  | Errors.BadRequest
  | Errors.RequestSchemaMismatch
  | Errors.TaskInputRejected
  | Errors.AppFailed
  | Errors.TaskUnavailable
  | Errors.RequestTimeout
  | Errors.PayloadTooLarge
  | Errors.Unauthorized
  | Errors.ShuttingDown
  | Errors.NoExecutorForKind
  | Errors.DeploymentFailed
  | Errors.TaskNotFound
  | Errors.DevicesExhausted
  | Errors.DispatchFailed
  | Errors.NotSupported

/** The one place where control-plane errors become HTTP statuses. */
export const statusOf = (error: GatewayError): number => {
  switch (error._tag) {
    case "AppNotFound":
    case "TaskNotFound":
      return 404
    case "AppNameTaken":
      return 409
    case "InvalidAppName":
    case "AppSyntaxError":
    case "ForbiddenImport":
    case "InvalidApp":
    case "BadRequest":
    case "TaskInputRejected":
    case "NoExecutorForKind":
      return 400
    case "Unauthorized":
      return 401
    case "PayloadTooLarge":
      return 413
    case "RequestSchemaMismatch":
      return 422
    case "AppFailed":
    case "DeploymentFailed":
      return 500
    case "NotSupported":
      return 501
    case "DispatchFailed":
      return 502
    case "AppNotReady":
    case "TaskUnavailable":
    case "ShuttingDown":
    case "DevicesExhausted":
      return 503
    case "RequestTimeout":
      return 504
  }
}

/** `{ error: { code, message, ...details } }` as JSON. */
export const errorBody = (error: GatewayError): Record<string, unknown> => {
  const details: Record<string, unknown> = {}
  if (error._tag === "ForbiddenImport") details.module = error.module
  if (error._tag === "RequestSchemaMismatch") details.issues = error.issues
  if (error._tag === "AppNotFound" || error._tag === "AppNameTaken" || error._tag === "AppNotReady") {
    details.appId = error.appId
  }
  if (error._tag === "TaskNotFound") details.taskId = error.taskId
  return { error: { code: error._tag, message: error.message, ...details } }
}

export const errorResponse = (error: GatewayError): HttpServerResponse.HttpServerResponse => {
  const status = statusOf(error)
  const headers: Record<string, string> = {}
  if (status === 503) headers["retry-after"] = "1"
  if (status === 413) headers.connection = "close"
  return HttpServerResponse.unsafeJson(errorBody(error), { status, headers })
}
