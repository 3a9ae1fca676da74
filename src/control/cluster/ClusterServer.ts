import { createServer } from "node:http"
import { createServer as createHttpsServer } from "node:https"
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import * as RpcSerialization from "@effect/rpc/RpcSerialization"
import * as RpcServer from "@effect/rpc/RpcServer"
import * as Console from "effect/Console"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Runtime from "effect/Runtime"
import { ServeConfig } from "../../config/ServeConfig.js"
import { ClusterRpcs } from "../../contracts/ClusterRpcs.js"
import { gatedRpc } from "../../contracts/RpcGate.js"
import { listening } from "../../process/Listening.js"
import { NodeRegistry } from "./NodeRegistry.js"

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
      Heartbeat: ({ token, name, instance, executors }) => registry.heartbeat(token, name, instance, executors)
    })
    const app = yield* RpcServer.toHttpApp(ClusterRpcs).pipe(
      Effect.provide(Layer.merge(handlers, RpcSerialization.layerMsgPack))
    )
    // The token is checked from the headers, before the body is read: see RpcGate.
    const runtime = yield* Effect.runtime<never>()
    const refused = (caller: string) =>
      Runtime.runFork(runtime)(Effect.logWarning(`refused ${caller}: its cluster token is not CORNSERVE_CLUSTER_TOKEN`))
    const handler = gatedRpc(config.clusterToken!, yield* NodeHttpServer.makeHandler(app), refused)
    const server = config.tls === undefined ? createServer(handler) : createHttpsServer({ ...config.tls }, handler)
    const bound = yield* listening(server, config.clusterPort, config.host, "--cluster-port")
    yield* Console.log(
      `cornserve: cluster port open on ${config.host}:${bound.port}${config.tls === undefined ? "" : " (HTTPS)"}`
    )
  })
)
