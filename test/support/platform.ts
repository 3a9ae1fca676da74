import { type ChildProcess, execFile, spawn } from "node:child_process"
import { readdirSync, readFileSync } from "node:fs"
import { mkdtemp, rm } from "node:fs/promises"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { reaperActive, trackGroup, trackPath } from "./reaper/registry.js"

export const repoRoot = fileURLToPath(new URL("../../", import.meta.url))

/** The admin token the test run's platforms and CLI commands share (set by test/support/testEnv.ts). */
export const testAdminToken = "cornserve-test-admin-token"

/** Headers of an admin request (and a /metrics read) with the test run's token. */
export const adminHeaders = (headers: Record<string, string> = {}): Record<string, string> => ({
  authorization: `Bearer ${testAdminToken}`,
  ...headers
})
export const binPath = join(repoRoot, "bin", "cornserve")

export interface RunningPlatform {
  readonly url: string
  readonly process: ChildProcess
  readonly stateDir: string
  /** Everything the platform printed so far. */
  output(): string
  /** SIGTERM, then the exit code once it is gone. */
  stop(): Promise<number | null>
  /** SIGKILL: the way a crash ends it. */
  kill(): Promise<void>
}

export const makeStateDir = () => mkdtemp(join(tmpdir(), "cornserve-test-"))

/**
 * How long `serve` may take to listen, and each executor to start, on a slow or busy two-core
 * host (the CI machine, or this one with the suite's other files beside it): a bound that waits for
 * a platform and N executors allows `platformStartMs + N × executorStartMs`.
 */
export const platformStartMs = 60_000
export const executorStartMs = 45_000

/** The time to allow for a platform's start and then `executors` executors' (see `executorStartMs`). */
export const readyWithin = (executors: number) => platformStartMs + executors * executorStartMs

/**
 * Starts the real binary on a free port and resolves once its gateway listens (within
 * `platformStartMs`) and `ready`, if given, has resolved. A start that fails or runs out of time
 * kills the `serve` it started and waits for its exit before it throws, so that the next start on
 * the same state dir is not refused for a `serve` still holding it.
 */
export const startPlatform = async (
  options: {
    readonly args?: ReadonlyArray<string>
    readonly env?: Readonly<Record<string, string>>
    readonly stateDir?: string
    /** What else the start waits for once the gateway listens (an app ready, its executors healthy). */
    readonly ready?: (platform: RunningPlatform) => Promise<unknown>
  } = {}
): Promise<RunningPlatform> => {
  const ownStateDir = options.stateDir === undefined
  const stateDir = options.stateDir ?? (await makeStateDir())
  if (ownStateDir) trackPath(stateDir)
  const child = spawn(
    process.execPath,
    [binPath, "serve", "--port", "0", "--state-dir", stateDir, ...(options.args ?? [])],
    {
      cwd: repoRoot,
      env: { ...process.env, ...options.env },
      stdio: ["ignore", "pipe", "pipe"],
      // A group of its own (it and the sidecars and executors it starts), which the test run's
      // reaper kills if this worker goes without stopping it: `serve` does not watch its parent.
      detached: reaperActive()
    }
  )
  trackGroup(child)
  let output = ""
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)))
  const kill = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL")
    await exited
  }
  const failed = async (error: unknown): Promise<never> => {
    await kill()
    if (ownStateDir) await rm(stateDir, { recursive: true, force: true })
    throw error
  }
  let listenTimer: NodeJS.Timeout | undefined
  const url = await new Promise<string>((resolve, reject) => {
    const onData = (chunk: Buffer) => {
      output += chunk.toString()
      const match = /serving at (https?:\/\/\S+)/.exec(output)
      if (match !== null) resolve(match[1]!)
    }
    child.stdout!.on("data", onData)
    child.stderr!.on("data", onData)
    child.once("exit", (code) => reject(new Error(`cornserve serve exited with ${code} before listening:\n${output}`)))
    listenTimer = setTimeout(
      () => reject(new Error(`cornserve serve did not listen within ${platformStartMs} ms:\n${output}`)),
      platformStartMs
    )
  })
    .finally(() => clearTimeout(listenTimer))
    .catch(failed)
  const platform: RunningPlatform = {
    url,
    process: child,
    stateDir,
    output: () => output,
    stop: async () => {
      if (child.exitCode === null) child.kill("SIGTERM")
      return exited
    },
    kill
  }
  if (options.ready !== undefined)
    await options
      .ready(platform)
      .catch((error: unknown) =>
        failed(
          new Error(
            `${error instanceof Error ? error.message : String(error)}; the platform printed:\n${output.slice(-8_000)}`
          )
        )
      )
  return platform
}

