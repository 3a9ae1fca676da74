import { type ChildProcess, spawn } from "node:child_process"
import { readdirSync, statSync } from "node:fs"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { bundleScript } from "../../support/bundle.js"
import { arenaFilePrefix } from "../../../src/sidecar/Arena.js"
import { type RunningSidecar, startSidecar, type StartSidecarOptions } from "../../../src/sidecar/SidecarProcess.js"
import { SidecarClient } from "../../../src/sidecar/SidecarClient.js"
import { binPath, eventually, repoRoot } from "../../support/platform.js"
import { reaperActive, trackGroup, trackPath, trackSharedMemoryPrefix } from "../../support/reaper/registry.js"

/**
 * Real sidecar processes (`bin/cornserve internal sidecar`) and executor processes for the sidecar
 * tests. Arena files get a prefix naming this test process, so a test file can check that it left
 * none behind while other files run beside it.
 */

export const MiB = 1024 * 1024

const shmDir = "/dev/shm"
const testArenaPrefix = `${arenaFilePrefix}test-${process.pid}-`

/** The sidecar runs from dist/: a test run after editing src/ without building would test old code. */
const checkBuildIsFresh = () => {
  const sources = [
    ...readdirSync(join(repoRoot, "src/sidecar")).map((file) => [
      `src/sidecar/${file}`,
      `dist/sidecar/${file.replace(/\.ts$/, ".js")}`
    ]),
    ["src/cli/main.ts", "dist/cli/main.js"]
  ]
  for (const [source, built] of sources) {
    const builtTime = (() => {
      try {
        return statSync(join(repoRoot, built!)).mtimeMs
      } catch {
        return 0
      }
    })()
    if (statSync(join(repoRoot, source!)).mtimeMs > builtTime)
      throw new Error(`${built} is older than ${source}: run npm run build first`)
  }
}

let bundled: Promise<string> | undefined

/** test/sidecar/support/executor.ts, bundled once, so that a child can run it with plain node. */
const executorScript = () => {
  // Under node_modules so that the bundle's external imports resolve; stopAll removes it.
  if (bundled === undefined) {
    const outfile = join(repoRoot, "node_modules/.cache/cornserve-test", `sidecar-executor-${process.pid}.mjs`)
    trackPath(outfile)
    bundled = bundleScript(join(repoRoot, "test/sidecar/support/executor.ts"), outfile)
  }
  return bundled
}

export interface TestSidecars {
  start(nodeId: string, options?: Partial<StartSidecarOptions>): Promise<RunningSidecar>
  /** Stops every sidecar started here; removes the socket directory and the executor bundle. */
  stopAll(): Promise<void>
}

export const testSidecars = async (): Promise<TestSidecars> => {
  checkBuildIsFresh()
  const socketDir = await mkdtemp(join(tmpdir(), "cornserve-sidecar-"))
  // The sidecars stop with this worker (their stdin is their lifeline); what they leave, and what
  // a SIGKILL leaves, the test run's reaper removes once this worker is gone.
  trackPath(socketDir)
  trackSharedMemoryPrefix(testArenaPrefix)
  const running: Array<RunningSidecar> = []
  return {
    start: async (nodeId, options = {}) => {
      const sidecar = await startSidecar({
        binPath,
        nodeId,
        socketPath: join(socketDir, `${nodeId}.sock`),
        arenaPath: join(shmDir, `${testArenaPrefix}${nodeId}`),
        arenaBytes: 64 * MiB,
        peerHost: "127.0.0.1",
        ...options
      })
      running.push(sidecar)
      return sidecar
    },
    stopAll: async () => {
      await Promise.all(running.map((sidecar) => sidecar.stop()))
      await rm(socketDir, { recursive: true, force: true })
      if (bundled !== undefined) await rm(await bundled, { force: true })
      bundled = undefined
    }
  }
}

/** Two sidecars standing for two nodes, each told of the other's peer port, once their link is up. */
export const linkedPair = async (
  sidecars: TestSidecars,
  optionsA: Partial<StartSidecarOptions>,
  optionsB: Partial<StartSidecarOptions>
) => {
  const [nodeA, nodeB] = await Promise.all([sidecars.start("node-a", optionsA), sidecars.start("node-b", optionsB)])
  const onA = await SidecarClient.connect(nodeA.socketPath)
  const onB = await SidecarClient.connect(nodeB.socketPath)
  // Ports are known only once both run, as when the node agent learns of a node joining.
  await onA.setPeers({ "node-b": `127.0.0.1:${nodeB.peerPort}` })
  await onB.setPeers({ "node-a": `127.0.0.1:${nodeA.peerPort}` })
  await eventually(async () =>
    (await onA.stats()).peersConnected === 1 && (await onB.stats()).peersConnected === 1 ? true : undefined
  )
  return { nodeA, nodeB, onA, onB }
}

/** Arena files of this test process still in /dev/shm. */
export const leftoverArenas = () => readdirSync(shmDir).filter((file) => file.startsWith(testArenaPrefix))

export interface ExecutorProcess {
  readonly process: ChildProcess
  /** Resolves with the first line it prints that starts with `prefix`. */
  line(prefix: string): Promise<string>
  exited: Promise<number | null>
}

/** Starts an executor process that runs one scenario of support/executor.ts against a sidecar. */
export const startExecutor = async (args: ReadonlyArray<string>): Promise<ExecutorProcess> => {
  const child = spawn(process.execPath, [await executorScript(), ...args], {
    cwd: repoRoot,
    stdio: ["ignore", "pipe", "pipe"],
    // A group of its own, which the test run's reaper kills if this worker goes without ending it.
    detached: reaperActive()
  })
  trackGroup(child)
  let output = ""
  const listeners = new Set<() => void>()
  child.stdout!.on("data", (chunk: Buffer) => {
    output += chunk.toString()
    for (const listener of listeners) listener()
  })
  child.stderr!.on("data", (chunk: Buffer) => (output += chunk.toString()))
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)))
  return {
    process: child,
    exited,
    line: (prefix) =>
      new Promise((resolve, reject) => {
        const check = () => {
          const found = output.split("\n").find((line) => line.startsWith(prefix))
          if (found === undefined) return
          listeners.delete(check)
          resolve(found)
        }
        listeners.add(check)
        check()
        void exited.then((code) =>
          reject(new Error(`the executor exited (${code}) before printing "${prefix}":\n${output}`))
        )
      })
  }
}
