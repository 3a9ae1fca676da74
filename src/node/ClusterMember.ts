import { randomUUID } from "node:crypto"
import { createServer } from "node:http"
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import * as RpcClient from "@effect/rpc/RpcClient"
import * as RpcSerialization from "@effect/rpc/RpcSerialization"
import * as RpcServer from "@effect/rpc/RpcServer"
import * as Console from "effect/Console"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Runtime from "effect/Runtime"
import * as Schedule from "effect/Schedule"
import { ClusterRpcs, ClusterTokenRefused } from "../contracts/ClusterRpcs.js"
import { sameSecret } from "../contracts/Credentials.js"
import { NodeCallFailed, NodeRpcs } from "../contracts/NodeRpcs.js"
import { authorizedHttpClient, gatedRpc, refusedForToken } from "../contracts/RpcGate.js"
import type { Dtype } from "../models/Dtype.js"
import { makeNodeExecutors } from "./NodeExecutors.js"
import { renderNodeMetrics } from "../sidecar/SidecarMetrics.js"
import { ServeConfig } from "../config/ServeConfig.js"
import { listening } from "../process/Listening.js"
import { NodeAgent } from "./NodeAgent.js"

/**
 * A data-plane node's membership: it joins the control plane at --join with the cluster token
 * (retrying with a growing wait while nothing answers there, and saying so), then beats every
 * second; a control plane that forgot it (it restarted) is joined again. A refusal (wrong token,
 * a name another running node has) ends the process with the reason. On --port it serves the
 * control plane's node calls (/rpc), /health for probes, and its sidecar's /metrics.
 */

/** The innermost cause's message of a failed call: the socket's or TLS's own words, not the client's wrapper. */
const rootCause = (error: { readonly message: string; readonly cause?: unknown }): string => {
  let message = error.message
  let cause: unknown = error.cause
  for (let depth = 0; depth < 8 && typeof cause === "object" && cause !== null; depth++) {
    const inner = cause as { readonly message?: unknown; readonly cause?: unknown }
    if (typeof inner.message === "string" && inner.message.length > 0) message = inner.message
    cause = inner.cause
  }
  return message
}

/** The control plane's cluster URL as its RPC endpoint. */
const rpcUrl = (join: string) => `${join.replace(/\/+$/, "")}/rpc`

/** 250 ms doubling up to 8 s between tries. */
const retryWaits = Schedule.exponential("250 millis", 2).pipe(Schedule.union(Schedule.spaced("8 seconds")))

