/**
 * The platform's own routes, declared once as an `HttpApi`: apps, tasks and the platform's health.
 * The gateway serves them (`AdminRoutes.ts`, through `HttpApiBuilder`), the platform's OpenAPI
 * document is generated from them (`OpenApi.fromApi`), and the CLI calls them (`HttpApiClient`).
 *
 * Errors keep the one answer every route of the platform gives, `{ error: { code, message } }`,
 * with the status of the one table (`errors/HttpStatus.ts`): an endpoint declares the tags it may
 * answer, and its handler does not compile while it can fail with a tag the endpoint does not
 * declare. Pure definitions: the schema thread imports this module to write the document.
 */
import * as HttpApi from "@effect/platform/HttpApi"
import * as HttpApiEndpoint from "@effect/platform/HttpApiEndpoint"
import * as HttpApiGroup from "@effect/platform/HttpApiGroup"
import * as HttpApiMiddleware from "@effect/platform/HttpApiMiddleware"
import * as HttpApiSchema from "@effect/platform/HttpApiSchema"
import * as HttpApiSecurity from "@effect/platform/HttpApiSecurity"
import * as OpenApi from "@effect/platform/OpenApi"
import * as Schema from "effect/Schema"
import { type ErrorTag, httpStatuses } from "../../errors/HttpStatus.js"
import { RequestSchemaMismatch } from "../errors.js"
import { RecordRequest } from "../task-manager/ProfileRecording.js"
import {
  AppList,
  HealthAnswer,
  NodeList,
  ReadyAnswer,
  ScaleAnswer,
  TaskList,
  TaskProfileAnswer,
  UnregisterAnswer
} from "./GatewayAnswers.js"
import { RegisterRequest, ScaleRequest } from "./GatewayRequests.js"

/** A field a request got wrong, as a 422 names it. */
export type SchemaIssue = RequestSchemaMismatch["issues"][number]

/** The answer of an error with tag `Tag`: its code, message and the details some errors add. */
export type ErrorAnswerOf<Tag extends ErrorTag> = Tag extends ErrorTag
  ? {
      readonly error: {
        readonly code: Tag
        readonly message: string
        readonly issues?: ReadonlyArray<SchemaIssue>
        readonly appId?: string
        readonly taskId?: string
        readonly module?: string
      }
    }
  : never

const answerSchemas = new Map<ErrorTag, Schema.Schema<ErrorAnswerOf<ErrorTag>>>()

/** The schema of an error's answer, with its status from the one table (one schema per tag). */
export const errorAnswer = <Tag extends ErrorTag>(tag: Tag): Schema.Schema<ErrorAnswerOf<Tag>> => {
  const known = answerSchemas.get(tag)
  if (known !== undefined) return known as unknown as Schema.Schema<ErrorAnswerOf<Tag>>
  const schema = Schema.Struct({
    error: Schema.Struct({
      code: Schema.Literal(tag),
      message: Schema.String,
      issues: Schema.optional(RequestSchemaMismatch.fields.issues),
      appId: Schema.optional(Schema.String),
      taskId: Schema.optional(Schema.String),
      module: Schema.optional(Schema.String)
    })
  }).annotations({
    identifier: `${tag}Answer`,
    description: `An error with code \`${tag}\`.`,
    ...HttpApiSchema.annotations({ status: httpStatuses[tag].status })
  }) as unknown as Schema.Schema<ErrorAnswerOf<Tag>>
  answerSchemas.set(tag, schema as unknown as Schema.Schema<ErrorAnswerOf<ErrorTag>>)
  return schema
}

/** The tags an endpoint's `addError`s declared, read back from its type. */
export type DeclaredTags<Endpoint> =
  Endpoint extends HttpApiEndpoint.HttpApiEndpoint<
    infer _Name,
    infer _Method,
    infer _Path,
    infer _UrlParams,
    infer _Payload,
    infer _Headers,
    infer _Success,
    infer Error
  >
    ? Error extends ErrorAnswerOf<infer Tag>
      ? Tag
      : never
    : never

/** The admin token, as `Authorization: Bearer`; an admin request from a browser page is refused too. */
export class AdminAuth extends HttpApiMiddleware.Tag<AdminAuth>()("cornserve/AdminAuth", {
  failure: Schema.Union(errorAnswer("Unauthorized"), errorAnswer("Forbidden")),
  security: {
    adminToken: HttpApiSecurity.bearer.pipe(
      HttpApiSecurity.annotate(
        OpenApi.Description,
        "The platform's admin token (CORNSERVE_ADMIN_TOKEN, or the `admin-token` file of its state dir)."
      )
    )
  }
}) {}