/** The cluster port a control plane started with `--cluster-port 0` bound, once it says so. */
export const boundClusterPort = (platform: RunningPlatform): Promise<number> =>
  eventually(async () => {
    const port = /cluster port open on \S+:(\d+)/.exec(platform.output())?.[1]
    return port === undefined ? undefined : Number(port)
  })

/** Waits until the platform at `url` says app `appId` is ready, allowing for its `executors` to start. */
export const appReady = (url: string, appId: string, executors: number) =>
  eventually(
    async () => ((await appState(url, appId)) === "ready" ? true : undefined),
    readyWithin(executors),
    `app ${appId} ready`
  )

export const removeStateDir = (dir: string) => rm(dir, { recursive: true, force: true })

export interface CliResult {
  readonly code: number
  readonly stdout: string
  readonly stderr: string
}

/**
 * Runs `cornserve ARGS` as a user would, against the given gateway. It is killed after
 * `timeoutMs`: by default time for a command that starts a few executors (`app register`).
 */
export const runCli = (
  args: ReadonlyArray<string>,
  env: Readonly<Record<string, string>> = {},
  input?: string,
  timeoutMs = readyWithin(4)
) =>
  new Promise<CliResult>((resolve) => {
    const child = execFile(
      process.execPath,
      [binPath, ...args],
      { cwd: repoRoot, env: { ...process.env, ...env }, timeout: timeoutMs },
      (error, stdout, stderr) =>
        resolve({ code: error === null ? 0 : typeof error.code === "number" ? error.code : 1, stdout, stderr })
    )
    // A command that exits before it reads its input (a usage error) makes the write fail with
    // EPIPE; its exit code and output are the result.
    child.stdin!.on("error", () => undefined)
    if (input !== undefined) child.stdin!.end(input)
    else child.stdin!.end()
  })

/**
 * Polls until `check` holds (or throws after `timeoutMs`, naming `what` it waited for). A wait for
 * executors to start passes a bound from `readyWithin`.
 */
export const eventually = async <A>(
  check: () => Promise<A | undefined>,
  timeoutMs = 30_000,
  what = "condition"
): Promise<A> => {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const value = await check().catch(() => undefined)
    if (value !== undefined) return value
    if (Date.now() > deadline) throw new Error(`${what} not met in ${timeoutMs} ms`)
    await new Promise((resolve) => setTimeout(resolve, 100))
  }
}

export const appState = async (url: string, appId: string): Promise<string | undefined> => {
  const response = await fetch(`${url}/app/list`)
  const { apps } = (await response.json()) as { apps: Array<{ id: string; state: string }> }
  return apps.find((app) => app.id === appId)?.state
}

/**
 * POSTs an app's registration to /app/register and reads the whole SSE answer, with the test run's
 * admin token, another `token`, or none (`null`).
 */
export const registerRaw = async (url: string, body: unknown, token: string | null = testAdminToken) => {
  const response = await fetch(`${url}/app/register`, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      ...(token === null ? {} : { authorization: `Bearer ${token}` })
    },
    body: JSON.stringify(body)
  })
  const text = await response.text()
  return { status: response.status, contentType: response.headers.get("content-type") ?? "", text }
}

export const invoke = (url: string, appId: string, body: string) =>
  fetch(`${url}/app/invoke/${appId}`, { method: "POST", headers: { "content-type": "application/json" }, body })

/** The processes whose parent is `pid` (the platform's children: esbuild's helper, executors). */
export const childPids = (pid: number): Array<number> =>
  readdirSync("/proc")
    .filter((entry) => /^\d+$/.test(entry))
    .filter((entry) => {
      try {
        return Number(readFileSync(`/proc/${entry}/stat`, "utf8").split(") ")[1]!.split(" ")[1]) === pid
      } catch {
        return false
      }
    })
    .map(Number)

/** Running, as opposed to gone or exited and waiting to be reaped (a zombie). */
export const isAlive = (pid: number) => {
  try {
    return readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ")[0] !== "Z"
  } catch {
    return false
  }
}

/** A port nobody listens on at `host` now (for a process that must come back on the same one). */
export const freePort = (host = "127.0.0.1") =>
  new Promise<number>((resolve, reject) => {
    const server = createServer()
    server.once("error", reject)
    server.listen(0, host, () => {
      const { port } = server.address() as { port: number }
      server.close(() => resolve(port))
    })
  })

/** The arguments of `cornserve serve --role data-plane` joining `join` as `name` on a free port, then `extra`. */
export const dataPlaneArgs = (join: string, name: string, devices: string, extra: ReadonlyArray<string> = []) => [
  binPath,
  "serve",
  "--role",
  "data-plane",
  "--join",
  join,
  "--node-name",
  name,
  "--port",
  "0",
  "--devices",
  devices,
  ...extra
]