export const runDataPlane = Effect.gen(function* () {
  const config = yield* ServeConfig
  const agent = yield* NodeAgent
  const join = config.join!
  const token = config.clusterToken!
  const instance = randomUUID()
  const runtime = yield* Effect.runtime<never>()
  const client = yield* RpcClient.make(ClusterRpcs)
  let joined = false
  const executors = makeNodeExecutors(agent, {
    advertiseHost: config.advertiseHost,
    graceMs: config.executorGraceMs,
    parent: yield* Effect.scope
  })

  // What the control plane asks of this node: each call carries the cluster token.
  const checkToken = (given: string) =>
    sameSecret(given, token)
      ? Effect.void
      : Effect.zipRight(
          Effect.logWarning("refused a node call: its cluster token is not CORNSERVE_CLUSTER_TOKEN"),
          Effect.fail(new ClusterTokenRefused({ message: "this node refused the call: wrong cluster token" }))
        )
  const failed = (error: Error) => new NodeCallFailed({ message: error.message })
  const handlers = NodeRpcs.toLayer({
    PrepareModel: ({ token: given, model, dtype }) =>
      checkToken(given).pipe(
        Effect.zipRight(agent.prepareModel(model, dtype as Dtype | undefined, (message) => Effect.logInfo(message))),
        Effect.asVoid,
        Effect.mapError((error) => (error instanceof ClusterTokenRefused ? error : failed(error)))
      ),
    StartExecutor: ({ token: given, executor }) =>
      checkToken(given).pipe(
        Effect.zipRight(executors.start(executor)),
        Effect.mapError((error) => (error instanceof ClusterTokenRefused ? error : failed(error)))
      ),
    StopExecutor: ({ token: given, id }) => Effect.zipRight(checkToken(given), executors.stopById(id)),
    RestartExecutor: ({ token: given, id, reason }) =>
      Effect.zipRight(checkToken(given), executors.restartById(id, reason))
  })
  const rpcApp = yield* RpcServer.toHttpApp(NodeRpcs).pipe(
    Effect.provide(Layer.merge(handlers, RpcSerialization.layerMsgPack))
  )
  const gatedRpcHandler = gatedRpc(token, yield* NodeHttpServer.makeHandler(rpcApp), (caller) =>
    Runtime.runFork(runtime)(
      Effect.logWarning(`refused a node call from ${caller}: its cluster token is not CORNSERVE_CLUSTER_TOKEN`)
    )
  )

  const server = createServer((request, response) => {
    if (request.url === "/rpc") return gatedRpcHandler(request, response)
    if (request.url === "/metrics" && request.method === "GET") {
      return void agent
        .sidecarClient()
        .then((client) => client.stats())
        .then(
          (stats) => {
            response.writeHead(200, { "content-type": "text/plain; version=0.0.4" })
            response.end(renderNodeMetrics(stats))
          },
          (error: unknown) => {
            response.writeHead(503, { "content-type": "application/json" })
            response.end(
              JSON.stringify({
                error: { code: "SidecarUnavailable", message: `the node's sidecar did not answer: ${String(error)}` }
              })
            )
          }
        )
    }
    const ok = request.url === "/health"
    response.writeHead(ok ? (joined ? 200 : 503) : 404, { "content-type": "application/json" })
    response.end(
      JSON.stringify(
        ok
          ? { status: joined ? "ok" : "joining", role: "data-plane", node: config.nodeId, controlPlane: join }
          : { error: { code: "RouteNotFound", message: `no route for ${request.method} ${request.url}` } }
      )
    )
  })
  // A model download may take long: the control plane's calls have no deadline here.
  server.requestTimeout = 0
  const bound = yield* listening(server, config.port, config.host)
  yield* Console.log(
    `cornserve: data-plane node ${config.nodeId} joining ${join} (health on http://${config.host}:${bound.port}/health)`
  )

  const node = () => ({
    name: config.nodeId,
    instance,
    devices: agent.devices,
    advertiseHost: config.advertiseHost,
    rpcPort: bound.port,
    executors: executors.reports(),
    ...(agent.sidecarPeerPort() === undefined ? {} : { sidecarPeerPort: agent.sidecarPeerPort()! })
  })
  const joinOnce = Effect.suspend(() => client.Join({ token, node: node() })).pipe(
    Effect.catchIf(
      (error) => error._tag === "RpcClientError" && refusedForToken(error),
      () =>
        new ClusterTokenRefused({
          message: "the control plane refused this node: its CORNSERVE_CLUSTER_TOKEN is not the cluster's"
        })
    ),
    Effect.tapErrorTag("RpcClientError", (error) =>
      Effect.logWarning(
        `the control plane at ${join} is not reachable (${rootCause(error)}); retrying, waiting longer each time (up to 8 s)`
      )
    )
  )
  const joinCluster = joinOnce.pipe(
    Effect.retry({
      while: (error) => error._tag === "RpcClientError",
      schedule: retryWaits
    }),
    Effect.tap((answer) =>
      Effect.zipRight(
        // A new member holds nothing of the control plane's yet.
        executors.heldBy([], answer.settling),
        Effect.promise(() => {
          joined = true
          return agent.setPeers(answer.peers)
        })
      )
    ),
    Effect.tap(() =>
      Effect.logInfo(`joined the control plane at ${join} as ${config.nodeId} with ${agent.devices.length} device(s)`)
    )
  )

  const answer = yield* joinCluster
  const beat = Effect.suspend(() =>
    client.Heartbeat({ token, name: config.nodeId, instance, executors: executors.reports() })
  ).pipe(
    Effect.tap((answer) =>
      Effect.zipRight(
        executors.heldBy(answer.owned, answer.settling).pipe(
          Effect.zipRight(
            Effect.suspend(() => {
              const was = joined
              joined = true
              return was ? Effect.void : Effect.logInfo(`the control plane at ${join} answers again`)
            })
          )
        ),
        Effect.promise(() => agent.setPeers(answer.peers))
      )
    ),
    Effect.catchTags({
      // The control plane restarted and forgot this node.
      NotJoined: () =>
        Effect.zipRight(
          Effect.logInfo("the control plane does not know this node (it restarted?): joining again"),
          Effect.asVoid(joinCluster)
        ),
      RpcClientError: (error) =>
        Effect.zipRight(
          Effect.sync(() => {
            if (joined)
              Runtime.runFork(runtime)(
                Effect.logWarning(
                  `lost the control plane at ${join} (${error.message}); trying again, and keeping this node's executors for ${config.executorGraceMs / 1000} s`
                )
              )
            joined = false
          }),
          executors.unreachable
        )
    })
  )
  yield* beat.pipe(
    Effect.zipRight(executors.sweep),
    Effect.repeat(Schedule.spaced(Duration.millis(answer.heartbeatMs)))
  )
  return yield* Effect.never
}).pipe(
  Effect.provide(
    Layer.unwrapEffect(
      Effect.map(ServeConfig, (config) =>
        RpcClient.layerProtocolHttp({ url: rpcUrl(config.join!) }).pipe(
          Layer.provide([
            authorizedHttpClient(config.clusterToken!, config.nodeId, config.tlsCa),
            RpcSerialization.layerMsgPack
          ])
        )
      )
    )
  )
)