const eventStream = (description: string) =>
  Schema.String.pipe(
    HttpApiSchema.withEncoding({ kind: "Text", contentType: "text/event-stream" }),
    Schema.annotations({ description })
  )
const plainText = (description: string) =>
  Schema.String.pipe(
    HttpApiSchema.withEncoding({ kind: "Text", contentType: "text/plain" }),
    Schema.annotations({ description })
  )
const idPath = (what: string) => Schema.Struct({ id: Schema.String.annotations({ description: what }) })

/** An endpoint that takes a body: the gateway reads it itself, bounded (size, idle time, nesting). */
const bodyRefusals = {
  BadRequest: errorAnswer("BadRequest"),
  PayloadTooLarge: errorAnswer("PayloadTooLarge"),
  RequestBodyTimeout: errorAnswer("RequestBodyTimeout")
}

export const register = HttpApiEndpoint.post("registerApp", "/app/register")
  .setPayload(RegisterRequest)
  .addSuccess(
    eventStream(
      "Server-Sent Events: `progress` (`{ message }`) as the app loads and its tasks deploy, then `final` (`{ message, app }`) or `error` (an error answer)."
    )
  )
  .addError(bodyRefusals.BadRequest)
  .addError(bodyRefusals.PayloadTooLarge)
  .addError(bodyRefusals.RequestBodyTimeout)
  .addError(errorAnswer("AppNameTaken"))
  .addError(errorAnswer("InvalidAppName"))
  .addError(errorAnswer("AppSyntaxError"))
  .addError(errorAnswer("ForbiddenImport"))
  .addError(errorAnswer("InvalidApp"))
  .addError(errorAnswer("DeploymentFailed"))
  .annotate(OpenApi.Summary, "Register an app (its TypeScript source, bundled)")
  .middleware(AdminAuth)

export const unregister = HttpApiEndpoint.post("unregisterApp", "/app/unregister/:id")
  .setPath(idPath("The app's id."))
  .addSuccess(UnregisterAnswer.annotations({ identifier: "UnregisterAnswer" }))
  .addError(errorAnswer("AppNotFound"))
  .annotate(OpenApi.Summary, "Unregister an app once its requests in flight finish")
  .middleware(AdminAuth)

export const listApps = HttpApiEndpoint.get("listApps", "/app/list")
  .addSuccess(AppList.annotations({ identifier: "AppList" }))
  .annotate(OpenApi.Summary, "The registered apps and their states")

export const appLogs = HttpApiEndpoint.get("appLogs", "/app/logs/:id")
  .setPath(idPath("The app's id."))
  .setUrlParams(
    Schema.Struct({
      follow: Schema.optional(
        Schema.String.annotations({
          description: "`1` or `true`: keep the answer open and write each line as the app writes it."
        })
      )
    })
  )
  .addSuccess(plainText("The app's log."))
  .addError(errorAnswer("AppNotFound"))
  .annotate(OpenApi.Summary, "What an app wrote to its stdout and stderr (the last 64 KiB)")
  .middleware(AdminAuth)

export const listTasks = HttpApiEndpoint.get("listTasks", "/tasks/list")
  .addSuccess(TaskList.annotations({ identifier: "TaskList" }))
  .annotate(OpenApi.Summary, "The deployed unit tasks and the devices")

export const listNodes = HttpApiEndpoint.get("listNodes", "/nodes/list")
  .addSuccess(NodeList.annotations({ identifier: "NodeList" }))
  .annotate(OpenApi.Summary, "The nodes of the cluster and their devices")

export const scale = HttpApiEndpoint.post("scaleTask", "/task/scale")
  .setPayload(ScaleRequest.annotations({ identifier: "ScaleRequest" }))
  .addSuccess(ScaleAnswer.annotations({ identifier: "ScaleAnswer" }))
  .addError(bodyRefusals.BadRequest)
  .addError(bodyRefusals.PayloadTooLarge)
  .addError(bodyRefusals.RequestBodyTimeout)
  .addError(errorAnswer("TaskNotFound"))
  .addError(errorAnswer("DevicesExhausted"))
  .addError(errorAnswer("DeploymentFailed"))
  .annotate(OpenApi.Summary, "Add devices to a task (a positive count) or take them away (a negative one)")
  .middleware(AdminAuth)

export const taskProfile = HttpApiEndpoint.get("taskProfile", "/tasks/:id/profile")
  .setPath(idPath("The task's id."))
  .addSuccess(TaskProfileAnswer.annotations({ identifier: "TaskProfileAnswer" }))
  .addError(errorAnswer("TaskNotFound"))
  .annotate(OpenApi.Summary, "What a task's calls measured, and its profile recorded ahead of time")

