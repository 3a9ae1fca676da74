/**
 * The baseline for bench/gateway.ts: a bare node:http server doing the work of examples/hello.ts
 * (parse the JSON body, check that `name` is a string of 1..200 characters, answer the greeting).
 * It prints `bare-hello: serving at http://127.0.0.1:PORT` once it listens; SIGTERM stops it.
 */
import http from "node:http"
import type { AddressInfo } from "node:net"

const INVOKE_PATH = "/app/invoke/hello"

interface Reply {
  readonly status: number
  readonly payload: unknown
}

function greet(body: string): Reply {
  let parsed: unknown
  try {
    parsed = JSON.parse(body)
  } catch {
    return { status: 400, payload: { error: "the body is not JSON" } }
  }
  const name = typeof parsed === "object" && parsed !== null && "name" in parsed ? parsed.name : undefined
  if (typeof name !== "string" || name.length < 1 || name.length > 200) {
    return { status: 422, payload: { error: "name must be a string of 1..200 characters" } }
  }
  return { status: 200, payload: { greeting: `Hello, ${name}! Cornserve is serving you.` } }
}

function send(res: http.ServerResponse, { status, payload }: Reply): void {
  const body = JSON.stringify(payload)
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(body) })
  res.end(body)
}

const server = http.createServer((req, res) => {
  if (req.method !== "POST" || req.url !== INVOKE_PATH) {
    send(res, { status: 404, payload: { error: "not found" } })
    return
  }
  const chunks: Array<Buffer> = []
  req.on("data", (chunk: Buffer) => chunks.push(chunk))
  req.on("end", () => send(res, greet(Buffer.concat(chunks).toString("utf8"))))
})

// Same keep-alive timeout as the cornserve gateway, so idle pooled sockets survive between bench phases.
server.keepAliveTimeout = 65_000

server.listen(0, "127.0.0.1", () => {
  const { port } = server.address() as AddressInfo
  console.log(`bare-hello: serving at http://127.0.0.1:${port}`)
})

process.once("SIGTERM", () => {
  server.close(() => process.exit(0))
  server.closeAllConnections()
})
