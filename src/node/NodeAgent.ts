import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Effect from "effect/Effect"
import * as Runtime from "effect/Runtime"
import * as Schema from "effect/Schema"
import type * as Scope from "effect/Scope"
import { ServeConfig } from "../config/ServeConfig.js"
import { ExecutorSettings } from "../contracts/ExecutorSettings.js"
import type { ModelDownloadEvent } from "../models/Hub.js"
import type { Dtype } from "../models/Dtype.js"
import { SidecarClient } from "../sidecar/SidecarClient.js"
import { batchBufferPathOf } from "../executors/common/EarlySpawn.js"
import { internalSecretEnv } from "../sidecar/InternalSecret.js"
import type { SidecarReady } from "../sidecar/SidecarProcess.js"
import { removeAbandonedFiles, runDirPrefix } from "./AbandonedFiles.js"
import { type Device, parseDevices } from "./Devices.js"
import { type ProcessState, SupervisedProcess } from "../process/SupervisedProcess.js"

const sidecarReadyPattern = /cornserve sidecar: ready (\{.*\})/
const encodeSettings = Schema.encodeSync(ExecutorSettings)
const executorReadyPattern = /executor: serving at (http:\/\/\S+)[\s\S]*executor: ready/

/**
 * How long the sidecar, and an executor (whose engine and worker load its model), may take to say
 * they are ready. A child that exits ends the wait at once; these bounds only catch a start that
 * hangs, so they allow for a slow or busy host, where a start that takes seconds on an idle one
 * takes minutes: a slow start is not a dead one.
 */
const sidecarStartTimeoutMs = 120_000
const executorStartTimeoutMs = 300_000

export interface ExecutorLaunch {
  readonly kind: "eric" | "geri" | "llm"
  readonly model: string
  readonly dtype?: string
  readonly devices: ReadonlyArray<Device>
  readonly settings: ExecutorSettings
  readonly onState?: (state: ProcessState<string>) => void
}