export const recordProfile = HttpApiEndpoint.post("recordTaskProfile", "/tasks/:id/profile/record")
  .setPath(idPath("The task's id."))
  .setPayload(RecordRequest.annotations({ identifier: "RecordRequest" }))
  .addSuccess(
    eventStream(
      "Server-Sent Events: `started`, `progress` as each load level ends, then `final` with the recorded profile, or `error`."
    )
  )
  .addError(bodyRefusals.BadRequest)
  .addError(bodyRefusals.PayloadTooLarge)
  .addError(bodyRefusals.RequestBodyTimeout)
  .addError(errorAnswer("TaskNotFound"))
  .addError(errorAnswer("RecordingInProgress"))
  .addError(errorAnswer("TaskUnavailable"))
  .annotate(OpenApi.Summary, "Record a task's profile: a sweep of load levels against its executors")
  .middleware(AdminAuth)

/** `/metrics` takes the metrics token or the admin token, unless the operator made it public. */
export class MetricsAuth extends HttpApiMiddleware.Tag<MetricsAuth>()("cornserve/MetricsAuth", {
  failure: errorAnswer("Unauthorized"),
  security: {
    metricsToken: HttpApiSecurity.bearer.pipe(
      HttpApiSecurity.annotate(OpenApi.Description, "CORNSERVE_METRICS_TOKEN, or the admin token.")
    )
  }
}) {}

export const metrics = HttpApiEndpoint.get("metrics", "/metrics")
  .addSuccess(plainText("The metrics in Prometheus's text format."))
  .annotate(OpenApi.Summary, "Prometheus metrics")
  .middleware(MetricsAuth)

const openApiDocument = Schema.Record({ key: Schema.String, value: Schema.Unknown }).annotations({
  identifier: "OpenApiDocument",
  description: "An OpenAPI 3.1 document."
})

export const platformDocument = HttpApiEndpoint.get("platformDocument", "/openapi.json")
  .addSuccess(openApiDocument)
  .annotate(OpenApi.Summary, "This document")

export const appDocument = HttpApiEndpoint.get("appDocument", "/app/:id/openapi.json")
  .setPath(idPath("The app's id."))
  .addSuccess(openApiDocument)
  .addError(errorAnswer("Unauthorized"))
  .addError(errorAnswer("AppNotFound"))
  .addError(errorAnswer("AppNotReady"))
  .annotate(OpenApi.Summary, "An app's OpenAPI document")
  .annotate(OpenApi.Description, "With API keys set, it wants one the app's invoke route takes.")

/** /health and /ready answer 503 with their usual body while the platform starts or shuts down. */
const unavailable = <A, I>(schema: Schema.Schema<A, I>, identifier: string, description: string) =>
  schema.annotations({ identifier, description, ...HttpApiSchema.annotations({ status: 503 }) })

export const health = HttpApiEndpoint.get("health", "/health")
  .addSuccess(HealthAnswer.annotations({ identifier: "HealthAnswer" }))
  .addError(unavailable(HealthAnswer, "HealthAnswerShuttingDown", "The platform shuts down."))
  .annotate(OpenApi.Summary, "Liveness")

export const ready = HttpApiEndpoint.get("ready", "/ready")
  .addSuccess(ReadyAnswer.annotations({ identifier: "ReadyAnswer" }))
  .addError(unavailable(ReadyAnswer, "ReadyAnswerNotReady", "Starting, or shutting down."))
  .annotate(OpenApi.Summary, "Readiness: the apps of the state dir are back")

export class AppsGroup extends HttpApiGroup.make("apps")
  .add(register)
  .add(unregister)
  .add(listApps)
  .add(appLogs)
  .add(appDocument)
  .annotate(OpenApi.Description, "Registering, listing and describing apps.") {}

export class TasksGroup extends HttpApiGroup.make("tasks")
  .add(listTasks)
  .add(listNodes)
  .add(scale)
  .add(taskProfile)
  .add(recordProfile)
  .annotate(OpenApi.Description, "The deployed unit tasks, their devices and profiles.") {}

export class PlatformGroup extends HttpApiGroup.make("platform")
  .add(health)
  .add(ready)
  .add(metrics)
  .add(platformDocument)
  .annotate(OpenApi.Description, "Health, readiness, metrics.") {}

/** Every route of the platform's own, but its pages and files (docs, console) and the apps' own routes. */
export class AdminApi extends HttpApi.make("cornserve").add(AppsGroup).add(TasksGroup).add(PlatformGroup) {}
