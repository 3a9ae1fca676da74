import type { ServerResponse } from "node:http"

/**
 * Answers a request refused from its headers, `{ error: { code, message } }`, without reading its
 * body: the connection is closed after, so that the unread body cannot reach a next request. (The
 * door of every port that checks a credential: cluster calls, executors, the gateway's API keys.)
 * Its own module: an executor's router needs it, and none of the cluster's HTTP client.
 */
export const refuseUnread = (response: ServerResponse, status: number, code: string, message: string) => {
  const body = JSON.stringify({ error: { code, message } })
  response.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(body),
    ...(status === 401 ? { "www-authenticate": "Bearer" } : {}),
    connection: "close"
  })
  response.end(body)
}
