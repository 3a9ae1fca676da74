/** How an error is answered over HTTP: its status, and how many seconds a client should wait before retrying. */
export interface HttpStatus {
  readonly status: number
  readonly retryAfterSeconds?: number
}

const badRequest: HttpStatus = { status: 400 }
const notFound: HttpStatus = { status: 404 }
const bug: HttpStatus = { status: 500 }
const retryShortly: HttpStatus = { status: 503, retryAfterSeconds: 1 }

/**
 * The one table from error tag to HTTP answer, for the gateway and every executor's router. Every
 * tag must be listed: the gateway's error answer (control/gateway/ErrorResponse.ts) does not compile
 * while an error of the control plane or of an executor has no status here, or the table a tag that
 * no error has. The table knows tags, not classes, so that this floor imports nothing above it.
 */
export const httpStatuses = {
  // The client's request
  BadRequest: badRequest,
  InvalidAppName: badRequest,
  AppSyntaxError: badRequest,
  ForbiddenImport: badRequest,
  InvalidApp: badRequest,
  TaskInputRejected: badRequest,
  NoExecutorForKind: badRequest,
  UnsupportedModality: badRequest,
  NoSidecar: badRequest,
  ContextLengthExceeded: badRequest,
  EmptyPrompt: badRequest,
  PromptError: badRequest,
  MediaError: badRequest,
  EngineRejected: badRequest,
  Unauthorized: { status: 401 },
  Forbidden: { status: 403 },
  AppNotFound: notFound,
  TaskNotFound: notFound,
  RouteNotFound: notFound,
  ModelNotFound: notFound,
  // The request names forwarded data that is not there: for the executor's caller, an unknown id.
  EmbeddingMissing: notFound,
  // The body stalled: the connection is closed, as node:http does for stalled headers.
  RequestBodyTimeout: { status: 408 },
  AppNameTaken: { status: 409 },
  RecordingInProgress: { status: 409 },
  // Over the app's own limit of running and queued requests.
  AppOverloaded: { status: 429, retryAfterSeconds: 1 },
  PayloadTooLarge: { status: 413 },
  MediaTooLarge: { status: 413 },
  // A body in a media type the route does not take (an app's routes take JSON only).
  UnsupportedMediaType: { status: 415 },
  RequestSchemaMismatch: { status: 422 },
  // The client went away; nobody reads the answer, but it must not look like a failure.
  RequestCancelled: { status: 499 },
  // A fault on the platform's side: an app's, an executor's or the platform's own bug
  AppFailed: bug,
  InvalidTaskGraph: bug,
  DeploymentFailed: bug,
  ExecutorFailed: bug,
  InternalError: bug,
  NotSupported: { status: 501 },
  DispatchFailed: { status: 502 },
  // Capacity: the same request may succeed shortly
  AppNotReady: retryShortly,
  TaskUnavailable: retryShortly,
  ShuttingDown: retryShortly,
  DevicesExhausted: retryShortly,
  EngineUnavailable: retryShortly,
  SidecarUnavailable: retryShortly,
  QueueTimeout: retryShortly,
  RequestTimeout: { status: 504 }
} as const satisfies Readonly<Record<string, HttpStatus>>

export type ErrorTag = keyof typeof httpStatuses

export const httpStatusOf = (error: { readonly _tag: ErrorTag }): HttpStatus => httpStatuses[error._tag]

/** The headers an error's answer carries besides its content type. */
export const errorHeaders = (answer: HttpStatus): Record<string, string> =>
  answer.retryAfterSeconds === undefined ? {} : { "retry-after": String(answer.retryAfterSeconds) }
