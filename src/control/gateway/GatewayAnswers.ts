/**
 * The gateway's answers to its admin and listing routes, as a client reads them (the CLI decodes
 * them with these). A client reads the fields it uses: a struct takes an answer with more.
 */
import { Schema, Struct } from "effect"
import { ErrorBody } from "../../executors/common/errors.js"
import { RecordedProfile } from "../task-manager/ProfileRecording.js"

/** What every route answers on failure, as executors do: its error's tag and message (and details a route adds). */
export const ErrorAnswer = ErrorBody

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
      tasks: Schema.Array(Schema.Struct({ name: Schema.String })),
      inFlight: Schema.Int,
      queued: Schema.optionalWith(Schema.Int, { default: () => 0 }),
      admission: Schema.optional(
        Schema.Struct({ maxConcurrency: Schema.Int, maxQueue: Schema.Int, queueTimeoutMs: Schema.Number })
      ),
      timeoutMs: Schema.optional(Schema.Number),
      error: Schema.optional(Schema.String)
    })
  )
})

const TaskListing = Schema.Struct({
  id: Schema.String,
  name: Schema.String,
  kind: Schema.String,
  state: Schema.String,
  usedBy: Schema.Array(Schema.String),
  devices: Schema.Array(Schema.String),
  executors: Schema.Array(Schema.Struct({ id: Schema.String, node: Schema.String, healthy: Schema.Boolean }))
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

/** `GET /nodes/list` */
export const NodeList = Schema.Struct({
  nodes: Schema.Array(
    Schema.Struct({
      name: Schema.String,
      role: Schema.String,
      address: Schema.String,
      state: Schema.String,
      devices: Schema.Array(
        Schema.Struct({
          id: Schema.String,
          task: Schema.NullOr(Schema.String),
          tasks: Schema.optional(Schema.Array(Schema.String))
        })
      )
    })
  )
})
