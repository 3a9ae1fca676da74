import { readFile, rename, writeFile } from "node:fs/promises"
import { join as joinPath } from "node:path"
import * as RpcClient from "@effect/rpc/RpcClient"
import type * as RpcGroup from "@effect/rpc/RpcGroup"
import * as RpcSerialization from "@effect/rpc/RpcSerialization"
import type { RpcClientError } from "@effect/rpc/RpcClientError"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Runtime from "effect/Runtime"
import * as Schedule from "effect/Schedule"
import * as Schema from "effect/Schema"
import * as Scope from "effect/Scope"
import type { Device } from "../../node/Devices.js"
import { NodeAgent } from "../../node/NodeAgent.js"
import {
  ClusterTokenRefused,
  type ExecutorReport,
  NodeDevicesInvalid,
  type NodeInfo,
  NodeNameInvalid,
  NodeNameTaken,
  NotJoined,
  nodeDevicesProblem,
  nodeNameProblem
} from "../../contracts/ClusterRpcs.js"
import { NodeRpcs } from "../../contracts/NodeRpcs.js"
import { authorizedHttpClient } from "../../contracts/RpcGate.js"
import { sameSecret } from "../../contracts/Credentials.js"
import { NodeCallError, type NodeHandle, type RunningExecutor } from "./NodeHandle.js"
import { ServeConfig } from "../../config/ServeConfig.js"

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
  readonly devices: ReadonlyArray<Device>
  readonly address: string
  readonly sidecarPeerPort: number | undefined
  readonly rpcPort: number | undefined
  /** "all": the one node of a one-machine platform. */
  readonly role: "all" | "control-plane" | "data-plane"
  state: "ready" | "lost"
  /** Whether it was told, once, that its heartbeats report executors on devices it does not have. */
  warnedOfForeignExecutors?: boolean
  joinedAt: number
  lastSeenAt: number
  /** Its executors as its last heartbeat (or its join) told them, by id. */
  executors: ReadonlyMap<string, ExecutorReport>
}

/** `nodes.json` of the state dir: the data-plane nodes that were members. */
const KnownNodes = Schema.parseJson(Schema.Struct({ nodes: Schema.Array(Schema.String) }))

/** A listing as /nodes/list answers it (the resource manager adds what holds each device). */
export interface NodeSummary {
  readonly name: string
  readonly role: ClusterNode["role"]
  readonly address: string
  readonly state: ClusterNode["state"]
  readonly devices: ReadonlyArray<string>
  readonly joinedAt: string
  readonly lastSeenAt: string
}

/** What happened to a node: the resource manager redeploys what a lost (or restarted) node ran. */
export type NodeEvent =
  | { readonly _tag: "Joined"; readonly name: string }
  /** Its executors are gone or out of reach: a lost node, or one whose process started again. */
  | { readonly _tag: "Gone"; readonly name: string; readonly reason: string }
  | { readonly _tag: "Back"; readonly name: string }

const toDevice = (device: NodeInfo["devices"][number]): Device => ({
  id: device.id,
  type: device.type,
  index: device.index,
  threads: device.threads
})

/**
 * How long a StartExecutor may take: longer than a node waits for an executor to be ready (it
 * answers a failure then), so that only a node that never answers runs into it.
 */
const startTimeout = Duration.minutes(3)

/** How long a StopExecutor may take before the control plane gives up on it (the node's grace stops it anyway). */
const stopTimeout = "3 seconds"

