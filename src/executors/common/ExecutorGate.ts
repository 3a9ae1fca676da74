import type { IncomingMessage, RequestListener } from "node:http"
import { carriesSecret } from "../../contracts/Credentials.js"
import { refuseUnread } from "../../contracts/RefuseUnread.js"

/**
 * The door of an executor's HTTP server. A node's executors listen where other nodes (and, on one
 * machine, the apps' processes) can reach them, and `/tasks/list` tells their addresses: a call
 * that does not come from the platform would take the node's sidecar arena and the executor's
 * queue without passing admission. Every route but `/health` needs the internal secret as
 * its bearer token, checked from the headers before a byte of the body is read; a caller without
 * it gets a small 401 and its connection closed.
 */

/**
 * The one route a stranger may call: it answers whether the executor is ready, and reads no body.
 * `/health/watch`, which the control plane follows and which tells the executor's load, is not.
 */
const openRoutes: ReadonlySet<string> = new Set(["/health"])

const isOpen = (request: IncomingMessage): boolean =>
  (request.method === "GET" || request.method === "HEAD") && openRoutes.has((request.url ?? "").split("?", 1)[0]!)

/** `handler` behind the internal secret: only the health probes answer without it. */
export const gatedExecutor =
  (secret: string, handler: RequestListener): RequestListener =>
  (request, response) =>
    isOpen(request) || carriesSecret(request.headers.authorization, secret)
      ? handler(request, response)
      : refuseUnread(response, 401, "Unauthorized", "an executor takes calls from its platform only (a bearer token)")
