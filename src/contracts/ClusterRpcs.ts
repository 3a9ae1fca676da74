import * as Rpc from "@effect/rpc/Rpc"
import * as RpcGroup from "@effect/rpc/RpcGroup"
import * as Schema from "effect/Schema"

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

/** The most devices a node may say it has: more is a node that lies (or a mistake), not a machine. */
export const maxNodeDevices = 1024

/**
 * Names a node may not take: the default of `--node-name` (a node started without one) and names
 * that mean something to the objects and files the names key.
 */
const reservedNodeNames = new Set(["local", "__proto__", "constructor", "prototype"])

/** Lowercase letters, digits, `-`, `_` and `.`, beginning and ending with a letter or digit. */
const nodeNamePattern = /^[a-z0-9](?:[a-z0-9._-]{0,61}[a-z0-9])?$/

/**
 * Why `name` cannot name a data-plane node, or undefined when it can: 1 to 63 characters (a DNS
 * label, as a Kubernetes node's name usually is), no `..`, not reserved. Node names go into logs,
 * URLs of listings and the control plane's state dir, so the rule is checked where a node joins.
 */
export const nodeNameProblem = (name: string): string | undefined => {
  if (!nodeNamePattern.test(name) || name.includes(".."))
    return `the node name "${name.length > 80 ? `${name.slice(0, 80)}…` : name}" is not 1 to 63 lowercase letters, digits, "-", "_" or "." (beginning and ending with a letter or digit)`
  if (reservedNodeNames.has(name))
    return `the node name "${name}" is reserved${name === "local" ? " (it is the default of --node-name)" : ""}`
  return undefined
}

/**
 * Why a node's own account of its devices cannot be taken, or undefined: each id names its type and
 * index (`cpu:0`, `cuda:1`), no id twice, and the executors it reports run on its own devices.
 */
export const nodeDevicesProblem = (
  devices: ReadonlyArray<NodeDevice>,
  executors: ReadonlyArray<ExecutorReport>
): string | undefined => {
  const ids = new Set<string>()
  for (const device of devices) {
    if (device.id !== `${device.type}:${device.index}` || device.index < 0)
      return `its device "${device.id.slice(0, 40)}" is not ${device.type}:${device.index}`
    if (ids.has(device.id)) return `it names device ${device.id} twice`
    ids.add(device.id)
  }
  const foreign = executors.find((executor) => executor.devices.some((id) => !ids.has(id)))
  if (foreign !== undefined)
    return `it reports executor ${foreign.id.slice(0, 80)} on devices it does not have (${foreign.devices.join(", ").slice(0, 80)})`
  return undefined
}

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
  devices: Schema.Array(NodeDevice).pipe(Schema.maxItems(maxNodeDevices)),
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

/** The node's name breaks the rule for node names (see `nodeNameProblem`). */
export class NodeNameInvalid extends Schema.TaggedError<NodeNameInvalid>()("NodeNameInvalid", {
  message: Schema.String
}) {}

/** What the node says of its devices cannot be so (see `nodeDevicesProblem`). */
export class NodeDevicesInvalid extends Schema.TaggedError<NodeDevicesInvalid>()("NodeDevicesInvalid", {
  message: Schema.String
}) {}

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
    error: Schema.Union(ClusterTokenRefused, NodeNameTaken, NodeNameInvalid, NodeDevicesInvalid)
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
