import { mkdtemp, readFile, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Exit, Scope } from "effect"
import { afterEach, beforeAll, describe, expect, it } from "vitest"
import type * as ThreadPoolModule from "../../../src/executors/common/ThreadPool.js"
import { builtModuleUrl } from "../../support/builtModules.js"
import { eventually, isAlive } from "../../support/platform.js"

/**
 * The router's preprocessing threads, from dist/ (a worker thread runs JavaScript): the module
 * their jobs come from is written here, with jobs that end their own thread in each way a thread
 * dies (it exits, it throws where nobody catches, it runs out of heap), and one that starts a
 * decoder's child process.
 */

const threadJob = builtModuleUrl("src/executors/common/ThreadJob.ts")
const mediaProcess = builtModuleUrl("src/executors/common/media/MediaProcess.ts")

/** The jobs: each a function of its input, run in a thread. */
const jobsModule = `data:text/javascript,${encodeURIComponent(`
import { threadId } from "node:worker_threads"
import { currentJob } from ${JSON.stringify(threadJob)}
import { runBounded } from ${JSON.stringify(mediaProcess)}
let cancelled = 0
export const echo = (input) => ({ input, thread: threadId })
export const exit = (code) => process.exit(code)
export const throwLater = (message) => new Promise(() => setTimeout(() => { throw new Error(message) }, 0))
export const exhaustHeap = () => { const kept = []; for (;;) kept.push(new Array(1e6).fill(kept.length)) }
export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
export const waitForCancel = () => new Promise((resolve) => currentJob().signal.addEventListener("abort", () => { cancelled++; resolve("cancelled") }))
export const cancelledCount = () => cancelled
export const silentChild = (pidFile) => runBounded("sh", ["-c", \`echo $$ > \${pidFile}; exec sleep 60\`], { timeoutMs: 120000, maxStdoutBytes: 1 }, () => undefined)
`)}`

describe("ThreadPool", () => {
  let pools: typeof ThreadPoolModule
  let scope: Scope.CloseableScope | undefined

  beforeAll(async () => {
    builtModuleUrl("src/executors/common/ThreadPoolWorker.ts")
    pools = (await import(builtModuleUrl("src/executors/common/ThreadPool.ts"))) as typeof ThreadPoolModule
  })

  afterEach(async () => {
    if (scope !== undefined) await Effect.runPromise(Scope.close(scope, Exit.void))
    scope = undefined
  })

  const makePool = async (size: number, options: Partial<ThreadPoolModule.ThreadPoolOptions> = {}) => {
    scope = await Effect.runPromise(Scope.make())
    return Effect.runPromise(Scope.extend(pools.ThreadPool.make({ moduleUrl: jobsModule, size, ...options }), scope))
  }

  it("replaces a thread whose job kills it, failing that thread's jobs with its reason and no others", async () => {
    const pool = await makePool(2)
    const [first, second] = await Promise.all([pool.run("echo", 1), pool.run("echo", 2)])
    const threads = [first, second].map((answer) => (answer as { thread: number }).thread)
    expect(new Set(threads).size).toBe(2)
    // Each job goes to the thread with the fewest (the first of those tied): the fatal one joins the first.
    const onTheDoomedThread = pool.run("sleep", 60_000)
    const busy = pool.run("sleep", 300)
    const fatal = pool.run("exit", 7)
    await expect(fatal).rejects.toMatchObject({
      _tag: "ExecutorFailed",
      message: "the preprocessing thread died: it exited with code 7"
    })
    await expect(onTheDoomedThread).rejects.toMatchObject({ _tag: "ExecutorFailed" })
    await expect(busy).resolves.toBeUndefined()
    const after = await Promise.all([1, 2, 3, 4].map((input) => pool.run<{ input: number }>("echo", input)))
    expect(after.map((answer) => answer.input)).toEqual([1, 2, 3, 4])
    expect(pool.failure).toBeUndefined()
  })

  it("starts one thread with the pool where asked (startOne), and the first job runs on it", async () => {
    const dir = await mkdtemp(join(tmpdir(), "cornserve-pool-"))
    try {
      const marker = join(dir, "loaded")
      const loudModule = `data:text/javascript,${encodeURIComponent(`
import { writeFileSync } from "node:fs"
import { threadId } from "node:worker_threads"
writeFileSync(${JSON.stringify(marker)}, String(threadId))
export const echo = (input) => ({ input, thread: threadId })
`)}`
      const pool = await makePool(2, { moduleUrl: loudModule, startOne: true })
      // Loaded before any job was asked for.
      const started = Number(await eventually(() => readFile(marker, "utf8")))
      const answer = await pool.run<{ thread: number }>("echo", 1)
      expect(answer.thread).toBe(started)
    } finally {
      await rm(dir, { recursive: true, force: true })
    }
  })

  it("takes the decoders a dying thread started with it, even one that writes nothing", async () => {
    const pool = await makePool(1)
    const dir = await mkdtemp(join(tmpdir(), "cornserve-test-pool-"))
    try {
      const pidFile = join(dir, "pid")
      const decoding = pool.run("silentChild", pidFile)
      const pid = await eventually(async () => Number((await readFile(pidFile, "utf8")).trim()) || undefined, 10_000)
      expect(isAlive(pid)).toBe(true)
      await expect(pool.run("exit", 3)).rejects.toMatchObject({ _tag: "ExecutorFailed" })
      await expect(decoding).rejects.toMatchObject({ _tag: "ExecutorFailed" })
      await eventually(async () => (isAlive(pid) ? undefined : true), 2_000)
    } finally {
      await rm(dir, { recursive: true, force: true })
    }
  })

  it("replaces a thread that throws where no job catches it, or runs out of heap", async () => {
    const pool = await makePool(1, { resourceLimits: { maxOldGenerationSizeMb: 32, maxYoungGenerationSizeMb: 8 } })
    await expect(pool.run("throwLater", "a bug in a decoder")).rejects.toMatchObject({
      _tag: "ExecutorFailed",
      message: "the preprocessing thread died: a bug in a decoder"
    })
    await expect(pool.run("echo", "still here")).resolves.toMatchObject({ input: "still here" })
    await expect(pool.run("exhaustHeap", null)).rejects.toMatchObject({
      _tag: "ExecutorFailed",
      message: expect.stringMatching(/^the preprocessing thread died: .*out of memory/i)
    })
    await expect(pool.run("echo", "and again")).resolves.toMatchObject({ input: "and again" })
  })

  it("cancels a job when its signal aborts: the caller is answered at once and the thread's job sees its signal", async () => {
    const pool = await makePool(1)
    const cancel = new AbortController()
    const waiting = pool.run("waitForCancel", null, { signal: cancel.signal })
    await pool.run("echo", "the job has started")
    cancel.abort(new Error("the client hung up"))
    await expect(waiting).rejects.toThrow("the client hung up")
    await expect(pool.run("cancelledCount", null)).resolves.toBe(1)
    await expect(pool.run("echo", 1, { signal: AbortSignal.abort(new Error("ended before")) })).rejects.toThrow(
      "ended before"
    )
  })

  it("cannot work once its threads die faster than the bound: it says why", async () => {
    const pool = await makePool(1)
    for (let death = 0; death <= pools.threadDeathBound.deaths; death++) {
      expect(pool.failure).toBeUndefined()
      await expect(pool.run("exit", death + 1)).rejects.toMatchObject({ _tag: "ExecutorFailed" })
      // The next thread is up once it answers (the last is only replaced after a pause).
      if (death < pools.threadDeathBound.deaths) await pool.run("echo", death)
    }
    expect(pool.failure).toBe(
      `preprocessing threads died ${pools.threadDeathBound.deaths + 1} times in ${pools.threadDeathBound.windowMs / 1000} s; the last: it exited with code ${pools.threadDeathBound.deaths + 1}`
    )
    await expect(pool.run("echo", "too soon")).rejects.toMatchObject({ _tag: "EngineUnavailable" })
  })

  it("runs a request's jobs together: once one fails, or the request ends, the others' signals abort", async () => {
    const seen: Array<string> = []
    const waitForAbort = (name: string, signal: AbortSignal) =>
      new Promise<string>((_, reject) =>
        signal.addEventListener("abort", () => {
          seen.push(name)
          reject(signal.reason)
        })
      )
    const request = new AbortController()
    const failing = pools.allOrNone(["a", "b", "c"], request.signal, (name, signal) =>
      name === "b" ? Promise.reject(new Error("b is corrupt")) : waitForAbort(name, signal)
    )
    await expect(failing).rejects.toThrow("b is corrupt")
    expect(seen.sort()).toEqual(["a", "c"])
    const ended = pools.allOrNone(["d", "e"], request.signal, (name, signal) => waitForAbort(name, signal))
    request.abort(new Error("the client hung up"))
    await expect(ended).rejects.toThrow("the client hung up")
    expect(seen.slice(2).sort()).toEqual(["d", "e"])
  })
})
