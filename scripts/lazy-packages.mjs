/**
 * What the bundle (scripts/bundle.mjs) gives @effect/platform-node's modules for undici and ws:
 * the names they use, each package loaded when first used. Its HTTP server imports its HTTP client
 * (undici) and its WebSocket server (ws), about 0.25 CPU-s at a process's start together; an
 * executor's router serves plain HTTP and makes no client, so it loads neither.
 */
import { createRequire } from "node:module"

// Found from @effect/platform-node, as its own imports would find them.
const require = createRequire(createRequire(import.meta.url).resolve("@effect/platform-node/NodeHttpServer"))
const lazy = (name) => {
  let loaded
  return () => {
    loaded ??= require(name)
    return loaded
  }
}
const undici = lazy("undici")
const ws = lazy("ws")

/** `new Agent(options)`: undici's Agent. */
export function Agent(...args) {
  return new (undici().Agent)(...args)
}

export const getGlobalDispatcher = () => undici().getGlobalDispatcher()

/** `new WebSocketServer(options)`: ws's. */
export function WebSocketServer(...args) {
  return new (ws().WebSocketServer)(...args)
}

/** `new WebSocket(url, protocols)`: ws's. */
export function WebSocket(...args) {
  return new (ws().WebSocket)(...args)
}