export class NodeRegistry extends Effect.Service<NodeRegistry>()("cornserve/NodeRegistry", {
  scoped: Effect.gen(function* () {
    const config = yield* ServeConfig
    const agent = yield* NodeAgent
    const scope = yield* Effect.scope
    const runtime = yield* Effect.runtime<never>()
    const nodes = new Map<string, ClusterNode>()
    const listeners = new Set<(event: NodeEvent) => void>()
    /** The executors this control plane holds on each node, by node name. */
    const owned = new Map<string, Set<string>>()
    const now = Date.now()
    if (agent.devices.length > 0) {
      nodes.set(config.nodeId, {
        name: config.nodeId,
        instance: String(process.pid),
        devices: agent.devices,
        address: config.host,
        sidecarPeerPort: agent.sidecarPeerPort(),
        rpcPort: undefined,
        role: config.role === "all" ? "all" : "control-plane",
        state: "ready",
        joinedAt: now,
        lastSeenAt: now,
        executors: new Map()
      })
    }

    /**
     * The names of the data-plane nodes that were members, kept in the state dir: a restarted
     * control plane waits a moment for them before it places the apps it restores.
     */
    const knownPath = joinPath(config.stateDir, "nodes.json")
    const text = yield* Effect.promise(() => readFile(knownPath, "utf8").catch(() => undefined))
    const decoded = text === undefined ? undefined : Schema.decodeUnknownEither(KnownNodes)(text)
    if (decoded?._tag === "Left") yield* Effect.logWarning(`ignoring ${knownPath}: it is not a list of node names`)
    const known = new Set<string>(decoded?._tag === "Right" ? decoded.right.nodes : [])
    // Nodes join at once: each write is the whole set at that moment, one after another, through a rename (atomic).
    let writing = Promise.resolve()
    const remember = (name: string) =>
      known.has(name)
        ? Effect.void
        : Effect.promise(() => {
            known.add(name)
            const body = JSON.stringify({ nodes: [...known].sort() })
            writing = writing
              .then(async () => {
                const temporary = `${knownPath}.${process.pid}.tmp`
                await writeFile(temporary, body)
                await rename(temporary, knownPath)
              })
              .catch(() => undefined)
            return writing
          })

    /** Until the restored apps are placed, nodes keep executors the control plane does not hold yet. */
    let settled = false

    /** Waits until every node known from before has joined again, or `timeoutMs`; says which did not. */
    const awaitKnownNodes = (timeoutMs: number) =>
      Effect.gen(function* () {
        const missing = () => [...known].filter((name) => nodes.get(name)?.state !== "ready")
        if (missing().length === 0) return
        yield* Effect.logInfo(`waiting up to ${timeoutMs / 1000} s for node(s) ${missing().join(", ")} to join again`)
        const deadline = Date.now() + timeoutMs
        while (missing().length > 0 && Date.now() < deadline) yield* Effect.sleep("100 millis")
        if (missing().length > 0)
          yield* Effect.logWarning(`node(s) ${missing().join(", ")} did not join again; placing without them`)
      })

    const emit = (event: NodeEvent) => {
      for (const listener of listeners) listener(event)
    }

    /** Every ready node's sidecar peer address, this process's own included. */
    const peers = (): Record<string, string> => {
      const answer: Record<string, string> = {}
      for (const node of nodes.values()) {
        const port = node.role === "data-plane" ? node.sidecarPeerPort : agent.sidecarPeerPort()
        if (node.state === "ready" && port !== undefined) answer[node.name] = `${node.address}:${port}`
      }
      return answer
    }
    const tellOwnSidecar = () => Effect.promise(() => agent.setPeers(peers()))

    const checkToken = (token: string, who: string) =>
      Effect.suspend(() => {
        const expected = config.clusterToken
        if (expected !== undefined && sameSecret(token, expected)) return Effect.void
        return Effect.zipRight(
          Effect.logWarning(`refused ${who}: its cluster token is not CORNSERVE_CLUSTER_TOKEN`),
          Effect.fail(
            new ClusterTokenRefused({
              message: "the control plane refused this node: its CORNSERVE_CLUSTER_TOKEN is not the cluster's"
            })
          )
        )
      })

    /** A node whose name or devices cannot be taken is refused before anything of it is kept. */
    const checkNode = (node: NodeInfo) =>
      Effect.suspend((): Effect.Effect<void, NodeNameInvalid | NodeDevicesInvalid> => {
        const nameProblem = nodeNameProblem(node.name)
        if (nameProblem !== undefined) {
          return Effect.zipRight(
            Effect.logWarning(`refused a node from ${printable(node.advertiseHost)}: ${nameProblem}`),
            Effect.fail(
              new NodeNameInvalid({
                message: `the control plane refused this node: ${nameProblem}; give it another --node-name`
              })
            )
          )
        }
        const devicesProblem = nodeDevicesProblem(node.devices, node.executors)
        if (devicesProblem === undefined) return Effect.void
        return Effect.zipRight(
          Effect.logWarning(`refused node ${node.name} (${printable(node.advertiseHost)}): ${devicesProblem}`),
          Effect.fail(new NodeDevicesInvalid({ message: `the control plane refused this node: ${devicesProblem}` }))
        )
      })

    const join = (token: string, node: NodeInfo) =>
      Effect.gen(function* () {
        yield* checkToken(token, `node ${printable(node.name)} (${printable(node.advertiseHost)})`)
        yield* checkNode(node)
        const previous = nodes.get(node.name)
        if (previous !== undefined && previous.state === "ready" && previous.instance !== node.instance) {
          yield* Effect.logWarning(
            `refused node ${node.name} (${node.advertiseHost}): a running node (${previous.address}) has that name`
          )
          return yield* new NodeNameTaken({
            message: `a running node (${previous.address}) already has the name ${node.name}: give this one another --node-name`
          })
        }
        const at = Date.now()
        nodes.set(node.name, {
          name: node.name,
          instance: node.instance,
          devices: node.devices.map(toDevice),
          address: node.advertiseHost,
          sidecarPeerPort: node.sidecarPeerPort,
          rpcPort: node.rpcPort,
          role: "data-plane",
          state: "ready",
          joinedAt: at,
          lastSeenAt: at,
          executors: new Map(node.executors.map((executor) => [executor.id, executor]))
        })
        yield* Effect.logInfo(
          `node ${node.name} ${previous === undefined ? "joined" : "rejoined"} from ${node.advertiseHost} with ${node.devices.length} device(s): ${node.devices.map((device) => device.id).join(", ") || "none"}`
        )
        if (node.executors.length > 0) {
          yield* Effect.logInfo(
            `node ${node.name} runs ${node.executors.length} executor(s) from before (${node.executors.map((executor) => executor.taskId).join(", ")}): kept if their tasks are deployed on it again, stopped by the node otherwise`
          )
        }
        yield* tellOwnSidecar()
        yield* remember(node.name)
        emit({ _tag: "Joined", name: node.name })
        return { heartbeatMs, lostAfterMs, peers: peers(), settling: !settled }
      })

    const heartbeat = (token: string, name: string, instance: string, executors: ReadonlyArray<ExecutorReport>) =>
      Effect.gen(function* () {
        yield* checkToken(token, `a heartbeat from node ${name}`)
        const node = nodes.get(name)
        if (node === undefined || node.instance !== instance) {
          return yield* new NotJoined({ message: `node ${name} is not a member of this cluster: join again` })
        }
        node.lastSeenAt = Date.now()
        // Only executors on the node's own devices are taken, as at join: a report of others is not believed.
        const own = new Set(node.devices.map((device) => device.id))
        const believed = executors.filter((executor) => executor.devices.every((id) => own.has(id)))
        if (believed.length < executors.length && !node.warnedOfForeignExecutors) {
          node.warnedOfForeignExecutors = true
          yield* Effect.logWarning(
            `node ${name} reports ${executors.length - believed.length} executor(s) on devices it does not have; they are ignored`
          )
        }
        node.executors = new Map(believed.map((executor) => [executor.id, executor]))
        if (node.state === "lost") {
          node.state = "ready"
          yield* Effect.logInfo(`node ${name} is back`)
          yield* tellOwnSidecar()
          emit({ _tag: "Back", name })
        }
        return { peers: peers(), owned: [...(owned.get(name) ?? [])], settling: !settled }
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
          Effect.zipRight(
            Effect.logWarning(`node ${name} is lost: no heartbeat for ${lostAfterMs / 1000} s`),
            Effect.sync(() => emit({ _tag: "Gone", name, reason: `no heartbeat for ${lostAfterMs / 1000} s` }))
          )
        )
      ),
      Effect.zipRight(Effect.suspend(() => (Object.keys(peers()).length > 0 ? tellOwnSidecar() : Effect.void))),
      Effect.repeat(Schedule.spaced("250 millis")),
      Effect.forkScoped
    )

    /** One NodeRpcs client per node process, made on first use and kept while the registry lives. */
    const clients = new Map<string, NodeClient>()
    const clientOf = (node: ClusterNode) =>
      Effect.gen(function* () {
        const key = `${node.name}/${node.instance}`
        const cached = clients.get(key)
        if (cached !== undefined) return cached
        const protocol = yield* Layer.build(
          RpcClient.layerProtocolHttp({ url: `http://${hostInUrl(node.address)}:${node.rpcPort}/rpc` }).pipe(
            Layer.provide([authorizedHttpClient(config.clusterToken ?? ""), RpcSerialization.layerMsgPack])
          )
        ).pipe(Scope.extend(scope))
        const client = yield* RpcClient.make(NodeRpcs).pipe(Effect.provide(protocol), Scope.extend(scope))
        clients.set(key, client)
        return client
      })

    const nodeCallError = (node: string) => (error: { readonly message: string }) =>
      new NodeCallError({ node, message: `node ${node}: ${error.message}` })

    const own = (node: string, id: string, held: boolean) => {
      const set = owned.get(node) ?? new Set<string>()
      if (held) set.add(id)
      else set.delete(id)
      owned.set(node, set)
    }

    const remoteHandle = (name: string): NodeHandle => {
      const current = () => nodes.get(name)
      const withClient = <A, E>(use: (client: NodeClient, token: string) => Effect.Effect<A, E>) =>
        Effect.suspend((): Effect.Effect<A, E | Error> => {
          const node = current()
          if (node === undefined || node.state !== "ready") return Effect.fail(new Error(`node ${name} is not ready`))
          return Effect.flatMap(clientOf(node), (client) => use(client, config.clusterToken ?? ""))
        })
      return {
        name,
        devices: current()?.devices ?? [],
        prepareModel: (model, dtype, onProgress) =>
          Effect.zipRight(
            onProgress(`making model ${model} present on node ${name}`),
            withClient((client, token) =>
              client.PrepareModel(dtype === undefined ? { token, model } : { token, model, dtype })
            ).pipe(Effect.mapError(nodeCallError(name)))
          ),
        startExecutor: (placement) =>
          Effect.gen(function* () {
            const instance = current()?.instance
            own(name, placement.id, true)
            const started = yield* Effect.acquireRelease(
              withClient((client, token) => client.StartExecutor({ token, executor: placement })).pipe(
                Effect.timeoutFail({
                  duration: startTimeout,
                  onTimeout: () => ({
                    message: `executor ${placement.id} did not start within ${Duration.format(startTimeout)}`
                  })
                }),
                Effect.mapError(nodeCallError(name)),
                Effect.tapError(() => Effect.sync(() => own(name, placement.id, false)))
              ),
              () =>
                Effect.sync(() => own(name, placement.id, false)).pipe(
                  Effect.zipRight(withClient((client, token) => client.StopExecutor({ token, id: placement.id }))),
                  Effect.timeout(stopTimeout),
                  Effect.ignore
                )
            )
            if (started.kept) yield* Effect.logInfo(`node ${name} kept executor ${placement.id}: it already ran there`)
            return {
              url: () => {
                const node = current()
                if (node === undefined || node.state !== "ready" || node.instance !== instance) return undefined
                const report = node.executors.get(placement.id)
                if (report === undefined) return started.url
                return report.state === "ready" ? report.url : undefined
              },
              restart: (reason) =>
                Runtime.runFork(runtime)(
                  withClient((client, token) => client.RestartExecutor({ token, id: placement.id, reason })).pipe(
                    Effect.ignore
                  )
                )
            } satisfies RunningExecutor
          })
      }
    }

    const localHandle: NodeHandle = {
      name: config.nodeId,
      devices: agent.devices,
      prepareModel: agent.prepareModel,
      startExecutor: (placement) =>
        Effect.map(
          agent.startExecutor({
            kind: placement.program,
            model: placement.model,
            ...(placement.dtype === undefined ? {} : { dtype: placement.dtype }),
            devices: agent.devices.filter((device) => placement.devices.includes(device.id)),
            settings: placement.settings
          }),
          (process): RunningExecutor => ({
            url: () => (process.state._tag === "Ready" ? process.state.ready : undefined),
            restart: (reason) => process.restart(reason)
          })
        )
    }

    /** How the control plane reaches a node's executors, or undefined for a node it does not know. */
    const handle = (name: string): NodeHandle | undefined => {
      const node = nodes.get(name)
      if (node === undefined) return undefined
      return node.role === "data-plane" ? remoteHandle(name) : localHandle
    }

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

    /** Calls `listener` on every node event; returns the unsubscription. */
    const subscribe = (listener: (event: NodeEvent) => void): (() => void) => {
      listeners.add(listener)
      return () => listeners.delete(listener)
    }

    return {
      join,
      heartbeat,
      awaitKnownNodes,
      /** The restored apps are placed: executors the control plane does not hold now are not coming back. */
      settle: Effect.sync(() => {
        settled = true
      }),
      list,
      handle,
      subscribe,
      /** The nodes as placement sees them. */
      nodes: (): ReadonlyArray<ClusterNode> => [...nodes.values()],
      localNode: config.nodeId
    }
  }),
  dependencies: [NodeAgent.Default]
}) {}

type NodeClient = RpcClient.RpcClient<RpcGroup.Rpcs<typeof NodeRpcs>, RpcClientError>

/** What a node said, bounded and printable, for a log line about a node that was refused. */
const printable = (text: string) => {
  const shown = text.replace(/[^\w.:@[\]-]/g, "?")
  return shown.length > 80 ? `${shown.slice(0, 80)}…` : shown
}

/** An IPv6 literal in brackets, as a URL needs it. */
const hostInUrl = (host: string) => (host.includes(":") && !host.startsWith("[") ? `[${host}]` : host)
