import * as Rpc from "@effect/rpc/Rpc"
import * as RpcGroup from "@effect/rpc/RpcGroup"
import * as Schema from "effect/Schema"
import { ClusterTokenRefused } from "./ClusterRpcs.js"
import { ExecutorSettings } from "./ExecutorSettings.js"

/**
 * What the control plane asks of a data-plane node (served by the node on its --port at /rpc,
 * msgpack over HTTP, each call carrying the cluster token): make a model present, start and stop
 * the executors of the tasks it places there. How those executors fare comes back in the node's
 * heartbeats. Control messages only: tensors go sidecar to sidecar.
 */

export const ExecutorProgram = Schema.Literal("eric", "geri", "llm")

/** One executor as the control plane places it on a node. */
export const ExecutorPlacement = Schema.Struct({
  /** The control plane's name for it, unique on the platform. */
  id: Schema.String,
  taskId: Schema.String,
  program: ExecutorProgram,
  model: Schema.String,
  /** Which of the model's ONNX exports runs (`q4`); absent, fp32 or the closest there is. */
  dtype: Schema.optional(Schema.String.pipe(Schema.maxLength(16))),
  /** Device ids of the node (`cpu:0`). */
  devices: Schema.Array(Schema.String),
  settings: ExecutorSettings
})
export type ExecutorPlacement = typeof ExecutorPlacement.Type

/** The node could not make the model present, or start the executor. */
export class NodeCallFailed extends Schema.TaggedError<NodeCallFailed>()("NodeCallFailed", {
  message: Schema.String
}) {}

export const StartedExecutor = Schema.Struct({
  url: Schema.String,
  /** It was already running for the same task on the same devices (kept across a control-plane restart). */
  kept: Schema.Boolean
})

export class NodeRpcs extends RpcGroup.make(
  Rpc.make("PrepareModel", {
    payload: { token: Schema.String, model: Schema.String, dtype: Schema.optional(Schema.String) },
    success: Schema.Void,
    error: Schema.Union(ClusterTokenRefused, NodeCallFailed)
  }),
  Rpc.make("StartExecutor", {
    payload: { token: Schema.String, executor: ExecutorPlacement },
    success: StartedExecutor,
    error: Schema.Union(ClusterTokenRefused, NodeCallFailed)
  }),
  Rpc.make("StopExecutor", {
    payload: { token: Schema.String, id: Schema.String },
    success: Schema.Void,
    error: ClusterTokenRefused
  }),
  Rpc.make("RestartExecutor", {
    payload: { token: Schema.String, id: Schema.String, reason: Schema.String },
    success: Schema.Void,
    error: ClusterTokenRefused
  })
) {}
