import { type ChildProcess, spawn } from "node:child_process"
import { lstatSync, readdirSync } from "node:fs"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { binPath, eventually, invoke, repoRoot, runCli } from "../support/platform.js"
import { groupMembers } from "../support/executors.js"
import { trackGroup, trackPath } from "../support/reaper/registry.js"

/** Starting the platform, building the tiny embedder and deploying its executor, on a busy machine. */
const startLimitMs = 240_000
/** The platform's `--shutdown-grace`: what the requests in flight get to finish. */
const shutdownGraceS = 10
/** How long every process of the platform may take to exit once the requests in flight are answered. */
const exitBoundMs = 10_000

/** A platform in a process group of its own, as a terminal's foreground job is. */
interface GroupPlatform {
  readonly process: ChildProcess
  readonly url: string
  readonly stateDir: string
  readonly nodeId: string
  readonly exited: Promise<{ readonly code: number | null; readonly signal: NodeJS.Signals | null }>
  output(): string
}

/**
 * The environment `serve` starts with: the test's own, less what the test setup adds for its own
 * ONNX Runtime sessions (the platform's default is under test), with a cache dir of its own, where
 * ONNX Runtime's telemetry would keep its files.
 */
const platformEnv = (modelDir: string, cacheDir: string): NodeJS.ProcessEnv => {
  const { ORT_DISABLE_TELEMETRY: _set, ...env } = process.env
  return { ...env, CORNSERVE_MODEL_DIR: modelDir, XDG_CACHE_HOME: cacheDir }
}

const startInGroup = async (nodeId: string, modelDir: string, cacheDir: string): Promise<GroupPlatform> => {
  const stateDir = await mkdtemp(join(tmpdir(), "cornserve-test-"))
  trackPath(stateDir)
  const child = spawn(
    process.execPath,
    [
      binPath,
      "serve",
      "--port",
      "0",
      "--state-dir",
      stateDir,
      "--devices",
      "cpu:0,cpu:1",
      "--node-id",
      nodeId,
      "--shutdown-grace",
      String(shutdownGraceS)
    ],
    {
      cwd: repoRoot,
      env: platformEnv(modelDir, cacheDir),
      stdio: ["ignore", "pipe", "pipe"],
      detached: true
    }
  )
  trackGroup(child)
  let output = ""
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once("exit", (code, signal) => resolve({ code, signal }))
  )
  const url = await new Promise<string>((resolve, reject) => {
    const onData = (chunk: Buffer) => {
      output += chunk.toString()
      const match = /serving at (https?:\/\/\S+)/.exec(output)
      if (match !== null) resolve(match[1]!)
    }
    child.stdout!.on("data", onData)
    child.stderr!.on("data", onData)
    child.once("exit", (code) => reject(new Error(`cornserve serve exited with ${code} before listening:\n${output}`)))
  })
  return { process: child, url, stateDir, nodeId, exited, output: () => output }
}

/**
 * Every pid the group has had since `watch` began: executors and sidecars a restart would start
 * anew included, as long as they live a tenth of a second.
 */
const watchGroup = (group: number) => {
  const seen = new Set<number>(groupMembers(group))
  const timer = setInterval(() => {
    for (const pid of groupMembers(group)) seen.add(pid)
  }, 100)
  return {
    seen,
    stop: () => {
      clearInterval(timer)
      for (const pid of groupMembers(group)) seen.add(pid)
    }
  }
}

/**
 * Names in `dir` that are not in `before` and are the platform's: a `cornserve-` name with its node
 * id, or any name with one of `pids` (as `-<pid>`, followed by `-`, `.` or the end; whoever made it,
 * ONNX Runtime's `mat-debug-<pid>.log` included).
 */
const newFilesOf = (dir: string, before: ReadonlySet<string>, pids: ReadonlySet<number>, nodeId: string) =>
  readdirSync(dir).filter(
    (name) =>
      !before.has(name) &&
      ((name.startsWith("cornserve-") && name.includes(nodeId)) ||
        [...name.matchAll(/-(\d+)(?=[-.]|$)/g)].some((match) => pids.has(Number(match[1]))))
  )

/** What a stopped platform may leave in its state dir: none of its run files (lock, sockets). */
const runFilesIn = (dir: string): Array<string> =>
  readdirSync(dir, { recursive: true, encoding: "utf8" }).filter((name) => {
    const stat = lstatSync(join(dir, name))
    return stat.isSocket() || stat.isFIFO() || name.endsWith(".pid") || name.endsWith(".sock")
  })

/** A countdown of `from` lines, 400 ms apart, resolved once its first line is in: in flight. */
const countdownInFlight = async (url: string, from: number) => {
  const response = await invoke(url, "countdown", JSON.stringify({ from, intervalMs: 400 }))
  expect(response.status).toBe(200)
  const reader = response.body!.getReader()
  const decoder = new TextDecoder()
  let text = decoder.decode((await reader.read()).value)
  const rest = (async () => {
    try {
      for (;;) {
        const { done, value } = await reader.read()
        if (done) return text
        text += decoder.decode(value)
      }
    } catch (error) {
      return `${text}(cut: ${String(error)})`
    }
  })()
  return { first: text, rest }
}

