import { type ChildProcess, spawn } from "node:child_process"
import { freshSecret } from "../contracts/Credentials.js"
import { lifelineEnv } from "../process/Lifeline.js"
import { internalSecretEnv } from "./InternalSecret.js"

/**
 * Starting a sidecar as a child process (`cornserve internal sidecar`), the way the node agent
 * does, and the line by which the sidecar says it is ready.
 */

export interface SidecarReady {
  readonly nodeId: string
  readonly socketPath: string
  readonly peerPort: number
  readonly arenaPath: string
  readonly arenaBytes: number
}

const readyPrefix = "cornserve sidecar: ready "

export const formatReadyLine = (ready: SidecarReady) => `${readyPrefix}${JSON.stringify(ready)}`

const parseReadyLine = (line: string): SidecarReady | undefined =>
  line.startsWith(readyPrefix) ? (JSON.parse(line.slice(readyPrefix.length)) as SidecarReady) : undefined

export interface StartSidecarOptions {
  /** The cornserve binary (bin/cornserve). */
  readonly binPath: string
  readonly nodeId: string
  readonly socketPath: string
  readonly arenaBytes: number
  readonly arenaPath?: string
  readonly peerHost?: string
  /** 0 (the default) picks a free port. */
  readonly peerPort?: number
  /** node id → host:port */
  readonly peers?: Readonly<Record<string, string>>
  readonly ttlSeconds?: number
  readonly peerTimeoutSeconds?: number
  readonly startTimeoutMs?: number
  /**
   * The internal secret its peers prove. By default one secret shared by every sidecar this
   * process starts, so that they link with each other and with nothing else.
   */
  readonly secret?: string
}

let ownSecret: string | undefined
/** The secret of the sidecars this process starts without one. */
const sharedSecret = (): string => (ownSecret ??= freshSecret())

export interface RunningSidecar extends SidecarReady {
  readonly process: ChildProcess
  /** Everything it printed so far. */
  output(): string
  /** SIGTERM, then its exit code once it is gone. */
  stop(): Promise<number | null>
}

const sidecarArgs = (options: StartSidecarOptions): Array<string> => {
  const args = [
    "internal",
    "sidecar",
    "--node-id",
    options.nodeId,
    "--socket",
    options.socketPath,
    "--arena-bytes",
    String(options.arenaBytes)
  ]
  if (options.arenaPath !== undefined) args.push("--arena-path", options.arenaPath)
  if (options.peerHost !== undefined) args.push("--peer-host", options.peerHost)
  if (options.peerPort !== undefined) args.push("--peer-port", String(options.peerPort))
  const peers = Object.entries(options.peers ?? {}).map(([node, address]) => `${node}=${address}`)
  if (peers.length > 0) args.push("--peers", peers.join(","))
  if (options.ttlSeconds !== undefined) args.push("--ttl", String(options.ttlSeconds))
  if (options.peerTimeoutSeconds !== undefined) args.push("--peer-timeout", String(options.peerTimeoutSeconds))
  return args
}

/** Spawns a sidecar and resolves once it is ready; rejects with its output if it fails to start. */
export const startSidecar = async (options: StartSidecarOptions): Promise<RunningSidecar> => {
  const child = spawn(process.execPath, [options.binPath, ...sidecarArgs(options)], {
    // Its stdin is its lifeline: the sidecar stops with the process that started it.
    stdio: ["pipe", "pipe", "pipe"],
    env: lifelineEnv({ ...process.env, ...internalSecretEnv(options.secret ?? sharedSecret()) })
  })
  let output = ""
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)))
  const timeoutMs = options.startTimeoutMs ?? 30_000
  const ready = await new Promise<SidecarReady>((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill("SIGKILL")
      reject(new Error(`the sidecar of node ${options.nodeId} was not ready within ${timeoutMs} ms:\n${output}`))
    }, timeoutMs)
    let pendingLine = ""
    child.stdout!.on("data", (chunk: Buffer) => {
      output += chunk.toString()
      pendingLine += chunk.toString()
      const lines = pendingLine.split("\n")
      pendingLine = lines.pop()!
      for (const line of lines) {
        const parsed = parseReadyLine(line)
        if (parsed === undefined) continue
        clearTimeout(timer)
        resolve(parsed)
      }
    })
    child.stderr!.on("data", (chunk: Buffer) => (output += chunk.toString()))
    child.once("exit", (code, signal) => {
      clearTimeout(timer)
      reject(
        new Error(`the sidecar of node ${options.nodeId} exited (${signal ?? code}) before it was ready:\n${output}`)
      )
    })
  })
  return {
    ...ready,
    process: child,
    output: () => output,
    stop: async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM")
      return exited
    }
  }
}
