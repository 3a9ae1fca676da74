import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import { type ErrorTag, errorHeaders, httpStatusOf } from "../../errors/HttpStatus.js"
import type { ExecutorErrorTag } from "../../executors/common/errors.js"
import { type ControlPlaneError, echoedChars } from "../errors.js"
import { shortened } from "../../app-runtime/Shortened.js"
import type { ErrorAnswerOf, SchemaIssue } from "./AdminApi.js"

export type GatewayError = ControlPlaneError

/** Compiles only while the status table lists exactly the tags of the platform's errors, no more, no fewer. */
type PlatformErrorTag = ControlPlaneError["_tag"] | ExecutorErrorTag
type BothEmpty<Unlisted extends never, Unknown extends never> = [Unlisted, Unknown]
export type EveryTagHasAStatus = BothEmpty<Exclude<PlatformErrorTag, ErrorTag>, Exclude<ErrorTag, PlatformErrorTag>>

/** `{ error: { code, message, ...details } }`: the answer of an error, typed by its tag. */
export const errorBody = <E extends GatewayError>(error: E): ErrorAnswerOf<E["_tag"]> => {
  const details: { issues?: ReadonlyArray<SchemaIssue>; appId?: string; taskId?: string; module?: string } = {}
  if (error._tag === "ForbiddenImport") details.module = error.module
  if (error._tag === "RequestSchemaMismatch") details.issues = error.issues
  if (error._tag === "AppNotFound" || error._tag === "AppNameTaken" || error._tag === "AppNotReady") {
    details.appId = shortened(error.appId, echoedChars)
  }
  if (error._tag === "TaskNotFound") details.taskId = shortened(error.taskId, echoedChars)
  // The code is the error's own tag, which the answer's type names.
  return { error: { code: error._tag, message: error.message, ...details } } as ErrorAnswerOf<E["_tag"]>
}

/** An error's status and headers, from the one table of statuses. */
export const errorHead = (
  error: GatewayError
): { readonly status: number; readonly headers: Record<string, string> } => {
  const answer = httpStatusOf(error)
  const headers = errorHeaders(answer)
  // The body of a refused upload is not read: the connection cannot carry another request.
  if (error._tag === "PayloadTooLarge" || error._tag === "RequestBodyTimeout") headers.connection = "close"
  return { status: answer.status, headers }
}

export const errorResponse = (error: GatewayError): HttpServerResponse.HttpServerResponse =>
  HttpServerResponse.unsafeJson(errorBody(error), errorHead(error))
