import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import { SidecarUnavailable } from "../../sidecar/errors.js"
import { MediaError, MediaTooLarge } from "./media/errors.js"

/** The node's sidecar went away while the request needed it (it is restarted): retry shortly. */
export { MediaError, MediaTooLarge, SidecarUnavailable }

/**
 * Errors an executor answers with, as `{ error: { code, message } }` where the code is the tag;
 * each tag's HTTP status is in src/errors/HttpStatus.ts. The dispatcher decodes the same body.
 */

/** The body is not JSON or does not match the route's schema. */
export class BadRequest extends Schema.TaggedError<BadRequest>()("BadRequest", { message: Schema.String }) {}

export class RouteNotFound extends Schema.TaggedError<RouteNotFound>()("RouteNotFound", {
  message: Schema.String
}) {}

/** The request names a model other than the one this executor serves. */
export class ModelNotFound extends Schema.TaggedError<ModelNotFound>()("ModelNotFound", {
  message: Schema.String
}) {}

export class UnsupportedModality extends Schema.TaggedError<UnsupportedModality>()("UnsupportedModality", {
  message: Schema.String
}) {}

/** The request asks for the sidecar, and this executor runs without one. */
export class NoSidecar extends Schema.TaggedError<NoSidecar>()("NoSidecar", {}) {
  override get message() {
    return 'this executor has no sidecar; ask for return: "inline"'
  }
}

export class ContextLengthExceeded extends Schema.TaggedError<ContextLengthExceeded>()("ContextLengthExceeded", {
  message: Schema.String
}) {}

export class EmptyPrompt extends Schema.TaggedError<EmptyPrompt>()("EmptyPrompt", {}) {
  override get message() {
    return "the prompt has no tokens"
  }
}

/** A forwarded embedding the request names did not arrive in the sidecar within the wait. */
export class EmbeddingMissing extends Schema.TaggedError<EmbeddingMissing>()("EmbeddingMissing", {
  message: Schema.String
}) {}

/** The engine cannot take the request now (loading, unhealthy, queue full): another executor may. */
export class EngineUnavailable extends Schema.TaggedError<EngineUnavailable>()("EngineUnavailable", {
  message: Schema.String
}) {}

/** The engine refused the request as it is (it needs more room than a batch or a device has). */
export class EngineRejected extends Schema.TaggedError<EngineRejected>()("EngineRejected", {
  message: Schema.String
}) {}

/** Running the request failed inside the executor (a worker's model run threw). */
export class ExecutorFailed extends Schema.TaggedError<ExecutorFailed>()("ExecutorFailed", {
  message: Schema.String
}) {}

/** Anything else the router did not expect: the executor's own bug. */
export class InternalError extends Schema.TaggedError<InternalError>()("InternalError", {
  message: Schema.String
}) {}

/** Every error an executor answers with, as it travels between its processes (encoded) and to the router. */
export const ExecutorError = Schema.Union(
  BadRequest,
  RouteNotFound,
  ModelNotFound,
  UnsupportedModality,
  NoSidecar,
  ContextLengthExceeded,
  EmptyPrompt,
  EmbeddingMissing,
  MediaError,
  MediaTooLarge,
  EngineUnavailable,
  SidecarUnavailable,
  EngineRejected,
  ExecutorFailed,
  InternalError
)
export type ExecutorError = typeof ExecutorError.Type

/**
 * Tags of errors raised by modules that define their own classes (media reading, prompt
 * building); they cross thread boundaries as plain errors that keep their name.
 */
export const foreignErrorTags = ["PromptError"] as const
export type ForeignErrorTag = (typeof foreignErrorTags)[number]

export type ExecutorErrorTag = ExecutorError["_tag"] | ForeignErrorTag

/** What every executor answers on failure; the dispatcher decodes it. */
export { ErrorBody } from "../../errors/ErrorBody.js"

/** An error as the router answers it: its tag and message. */
export interface AnsweredError {
  readonly _tag: ExecutorErrorTag
  readonly message: string
}

const isAnswered = (error: unknown): error is AnsweredError => {
  const tag = (error as { readonly _tag?: unknown } | null)?._tag
  return typeof tag === "string" && executorErrorTags.has(tag)
}

/** Error names that stand for a tag: classes outside this module and errors rebuilt after a thread hop. */
const byName = (error: Error): AnsweredError | undefined => {
  if (!executorErrorTags.has(error.name)) return undefined
  return { _tag: error.name as ExecutorErrorTag, message: error.message }
}

const executorErrorTags = new Set<string>([
  ...ExecutorError.members.map((member) => member._tag),
  ...foreignErrorTags
] satisfies ReadonlyArray<ExecutorErrorTag>)

/**
 * Any failure of a request inside an executor's router, as the error it is answered with: tagged
 * errors as they are, a body that is not JSON or fails the schema as BadRequest, and anything
 * unrecognised as InternalError (a bug of the executor's, never the client's fault).
 */
export const answeredErrorOf = (error: unknown): AnsweredError => {
  if (isAnswered(error)) return error
  if (ParseResult.isParseError(error)) {
    const issues = ParseResult.ArrayFormatter.formatErrorSync(error).map(
      (issue) => `${issue.path.length === 0 ? "body" : issue.path.join(".")}: ${issue.message}`
    )
    return new BadRequest({ message: issues.join("; ") })
  }
  const tag = (error as { readonly _tag?: unknown } | null)?._tag
  if (tag === "RequestError")
    return new BadRequest({
      message: `the body is not JSON: ${(error as { readonly message?: string }).message ?? ""}`
    })
  if (error instanceof Error) return byName(error) ?? new InternalError({ message: error.message })
  return new InternalError({ message: String(error) })
}
