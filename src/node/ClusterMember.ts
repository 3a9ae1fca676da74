import { randomUUID } from "node:crypto"
import { createServer } from "node:http"
import { NodeHttpClient } from "@effect/platform-node"
import { RpcClient, RpcSerialization } from "@effect/rpc"
import { Console, Duration, Effect, Layer, Schedule } from "effect"
import { ClusterRpcs } from "../control/rpc/ClusterRpcs.js"
import { ServeConfig } from "../control/ServeConfig.js"
import { listening } from "./Listening.js"
import { NodeAgent } from "./NodeAgent.js"

/**
 * A data-plane node's membership: it joins the control plane at --join with the cluster token
 * (retrying with a growing wait while nothing answers there, and saying so), then beats every
 * second; a control plane that forgot it (it restarted) is joined again. A refusal (wrong token,
 * a name another running node has) ends the process with the reason. Its /health answers on
 * --port, for probes.
 */

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
  const client = yield* RpcClient.make(ClusterRpcs)
  let joined = false

  const health = createServer((request, response) => {
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
  const bound = yield* listening(health, config.port, config.host)
  yield* Console.log(
    `cornserve: data-plane node ${config.nodeId} joining ${join} (health on http://${config.host}:${bound.port}/health)`
  )

  const node = {
    name: config.nodeId,
    instance,
    devices: agent.devices,
    advertiseHost: config.advertiseHost
  }
  const joinOnce = client
    .Join({ token, node })
    .pipe(
      Effect.tapErrorTag("RpcClientError", (error) =>
        Effect.logWarning(
          `the control plane at ${join} is not reachable (${error.message}); retrying, waiting longer each time (up to 8 s)`
        )
      )
    )
  const joinCluster = joinOnce.pipe(
    Effect.retry({
      while: (error) => error._tag === "RpcClientError",
      schedule: retryWaits
    }),
    Effect.tap(() =>
      Effect.sync(() => {
        joined = true
      })
    ),
    Effect.tap(() =>
      Effect.logInfo(`joined the control plane at ${join} as ${config.nodeId} with ${agent.devices.length} device(s)`)
    )
  )

  const answer = yield* joinCluster
  const beat = client.Heartbeat({ token, name: config.nodeId, instance }).pipe(
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
            joined = false
          }),
          Effect.logWarning(`lost the control plane at ${join} (${error.message}); trying again`)
        )
    }),
    Effect.tap(() =>
      Effect.sync(() => {
        joined = true
      })
    )
  )
  yield* beat.pipe(Effect.repeat(Schedule.spaced(Duration.millis(answer.heartbeatMs))))
  return yield* Effect.never
}).pipe(
  Effect.provide(
    Layer.unwrapEffect(
      Effect.map(ServeConfig, (config) =>
        RpcClient.layerProtocolHttp({ url: rpcUrl(config.join!) }).pipe(
          Layer.provide([NodeHttpClient.layer, RpcSerialization.layerMsgPack])
        )
      )
    )
  )
)
