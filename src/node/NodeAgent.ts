import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Runtime, type Scope, ScopedRef } from "effect"
import { ServeConfig } from "../control/ServeConfig.js"
import { SidecarClient } from "../sidecar/SidecarClient.js"
import type { SidecarReady } from "../sidecar/SidecarProcess.js"
import { removeAbandonedFiles, runDirPrefix } from "./AbandonedFiles.js"
import { type Device, parseDevices } from "./Devices.js"
import { type ProcessState, SupervisedProcess } from "./SupervisedProcess.js"

const sidecarReadyPattern = /cornserve sidecar: ready (\{.*\})/
const executorReadyPattern = /executor: serving at (http:\/\/\S+)[\s\S]*executor: ready/

export interface ExecutorLaunch {
  readonly kind: "eric" | "geri" | "llm"
  readonly model: string
  readonly devices: ReadonlyArray<Device>
  readonly args?: ReadonlyArray<string>
  readonly onState?: (state: ProcessState<string>) => void
}

/**
 * What runs on one node: its device inventory, its sidecar, and the executor processes the task
 * managers ask for. Every process is a supervised child: restarted with backoff when it crashes,
 * stopped when the agent's scope closes. When the sidecar restarts, the executors restart too,
 * since their connections to it are gone.
 */
export class NodeAgent extends Effect.Service<NodeAgent>()("cornserve/NodeAgent", {
  scoped: Effect.gen(function* () {
    const config = yield* ServeConfig
    const runtime = yield* Effect.runtime<never>()
    const log = (message: string) => Runtime.runSync(runtime)(Effect.logWarning(message))
    const devices = parseDevices(config.devices)
    const runDir = yield* Effect.acquireRelease(
      Effect.sync(() => {
        removeAbandonedFiles()
        return mkdtempSync(join(tmpdir(), `${runDirPrefix}${process.pid}-`))
      }),
      (dir) => Effect.sync(() => rmSync(dir, { recursive: true, force: true }))
    )
    const socketPath = join(runDir, "sidecar.sock")
    const executors = new Set<SupervisedProcess<string>>()
    let executorCount = 0
    let sidecarRuns = 0
    let sidecarArena: string | undefined

    const sidecar = yield* SupervisedProcess.start<SidecarReady>({
      name: `sidecar of node ${config.nodeId}`,
      args: [
        "internal",
        "sidecar",
        "--node-id",
        config.nodeId,
        "--socket",
        socketPath,
        "--arena-bytes",
        String(config.sidecarArenaBytes)
      ],
      parseReady: (output) => {
        const match = sidecarReadyPattern.exec(output)
        return match === null ? undefined : (JSON.parse(match[1]!) as SidecarReady)
      },
      startTimeoutMs: 30_000,
      log,
      onState: (state) => {
        // A sidecar that was killed could not remove its arena file; nothing else would.
        if (state._tag === "Crashed" && sidecarArena !== undefined) rmSync(sidecarArena, { force: true })
        if (state._tag !== "Ready") return
        sidecarArena = state.ready.arenaPath
        if (sidecarRuns++ > 0) for (const executor of executors) executor.restart("the node's sidecar restarted")
      }
    })

    const connect = Effect.acquireRelease(
      Effect.tryPromise(() => SidecarClient.connect(socketPath)),
      (client) => Effect.promise(() => client.close())
    )
    const connection = yield* ScopedRef.fromAcquire(connect)
    const reconnecting = yield* Effect.makeSemaphore(1)
    /**
     * The control plane's own connection to the sidecar: stats, and releasing what a cancelled
     * request left. A connection to a sidecar that has since gone is replaced by one to the sidecar
     * now running. While none runs, the closed connection is answered: its calls fail as
     * unavailable, which every caller expects of a sidecar.
     */
    const sidecarConnection = reconnecting.withPermits(1)(
      Effect.gen(function* () {
        const current = yield* ScopedRef.get(connection)
        if (current.connected) return current
        yield* ScopedRef.set(connection, connect).pipe(Effect.ignore)
        return yield* ScopedRef.get(connection)
      })
    )
    const sidecarClient = (): Promise<SidecarClient> => Runtime.runPromise(runtime)(sidecarConnection)

    const startExecutor = (launch: ExecutorLaunch): Effect.Effect<SupervisedProcess<string>, Error, Scope.Scope> =>
      Effect.gen(function* () {
        const executor = yield* SupervisedProcess.start<string>({
          name: `${launch.kind} executor (${launch.model} on ${launch.devices.map((device) => device.id).join(",")})`,
          args: [
            "internal",
            "executor",
            "--kind",
            launch.kind,
            "--model",
            launch.model,
            "--devices",
            launch.devices.map((device) => device.id).join(","),
            "--sidecar-socket",
            socketPath,
            // Inside the agent's own directory: gone with it even when the executor is killed.
            "--run-dir",
            join(runDir, `executor-${executorCount++}`),
            ...(launch.args ?? [])
          ],
          parseReady: (output) => executorReadyPattern.exec(output)?.[1],
          startTimeoutMs: 120_000,
          log,
          ...(launch.onState === undefined ? {} : { onState: launch.onState })
        })
        executors.add(executor)
        yield* Effect.addFinalizer(() => Effect.sync(() => executors.delete(executor)))
        return executor
      })

    return {
      nodeId: config.nodeId,
      devices,
      socketPath,
      sidecar,
      sidecarClient,
      startExecutor
    }
  })
}) {}
