import type { Server } from "node:http"
import type { AddressInfo } from "node:net"
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"

/**
 * Why a server could not listen on host:port, in words: a port taken by another program (another
 * cornserve on the same port, most often), an address this machine does not have, a port below
 * 1024 without the right to it. `option` names the flag that chooses the port.
 */
export const listenFailure = (cause: unknown, host: string, port: number, option = "--port"): Error => {
  const code = (cause as NodeJS.ErrnoException | undefined)?.code
  const where = `${host.includes(":") ? `[${host}]` : host}:${port}`
  const why =
    code === "EADDRINUSE"
      ? `the port is taken by another program (another cornserve?); stop it or choose another port with ${option}`
      : code === "EADDRNOTAVAIL"
        ? "this machine has no such address; choose one of its own with --host"
        : code === "EACCES"
          ? `ports below 1024 need privileges; choose another with ${option}`
          : ((cause as Error | undefined)?.message ?? String(cause))
  return new Error(`cannot listen on ${where}: ${why}`)
}

/** `server` listening on host:port for the scope's life (closed, connections and all, when it ends); answers the bound address. */
export const listening = (
  server: Server,
  port: number,
  host: string,
  option?: string
): Effect.Effect<AddressInfo, Error, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.async<AddressInfo, Error>((resume) => {
      server.once("error", (error) => resume(Effect.fail(listenFailure(error, host, port, option))))
      server.listen(port, host, () => resume(Effect.succeed(server.address() as AddressInfo)))
    }),
    () =>
      Effect.async<void>((resume) => {
        server.close(() => resume(Effect.void))
        server.closeAllConnections()
      })
  )
