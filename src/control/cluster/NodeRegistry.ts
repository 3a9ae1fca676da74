import { timingSafeEqual } from "node:crypto"
import { createServer } from "node:http"
import { NodeHttpServer } from "@effect/platform-node"
import { RpcSerialization, RpcServer } from "@effect/rpc"
import { Console, Effect, Layer, Schedule } from "effect"
import { listening } from "../../node/Listening.js"
import { NodeAgent } from "../../node/NodeAgent.js"
import { ClusterRpcs, ClusterTokenRefused, type NodeInfo, NodeNameTaken, NotJoined } from "../rpc/ClusterRpcs.js"
import { ServeConfig } from "../ServeConfig.js"

/**
 * The control plane's view of the platform's nodes: its own (when it has devices) and the
 * data-plane nodes that joined on its cluster port with the cluster token. A node that sends no
 * heartbeat for `lostAfterMs` is lost; the same node (by name) joining or beating again is ready
 * again, while a second process under a running node's name is refused.
 */

export const heartbeatMs = 1_000
export const lostAfterMs = 4_000

export interface ClusterNode {
  readonly name: string
  readonly instance: string
  readonly devices: NodeInfo["devices"]
  readonly address: string
  readonly sidecarPeerPort: number | undefined
  /** "all": the one node of a one-machine platform. */
  readonly role: "all" | "control-plane" | "data-plane"
  state: "ready" | "lost"
  joinedAt: number
  lastSeenAt: number
}

/** A listing as /nodes/list answers it. */
export interface NodeSummary {
  readonly name: string
  readonly role: ClusterNode["role"]
  readonly address: string
  readonly state: ClusterNode["state"]
  readonly devices: ReadonlyArray<string>
  readonly joinedAt: string
  readonly lastSeenAt: string
}

/** Constant-time comparison, so that a wrong token's timing tells nothing of the right one. */
const sameToken = (given: string, expected: string): boolean => {
  const a = Buffer.from(given)
  const b = Buffer.from(expected)
  return a.length === b.length && timingSafeEqual(a, b)
}

export class NodeRegistry extends Effect.Service<NodeRegistry>()("cornserve/NodeRegistry", {
  scoped: Effect.gen(function* () {
    const config = yield* ServeConfig
    const agent = yield* NodeAgent
    const nodes = new Map<string, ClusterNode>()
    const now = Date.now()
    if (agent.devices.length > 0) {
      nodes.set(config.nodeId, {
        name: config.nodeId,
        instance: String(process.pid),
        devices: agent.devices,
        address: config.host,
        sidecarPeerPort: undefined,
        role: config.role === "all" ? "all" : "control-plane",
        state: "ready",
        joinedAt: now,
        lastSeenAt: now
      })
    }

    const checkToken = (token: string, who: string) =>
      Effect.suspend(() => {
        const expected = config.clusterToken
        if (expected !== undefined && sameToken(token, expected)) return Effect.void
        return Effect.zipRight(
          Effect.logWarning(`refused ${who}: its cluster token is not CORNSERVE_CLUSTER_TOKEN`),
          Effect.fail(
            new ClusterTokenRefused({
              message: "the control plane refused this node: its CORNSERVE_CLUSTER_TOKEN is not the cluster's"
            })
          )
        )
      })

    const join = (token: string, node: NodeInfo) =>
      Effect.gen(function* () {
        yield* checkToken(token, `node ${node.name} (${node.advertiseHost})`)
        const known = nodes.get(node.name)
        if (known !== undefined && known.state === "ready" && known.instance !== node.instance) {
          yield* Effect.logWarning(
            `refused node ${node.name} (${node.advertiseHost}): a running node (${known.address}) has that name`
          )
          return yield* new NodeNameTaken({
            message: `a running node (${known.address}) already has the name ${node.name}: give this one another --node-name`
          })
        }
        const at = Date.now()
        nodes.set(node.name, {
          name: node.name,
          instance: node.instance,
          devices: node.devices,
          address: node.advertiseHost,
          sidecarPeerPort: node.sidecarPeerPort,
          role: "data-plane",
          state: "ready",
          joinedAt: at,
          lastSeenAt: at
        })
        yield* Effect.logInfo(
          `node ${node.name} ${known === undefined ? "joined" : "rejoined"} from ${node.advertiseHost} with ${node.devices.length} device(s): ${node.devices.map((device) => device.id).join(", ") || "none"}`
        )
        return { heartbeatMs, lostAfterMs }
      })

    const heartbeat = (token: string, name: string, instance: string) =>
      Effect.gen(function* () {
        yield* checkToken(token, `a heartbeat from node ${name}`)
        const node = nodes.get(name)
        if (node === undefined || node.instance !== instance) {
          return yield* new NotJoined({ message: `node ${name} is not a member of this cluster: join again` })
        }
        node.lastSeenAt = Date.now()
        if (node.state === "lost") {
          node.state = "ready"
          yield* Effect.logInfo(`node ${name} is back`)
        }
      })

    // Nodes that stopped beating are lost.
    yield* Effect.sync(() => {
      const at = Date.now()
      const lost: Array<string> = []
      for (const node of nodes.values()) {
        if (node.role === "data-plane" && node.state === "ready" && at - node.lastSeenAt > lostAfterMs) {
          node.state = "lost"
          lost.push(node.name)
        }
      }
      return lost
    }).pipe(
      Effect.flatMap((lost) =>
        Effect.forEach(lost, (name) =>
          Effect.logWarning(`node ${name} is lost: no heartbeat for ${lostAfterMs / 1000} s`)
        )
      ),
      Effect.repeat(Schedule.spaced("250 millis")),
      Effect.forkScoped
    )

    const list = (): ReadonlyArray<NodeSummary> =>
      [...nodes.values()]
        .sort((a, b) => a.name.localeCompare(b.name))
        .map((node) => ({
          name: node.name,
          role: node.role,
          address: node.address,
          state: node.state,
          devices: node.devices.map((device) => device.id),
          joinedAt: new Date(node.joinedAt).toISOString(),
          lastSeenAt: new Date(node.lastSeenAt).toISOString()
        }))

    return { join, heartbeat, list }
  }),
  dependencies: [NodeAgent.Default]
}) {}

/**
 * The cluster port of a control plane: ClusterRpcs over HTTP (msgpack) at /rpc, on --host and
 * --cluster-port. Absent on a one-machine platform.
 */
export const ClusterServer = Layer.scopedDiscard(
  Effect.gen(function* () {
    const config = yield* ServeConfig
    if (config.role !== "control-plane") return
    const registry = yield* NodeRegistry
    const handlers = ClusterRpcs.toLayer({
      Join: ({ token, node }) => registry.join(token, node),
      Heartbeat: ({ token, name, instance }) => registry.heartbeat(token, name, instance)
    })
    const app = yield* RpcServer.toHttpApp(ClusterRpcs).pipe(
      Effect.provide(Layer.merge(handlers, RpcSerialization.layerMsgPack))
    )
    const handler = yield* NodeHttpServer.makeHandler(app)
    const server = createServer(handler)
    const bound = yield* listening(server, config.clusterPort, config.host)
    yield* Console.log(`cornserve: cluster port open on ${config.host}:${bound.port}`)
  })
)