/**
 * What runs on one node: its device inventory, its sidecar, and the executor processes the task
 * managers ask for. Every process is a supervised child: restarted with backoff when it crashes,
 * stopped when the agent's scope closes. When the sidecar restarts, the executors' connections go
 * over to the new one; the data the old one held is lost, which `onSidecarLost` tells.
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
    let executorCount = 0
    let sidecarArena: string | undefined
    const sidecarLossListeners = new Set<() => void>()
    const sidecarWaiters = new Set<() => void>()
    /** The other nodes' sidecars (node name → host:port), as the control plane last told them. */
    let peers: Readonly<Record<string, string>> = {}
    let applyPeers = (): Promise<void> => Promise.resolve()

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
        String(config.sidecarArenaBytes),
        // A node of a cluster takes its peers' chunks on its own address; one machine alone keeps to loopback.
        ...(config.role === "all" ? [] : ["--peer-host", config.host])
      ],
      // What its peers prove in their handshake: in the environment, which other users cannot read.
      env: internalSecretEnv(config.internalSecret),
      parseReady: (output) => {
        const match = sidecarReadyPattern.exec(output)
        return match === null ? undefined : (JSON.parse(match[1]!) as SidecarReady)
      },
      startTimeoutMs: sidecarStartTimeoutMs,
      log,
      onState: (state) => {
        // A sidecar that was killed (crashed, or stopped past its grace) could not remove its arena
        // file; nothing else would. It has exited by then: the file is no one's.
        if ((state._tag === "Crashed" || state._tag === "Stopped") && sidecarArena !== undefined) {
          rmSync(sidecarArena, { force: true })
          sidecarArena = undefined
        }
        if (state._tag === "Crashed") for (const listener of sidecarLossListeners) listener()
        if (state._tag !== "Ready") return
        sidecarArena = state.ready.arenaPath
        for (const wake of sidecarWaiters) wake()
        // A sidecar that replaces one learns the peers its predecessor knew.
        if (Object.keys(peers).length > 0) void applyPeers()
      }
    })

    /**
     * The control plane's own connection to the sidecar: stats, and releasing what a cancelled
     * request left. Like the executors' connections, it goes over to a sidecar that replaces the
     * one it had; while none runs, its calls fail at once as unavailable, which every caller
     * expects of a sidecar.
     */
    const client = yield* Effect.acquireRelease(
      Effect.tryPromise(() => SidecarClient.connect(socketPath, { reconnectWaitMs: 0 })),
      (connected) => Effect.promise(() => connected.close())
    )
    const sidecarClient = (): Promise<SidecarClient> => Promise.resolve(client)

    applyPeers = () =>
      client.setPeers(peers).catch((error: unknown) => {
        log(`the sidecar did not take its peers: ${error instanceof Error ? error.message : String(error)}`)
      })

    /** Tells the sidecar where the other nodes' sidecars are (this node's own entry left out). */
    const setPeers = (next: Readonly<Record<string, string>>): Promise<void> => {
      const others = Object.fromEntries(Object.entries(next).filter(([name]) => name !== config.nodeId))
      const same =
        Object.keys(others).length === Object.keys(peers).length &&
        Object.entries(others).every(([name, address]) => peers[name] === address)
      if (same) return Promise.resolve()
      peers = others
      return applyPeers()
    }

    /** The TCP port the sidecar takes other nodes' chunks on, while it runs. */
    const sidecarPeerPort = (): number | undefined =>
      sidecar.state._tag === "Ready" ? sidecar.state.ready.peerPort : undefined

    /** Whether the sidecar runs, or is running again within `timeoutMs`. */
    const sidecarRunning = (timeoutMs: number): Promise<boolean> => {
      if (sidecar.state._tag === "Ready") return Promise.resolve(true)
      return new Promise((resolve) => {
        const settle = (running: boolean) => {
          clearTimeout(timer)
          sidecarWaiters.delete(wake)
          resolve(running)
        }
        const wake = () => settle(true)
        const timer = setTimeout(() => settle(false), timeoutMs)
        sidecarWaiters.add(wake)
      })
    }

    /** Calls `listener` each time the sidecar goes away, with whatever it held; returns the unsubscription. */
    const onSidecarLost = (listener: () => void): (() => void) => {
      sidecarLossListeners.add(listener)
      return () => sidecarLossListeners.delete(listener)
    }

    /**
     * Resolves `model` on this node before an executor starts with it: a hub model absent here is
     * downloaded now, with its progress told (a file's share at most once a second), so that the
     * executor's own start, which has a deadline, finds it on disk.
     */
    const prepareModel = (
      model: string,
      dtype: Dtype | undefined,
      onProgress: (message: string) => Effect.Effect<void>
    ) =>
      Effect.gen(function* () {
        const { benchModelNames, builtinModelNames, resolveModel } = yield* Effect.promise(
          () => import("../models/ModelStore.js")
        )
        // A recipe is built by the executor itself: building takes the CPU, and this process serves the gateway.
        if (builtinModelNames.includes(model) || benchModelNames.includes(model)) return
        const tell = (message: string) => Runtime.runFork(runtime)(onProgress(`model ${model}: ${message}`))
        let lastTold = 0
        const onDownload = (event: ModelDownloadEvent) => {
          if (event._tag === "Waiting") tell(`waiting for process ${event.pid}, which is downloading it`)
          if (event._tag === "Fetching") {
            const megabytes = (event.bytes / 1e6).toFixed(1)
            tell(`downloading ${event.files} file(s), ${megabytes} MB, dtype ${event.dtype}, into ${event.dir}`)
            Runtime.runFork(runtime)(Effect.logInfo(`downloading model ${model} into ${event.dir}`))
          }
          if (
            event._tag === "Progress" &&
            event.bytes > 0 &&
            event.total !== undefined &&
            Date.now() - lastTold >= 1_000
          ) {
            lastTold = Date.now()
            const share = event.overallTotal > 0 ? Math.floor((event.overallBytes / event.overallTotal) * 100) : 100
            tell(`${event.file} ${Math.floor((event.bytes / event.total) * 100)}% (all files ${share}%)`)
          }
          if (event._tag === "Verified") tell(`${event.file} is in place (${event.check} checked)`)
        }
        return yield* Effect.tryPromise({
          try: () => resolveModel(model, { dtype, onProgress: onDownload }),
          catch: (error) => (error instanceof Error ? error : new Error(String(error)))
        })
      })

    const startExecutor = (launch: ExecutorLaunch): Effect.Effect<SupervisedProcess<string>, Error, Scope.Scope> =>
      SupervisedProcess.start<string>({
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
          // A node of a cluster serves its executors to the control plane on its own address.
          ...(config.role === "data-plane" ? ["--host", config.host] : []),
          ...(launch.dtype === undefined ? [] : ["--dtype", launch.dtype]),
          "--settings",
          JSON.stringify(encodeSettings(launch.settings))
        ],
        // What the control plane's calls carry: in the environment, which other users cannot read.
        env: internalSecretEnv(config.internalSecret),
        parseReady: (output) => executorReadyPattern.exec(output)?.[1],
        startTimeoutMs: executorStartTimeoutMs,
        // The engine's batch buffer, which a router killed outright leaves behind.
        leaves: (pid) => [batchBufferPathOf(pid)],
        log,
        ...(launch.onState === undefined ? {} : { onState: launch.onState })
      })

    return {
      nodeId: config.nodeId,
      devices,
      socketPath,
      sidecar,
      sidecarClient,
      sidecarPeerPort,
      setPeers,
      sidecarRunning,
      onSidecarLost,
      prepareModel,
      startExecutor
    }
  })
}) {}
