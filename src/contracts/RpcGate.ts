import type { IncomingMessage, RequestListener, ServerResponse } from "node:http"
import * as HttpClient from "@effect/platform/HttpClient"
import * as HttpClientRequest from "@effect/platform/HttpClientRequest"
import * as NodeHttpClient from "@effect/platform-node/NodeHttpClient"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { carriesSecret } from "./Credentials.js"
import { refuseUnread } from "./RefuseUnread.js"

/**
 * The door of a cluster RPC endpoint (the control plane's cluster port, each node's `/rpc`): a
 * caller proves the secret in its `authorization` header and says its body's length, both before
 * a byte of the body is read, let alone decoded. A stranger's 64 MB POST is refused from its
 * headers; the node goes on beating.
 */

/** The largest body a cluster call carries: a node's report of its executors, a placement. */
export const maxRpcBodyBytes = 4 << 20

/** The header a node names itself in, so that a refusal can say who was refused. */
export const nodeNameHeader = "x-cornserve-node"

/** Who called, for a refusal's log line: the node name it claims (bounded, printable) and its address. */
export const callerOf = (request: IncomingMessage): string => {
  const claimed = request.headers[nodeNameHeader]
  const name = typeof claimed === "string" ? claimed.replace(/[^\w.-]/g, "?").slice(0, 64) : undefined
  const address = request.socket.remoteAddress ?? "an unknown address"
  return name === undefined ? `a caller at ${address}` : `node ${name} (${address})`
}

/**
 * `handler` behind the secret and the size bound. `onRefused` hears of each caller refused for
 * its token (to log it: the caller's own answer is a bare 401).
 */
export const gatedRpc =
  (
    secret: string,
    handler: RequestListener,
    onRefused: (caller: string) => void = () => undefined,
    maxBytes: number = maxRpcBodyBytes
  ): RequestListener =>
  (request: IncomingMessage, response: ServerResponse) => {
    if (!carriesSecret(request.headers.authorization, secret)) {
      onRefused(callerOf(request))
      return refuseUnread(response, 401, "Unauthorized", "this endpoint needs the cluster token")
    }
    if (request.method === "POST") {
      const length = Number(request.headers["content-length"])
      if (request.headers["content-length"] === undefined || !Number.isSafeInteger(length)) {
        return refuseUnread(response, 411, "LengthRequired", "a cluster call says its body's length")
      }
      if (length > maxBytes) {
        return refuseUnread(response, 413, "PayloadTooLarge", `a cluster call's body is at most ${maxBytes} bytes`)
      }
    }
    return handler(request, response)
  }

/**
 * Node's HTTP client, each request carrying `secret` as its bearer token (and the calling node's
 * name, when a node calls; `ca` checks an https server's certificate); an answer other than 2xx fails
 * the call (`refusedForToken` tells a 401).
 */
export const authorizedHttpClient = (secret: string, nodeName?: string, ca?: string) =>
  Layer.effect(
    HttpClient.HttpClient,
    Effect.map(HttpClient.HttpClient, (client) =>
      client.pipe(
        HttpClient.mapRequest(HttpClientRequest.bearerToken(secret)),
        HttpClient.mapRequest(
          nodeName === undefined ? (request) => request : HttpClientRequest.setHeader(nodeNameHeader, nodeName)
        ),
        HttpClient.filterStatusOk
      )
    )
  ).pipe(
    Layer.provide(
      ca === undefined
        ? NodeHttpClient.layer
        : NodeHttpClient.layerWithoutAgent.pipe(Layer.provide(NodeHttpClient.makeAgentLayer({ ca })))
    )
  )

/** Whether a failed cluster call (an `RpcClientError`) was refused for its token. */
export const refusedForToken = (error: { readonly cause?: unknown }): boolean => {
  const cause = error.cause as { readonly _tag?: string; readonly response?: { readonly status?: number } } | undefined
  return cause?._tag === "ResponseError" && cause.response?.status === 401
}
