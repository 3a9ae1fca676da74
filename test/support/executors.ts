import { type ChildProcess, spawn } from "node:child_process"
import { readdirSync, readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { binPath, repoRoot } from "./platform.js"
import { credentialHeaders } from "../../src/control/executor-calls/ExecutorHttp.js"
import { internalSecretEnv } from "../../src/sidecar/InternalSecret.js"
import { reaperActive, trackGroup } from "./reaper/registry.js"

export interface RunningProcess {
  readonly process: ChildProcess
  output(): string
  stop(): Promise<void>
}

/** Starts `cornserve internal ...` and resolves once its output matches `ready`. */
export const startInternal = (args: ReadonlyArray<string>, ready: RegExp, env: Readonly<Record<string, string>> = {}) =>
  new Promise<RunningProcess & { readonly match: RegExpExecArray }>((resolve, reject) => {
    const child = spawn(process.execPath, [binPath, "internal", ...args], {
      cwd: repoRoot,
      env: { ...process.env, ...env },
      stdio: ["ignore", "pipe", "pipe"],
      // A group of its own, which the test run's reaper kills if this worker goes without stopping it.
      detached: reaperActive()
    })
    trackGroup(child)
    let output = ""
    const exited = new Promise<void>((done) => child.once("exit", () => done()))
    // Not ready in time: the caller gets no handle to stop it, so it is stopped here.
    const timer = setTimeout(() => {
      child.kill("SIGTERM")
      reject(new Error(`cornserve internal ${args[0]} did not get ready:\n${output}`))
    }, 90_000)
    const onData = (chunk: Buffer) => {
      output += chunk.toString()
      const match = ready.exec(output)
      if (match !== null) {
        clearTimeout(timer)
        resolve({
          process: child,
          match,
          output: () => output,
          stop: async () => {
            if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM")
            await exited
          }
        })
      }
    }
    child.stdout!.on("data", onData)
    child.stderr!.on("data", onData)
    child.once("exit", (code) => {
      clearTimeout(timer)
      reject(new Error(`cornserve internal ${args[0]} exited with ${code}:\n${output}`))
    })
  })

export const startSidecar = async (
  nodeId: string,
  env: Readonly<Record<string, string>> = {},
  arenaBytes = 64 * 1024 * 1024,
  /** More flags: its peer port and peers, say. */
  extra: ReadonlyArray<string> = []
) => {
  const socket = join(tmpdir(), `cornserve-test-${nodeId}-${process.pid}-${Date.now()}.sock`)
  const running = await startInternal(
    ["sidecar", "--node-id", nodeId, "--socket", socket, "--arena-bytes", String(arenaBytes), ...extra],
    /sidecar: ready/,
    env
  )
  return { ...running, socket, nodeId }
}

/** The internal secret executors started by `startExecutor` take calls with, unless given another. */
export const executorSecret = "cornserve-test-internal-secret"

/** The headers of a call to an executor started by `startExecutor`. */
export const executorHeaders = (headers: Record<string, string> = {}): Record<string, string> => ({
  ...credentialHeaders(executorSecret),
  ...headers
})

export const startExecutor = async (args: ReadonlyArray<string>, env: Readonly<Record<string, string>> = {}) => {
  const running = await startInternal(
    ["executor", "--port", "0", ...args],
    /executor: serving at (http:\/\/\S+)[\s\S]*executor: ready/,
    // The internal secret, as the node agent gives it (unless the caller gives its own).
    { ...internalSecretEnv(executorSecret), ...env }
  )
  return { ...running, url: running.match[1]! }
}

/** The live processes of process group `group`, zombies left out. */
export const groupMembers = (group: number): Array<number> =>
  readdirSync("/proc")
    .filter((entry) => /^\d+$/.test(entry))
    .flatMap((entry) => {
      try {
        const fields = readFileSync(`/proc/${entry}/stat`, "utf8").split(") ")[1]!.split(" ")
        return fields[0] !== "Z" && Number(fields[2]) === group ? [Number(entry)] : []
      } catch {
        return []
      }
    })

/** Every process below `pid`, children first. */
export const descendants = (pid: number): Array<{ readonly pid: number; readonly command: string }> => {
  const all = readdirSync("/proc")
    .filter((entry) => /^\d+$/.test(entry))
    .flatMap((entry) => {
      try {
        const parent = Number(readFileSync(`/proc/${entry}/stat`, "utf8").split(") ")[1]!.split(" ")[1])
        return [
          { pid: Number(entry), parent, command: readFileSync(`/proc/${entry}/cmdline`, "utf8").replaceAll("\0", " ") }
        ]
      } catch {
        return []
      }
    })
  const below = (root: number): Array<{ pid: number; command: string }> =>
    all
      .filter((entry) => entry.parent === root)
      .flatMap((entry) => [{ pid: entry.pid, command: entry.command }, ...below(entry.pid)])
  return below(pid)
}
