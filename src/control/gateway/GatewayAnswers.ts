/**
 * The bodies of the gateway's admin and listing routes, and its answers, as a client reads them
 * (the CLI decodes them with these, and the platform's OpenAPI document describes the routes with
 * them). A client reads the fields it uses: a struct takes an answer with more.
 */
import { ExecutorSettings } from "../../contracts/ExecutorSettings.js"
import * as Schema from "effect/Schema"
import * as Struct from "effect/Struct"
import { SchemaIssue } from "../../app-runtime/SchemaIssues.js"
import { ErrorBody } from "../../errors/ErrorBody.js"
import { RecordedProfile } from "../task-manager/ProfileRecording.js"

/** What every route answers on failure, as executors do: its error's tag and message (and details a route adds). */
export const ErrorAnswer = ErrorBody

/** An error answer with the details some add: the fields a request got wrong (422), the app or task it names. */
export const DetailedErrorAnswer = Schema.Struct({
  error: Schema.Struct({
    ...ErrorBody.fields.error.fields,
    issues: Schema.optional(Schema.Array(SchemaIssue)),
    appId: Schema.optional(Schema.String),
    taskId: Schema.optional(Schema.String),
    module: Schema.optional(Schema.String)
  })
})

/** The data of a registration's Server-Sent Events: `progress` and `final` tell, `error` fails it. */
export const RegistrationProgress = Schema.Struct({ message: Schema.String })
export const RegistrationFailed = ErrorAnswer

/** `POST /app/unregister/:id` */
export const UnregisterAnswer = Schema.Struct({ appId: Schema.String, message: Schema.String })

/** `GET /app/list` */
export const AppList = Schema.Struct({
  apps: Schema.Array(
    Schema.Struct({
      id: Schema.String,
      state: Schema.String,
      registeredAt: Schema.String,
      tasks: Schema.Array(Schema.Struct({ id: Schema.String, name: Schema.String, kind: Schema.String })),
      inFlight: Schema.Int,
      queued: Schema.optionalWith(Schema.Int, { default: () => 0 }),
      admission: Schema.optional(
        Schema.Struct({ maxConcurrency: Schema.Int, maxQueue: Schema.Int, queueTimeoutMs: Schema.Number })
      ),
      timeoutMs: Schema.optional(Schema.Number),
      error: Schema.optional(Schema.String),
      /** What its `serve` takes, as the app declared it (its document's example). */
      example: Schema.optional(Schema.Unknown),
      description: Schema.optional(Schema.String)
    })
  )
})

/** What a task's executors run with: its config's engine settings over `serve`'s defaults (threads are each executor's). */
export const TaskSettingsListing = Schema.Struct(Struct.omit(ExecutorSettings.fields, "threadsPerDevice"))

const TaskListing = Schema.Struct({
  id: Schema.String,
  name: Schema.String,
  kind: Schema.String,
  /** The config the app declared the task with. */
  config: Schema.Unknown,
  settings: TaskSettingsListing,
  state: Schema.String,
  usedBy: Schema.Array(Schema.String),
  devices: Schema.Array(Schema.String),
  /** Each executor: where it runs and answers (null: not started), its devices, and its calls in flight. */
  executors: Schema.Array(
    Schema.Struct({
      id: Schema.String,
      node: Schema.String,
      url: Schema.NullOr(Schema.String),
      devices: Schema.Array(Schema.String),
      healthy: Schema.Boolean,
      outstanding: Schema.Int
    })
  ),
  /** Calls refused since deployment because the task was full. */
  callsShed: Schema.Int,
  /** Scale to zero: its idle time (0: kept), its releases and cold starts (seconds per bucket), the last one's seconds (null: none yet). */
  idleRelease: Schema.Struct({
    releaseAfterS: Schema.Number,
    releases: Schema.Int,
    coldStarts: Schema.Struct({ buckets: Schema.Array(Schema.Int), sum: Schema.Number, count: Schema.Int }),
    coldStartsFailed: Schema.Int,
    lastColdStartS: Schema.NullOr(Schema.Number)
  })
})

