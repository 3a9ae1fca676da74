import { Rpc, RpcGroup } from "@effect/rpc"
import { Schema } from "effect"

/**
 * What a data-plane node and the control plane tell each other (served by the control plane on
 * its cluster port, msgpack over HTTP). Control messages only: tensors go sidecar to sidecar.
 */

export const NodeDevice = Schema.Struct({
  id: Schema.String,
  type: Schema.Literal("cpu", "cuda"),
  index: Schema.Int,
  /** A CPU device's thread budget (a node that does not say has 1). */
  threads: Schema.optionalWith(Schema.Int.pipe(Schema.between(1, 1024)), { default: () => 1 })
})
export type NodeDevice = typeof NodeDevice.Type

/** An executor a node runs, as its heartbeats tell it. */
export const ExecutorReport = Schema.Struct({
  id: Schema.String,
  taskId: Schema.String,
  devices: Schema.Array(Schema.String),
  state: Schema.Literal("starting", "ready", "restarting"),
  /** Where it serves while ready. */
  url: Schema.optional(Schema.String)
})
export type ExecutorReport = typeof ExecutorReport.Type

/** A node as it introduces itself when it joins. */
export const NodeInfo = Schema.Struct({
  name: Schema.NonEmptyTrimmedString,
  /** Changes each time the node's process starts: a second process under a taken name is told apart from a rejoin. */
  instance: Schema.String,
  devices: Schema.Array(NodeDevice),
  /** Where the control plane and other nodes reach this node's executors and its sidecar's peer port. */
  advertiseHost: Schema.String,
  sidecarPeerPort: Schema.optional(Schema.Int),
  /** The port of its NodeRpcs (and its /health). */
  rpcPort: Schema.Int,
  /** What it already runs: after a control-plane restart, what it may keep. */
  executors: Schema.Array(ExecutorReport)
})
export type NodeInfo = typeof NodeInfo.Type

/** The token the node was started with is not the cluster's (CORNSERVE_CLUSTER_TOKEN). */
export class ClusterTokenRefused extends Schema.TaggedError<ClusterTokenRefused>()("ClusterTokenRefused", {
  message: Schema.String
}) {}

/** Another running node already has this name. */
export class NodeNameTaken extends Schema.TaggedError<NodeNameTaken>()("NodeNameTaken", { message: Schema.String }) {}

/** The node is not (or no longer) a member: it must join again. */
export class NotJoined extends Schema.TaggedError<NotJoined>()("NotJoined", { message: Schema.String }) {}

/** Every node's sidecar peer address (node name → host:port), for the node's sidecar. */
const Peers = Schema.Record({ key: Schema.String, value: Schema.String })

export const JoinAnswer = Schema.Struct({
  /** How often the control plane expects a heartbeat, and after how long without one the node is lost. */
  heartbeatMs: Schema.Int,
  lostAfterMs: Schema.Int,
  peers: Peers,
  /** As in HeartbeatAnswer: the control plane is still placing the apps it restored. */
  settling: Schema.Boolean
})

export const HeartbeatAnswer = Schema.Struct({
  peers: Peers,
  /** The executors of this node the control plane holds; the others stop after the node's grace period. */
  owned: Schema.Array(Schema.String),
  /**
   * The control plane has just started and is still placing the apps it restored: it may yet take
   * back executors it does not hold now, so their grace period has not begun.
   */
  settling: Schema.Boolean
})
export type HeartbeatAnswer = typeof HeartbeatAnswer.Type

export class ClusterRpcs extends RpcGroup.make(
  Rpc.make("Join", {
    payload: { token: Schema.String, node: NodeInfo },
    success: JoinAnswer,
    error: Schema.Union(ClusterTokenRefused, NodeNameTaken)
  }),
  Rpc.make("Heartbeat", {
    payload: {
      token: Schema.String,
      name: Schema.String,
      instance: Schema.String,
      executors: Schema.Array(ExecutorReport)
    },
    success: HeartbeatAnswer,
    error: Schema.Union(ClusterTokenRefused, NotJoined)
  })
) {}
