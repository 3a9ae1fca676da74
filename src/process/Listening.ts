import type { Server } from "node:http"
import type { AddressInfo } from "node:net"
import { Effect, type Scope } from "effect"

/** `server` listening on host:port for the scope's life (closed, connections and all, when it ends); answers the bound address. */
export const listening = (server: Server, port: number, host: string): Effect.Effect<AddressInfo, Error, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.async<AddressInfo, Error>((resume) => {
      server.once("error", (error) => resume(Effect.fail(error)))
      server.listen(port, host, () => resume(Effect.succeed(server.address() as AddressInfo)))
    }),
    () =>
      Effect.async<void>((resume) => {
        server.close(() => resume(Effect.void))
        server.closeAllConnections()
      })
  )