/** A device of the platform: the first task holding it (null: free), and every task sharing it. */
const DeviceListing = Schema.Struct({
  id: Schema.String,
  type: Schema.String,
  threads: Schema.Number,
  task: Schema.NullOr(Schema.String),
  tasks: Schema.Array(Schema.String)
})

/** `GET /tasks/list` */
export const TaskList = Schema.Struct({ tasks: Schema.Array(TaskListing), devices: Schema.Array(DeviceListing) })

/** `POST /task/scale`: the tasks once scaled. */
export const ScaleAnswer = Schema.Struct({ taskId: Schema.String, tasks: Schema.Array(TaskListing) })

/** `GET /tasks/:id/profile`: what the task's calls measured, and the profile recorded ahead of time (null: none). */
export const TaskProfileAnswer = Schema.Struct({
  ...Struct.omit(RecordedProfile.fields, "recordedAt", "levels", "secondsPerLevel"),
  taskId: Schema.String,
  name: Schema.String,
  kind: Schema.String,
  executors: Schema.Int,
  recorded: Schema.NullOr(RecordedProfile)
})

/** `GET /health`: 503 while the platform shuts down. */
export const HealthAnswer = Schema.Struct({
  status: Schema.Literal("ok", "shutting-down"),
  role: Schema.String,
  apps: Schema.Int
})

/** `GET /ready`: 200 once the apps of the state dir are back, 503 before (with how many are still restoring) and while shutting down. */
export const ReadyAnswer = Schema.Struct({
  status: Schema.Literal("ready", "starting", "shutting-down"),
  restoring: Schema.optional(Schema.Int)
})

/** `GET /nodes/list` */
export const NodeList = Schema.Struct({
  nodes: Schema.Array(
    Schema.Struct({
      name: Schema.String,
      role: Schema.String,
      address: Schema.String,
      state: Schema.String,
      joinedAt: Schema.String,
      lastSeenAt: Schema.String,
      devices: Schema.Array(DeviceListing)
    })
  )
})

/**
 * `GET /app/:id/openapi.json`, as `app describe` reads it: the app's description, and its invoke
 * route's request body, example and answers (OpenAPI's shapes; the rest of the document is read as
 * it comes).
 */
const DocumentMediaType = Schema.Struct({
  schema: Schema.optional(Schema.Unknown),
  example: Schema.optional(Schema.Unknown)
})
const DocumentContent = Schema.Record({ key: Schema.String, value: DocumentMediaType })
export const AppDocument = Schema.Struct({
  openapi: Schema.String,
  info: Schema.Struct({ title: Schema.String, description: Schema.optional(Schema.String) }),
  paths: Schema.Record({
    key: Schema.String,
    value: Schema.Struct({
      post: Schema.optional(
        Schema.Struct({
          operationId: Schema.optional(Schema.String),
          requestBody: Schema.optional(Schema.Struct({ content: DocumentContent })),
          responses: Schema.optional(
            Schema.Record({
              key: Schema.String,
              value: Schema.Struct({ description: Schema.String, content: Schema.optional(DocumentContent) })
            })
          )
        })
      )
    })
  }),
  components: Schema.optional(
    Schema.Struct({ schemas: Schema.optional(Schema.Record({ key: Schema.String, value: Schema.Unknown })) })
  )
})

/** The answers as decoded (the CLI reads them so). */
export type AppList = typeof AppList.Type
export type TaskList = typeof TaskList.Type
export type NodeList = typeof NodeList.Type
export type TaskProfileAnswer = typeof TaskProfileAnswer.Type

/**
 * The answers as JSON, as a client that does not decode them reads them (a latency of no call is
 * null, a field with a default may be absent): the console imports these, checked at build time.
 */
export type AppListJson = typeof AppList.Encoded
export type TaskListJson = typeof TaskList.Encoded
export type NodeListJson = typeof NodeList.Encoded
export type TaskProfileJson = typeof TaskProfileAnswer.Encoded