let embedCount = 0
/** A text no earlier request had: the platform's embedding cache does not answer it. */
const embedRequest = () => JSON.stringify({ input: [`Request ${embedCount++} asks whether it is warm outside.`] })

/** What a client got: an answer, or an error the platform gave (a status and an error body). */
const embedOutcome = async (url: string) => {
  try {
    const response = await invoke(url, "text_embed", embedRequest())
    return { status: response.status, body: await response.text() }
  } catch (error) {
    return { status: 0, body: String(error) }
  }
}

describe.each([
  { how: "SIGINT to its process group (a terminal's Ctrl-C)", signal: "SIGINT", toGroup: true },
  { how: "SIGTERM to its main process alone", signal: "SIGTERM", toGroup: false }
] as const)("cornserve serve stopped with $how", ({ signal, toGroup }) => {
  let modelDir: string
  let cacheDir: string
  let platform: GroupPlatform | undefined

  beforeAll(async () => {
    modelDir = await mkdtemp(join(tmpdir(), "cornserve-models-"))
    trackPath(modelDir)
    cacheDir = await mkdtemp(join(tmpdir(), "cornserve-cache-"))
    trackPath(cacheDir)
  })

  afterAll(async () => {
    if (platform !== undefined && platform.process.exitCode === null && platform.process.signalCode === null) {
      process.kill(-platform.process.pid!, "SIGKILL")
      await platform.exited
    }
    if (platform !== undefined) await rm(platform.stateDir, { recursive: true, force: true })
    await rm(modelDir, { recursive: true, force: true })
    await rm(cacheDir, { recursive: true, force: true })
  })

  it(
    "answers the requests in flight, restarts nothing, and leaves no process nor file behind",
    async () => {
      const sharedMemoryBefore = new Set(readdirSync("/dev/shm"))
      const tmpBefore = new Set(readdirSync(tmpdir()))
      const nodeId = `stop-${toGroup ? "group" : "main"}-${process.pid}`
      platform = await startInGroup(nodeId, modelDir, cacheDir)
      const { url } = platform
      const group = platform.process.pid!
      for (const app of ["text_embed", "countdown"]) {
        const registered = await runCli(["app", "register", join(repoRoot, "examples", `${app}.ts`)], {
          CORNSERVE_GATEWAY_URL: url
        })
        expect(registered.code, registered.stderr).toBe(0)
      }
      // text_embed's executor is up once a call is answered.
      await eventually(async () => ((await embedOutcome(url)).status === 200 ? true : undefined), startLimitMs)
      const members = watchGroup(group)
      // serve, its sidecar, and text_embed's executor of three processes (and the apps' own).
      expect(members.seen.size).toBeGreaterThanOrEqual(1 + 1 + 3)

      const embeds = Array.from({ length: 3 }, () => embedOutcome(url))
      const countdown = await countdownInFlight(url, 6)
      expect(JSON.parse(countdown.first)).toEqual({ count: 6, done: false })

      process.kill(toGroup ? -group : group, signal)
      const answers = await Promise.all([countdown.rest, ...embeds])
      const answeredAt = Date.now()

      // The request in flight ran to its end; the others were answered, or told why not.
      expect(answers[0]!.trim().split("\n").at(-1)).toBe(JSON.stringify({ count: 1, done: true }))
      for (const embed of answers.slice(1) as Array<{ status: number; body: string }>) {
        if (embed.status !== 200) expect(JSON.parse(embed.body), embed.body).toHaveProperty("error.code")
        expect(embed.status, embed.body).not.toBe(0)
      }

      const exit = await Promise.race([
        platform.exited,
        new Promise<"still running">((resolve) => setTimeout(() => resolve("still running"), exitBoundMs).unref())
      ])
      expect(exit, platform.output()).toEqual({ code: 0, signal: null })
      const left = await eventually(
        async () => (groupMembers(group).length === 0 ? [] : undefined),
        Math.max(0, exitBoundMs - (Date.now() - answeredAt))
      ).catch(() => groupMembers(group))
      members.stop()
      expect(left).toEqual([])
      expect(Date.now() - answeredAt).toBeLessThanOrEqual(exitBoundMs)

      expect(platform.output()).not.toMatch(/restarting/)
      expect(newFilesOf("/dev/shm", sharedMemoryBefore, members.seen, nodeId)).toEqual([])
      expect(newFilesOf(tmpdir(), tmpBefore, members.seen, nodeId)).toEqual([])
      expect(runFilesIn(platform.stateDir)).toEqual([])
      // Nor anything of ONNX Runtime's telemetry: no events nor device id kept for an upload.
      expect(readdirSync(cacheDir)).toEqual([])
    },
    startLimitMs + 120_000
  )
})
