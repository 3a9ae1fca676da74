import { existsSync } from "node:fs"
import { mkdtemp, readdir, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Chunk, Clock, Duration, Effect, Queue, TestClock, TestContext } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { healthyAfter } from "../../src/process/RestartPolicy.js"
import { type ProcessState, SupervisedProcess } from "../../src/process/SupervisedProcess.js"
import { arenaFilePrefix } from "../../src/sidecar/Arena.js"

const nodeId = `supervised-test-${process.pid}`

/**
 * The process supervised is a real sidecar; the clock is the test's, so that the restart waits
 * (seconds, up to the cap) and the healthy period pass at once while the processes run for real.
 */
describe("SupervisedProcess", () => {
  let dir: string

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "cornserve-supervised-"))
  })

  afterAll(async () => {
    await rm(dir, { recursive: true, force: true })
    // A sidecar killed with SIGKILL cannot remove its arena file.
    for (const name of await readdir("/dev/shm")) {
      if (name.startsWith(`${arenaFilePrefix}${nodeId}-`)) await rm(join("/dev/shm", name), { force: true })
    }
  })

  /** The arena file of the sidecar with this pid. */
  const arenaOf = (pid: number) => join("/dev/shm", `${arenaFilePrefix}${nodeId}-${pid}`)

  /** A supervised sidecar, and the states its supervisor reports; `leaves` as SupervisedProcess takes it. */
  const startSidecarWith = (leaves?: (pid: number) => ReadonlyArray<string>) =>
    Effect.gen(function* () {
      const states = yield* Queue.unbounded<ProcessState<true>>()
      const sidecar = yield* SupervisedProcess.start<true>({
        name: "sidecar",
        args: [
          "internal",
          "sidecar",
          "--node-id",
          nodeId,
          "--socket",
          join(dir, "sidecar.sock"),
          "--arena-bytes",
          String(8 * 1024 * 1024)
        ],
        parseReady: (output) => (output.includes("cornserve sidecar: ready") ? true : undefined),
        startTimeoutMs: 60_000,
        log: () => undefined,
        onState: (state) => Queue.unsafeOffer(states, state),
        ...(leaves === undefined ? {} : { leaves })
      })
      return { sidecar, states }
    })
  const startSidecar = startSidecarWith()

  const nextState = <Tag extends ProcessState<true>["_tag"]>(
    states: Queue.Queue<ProcessState<true>>,
    tag: Tag
  ): Effect.Effect<Extract<ProcessState<true>, { _tag: Tag }>> =>
    Effect.flatMap(Queue.take(states), (state) =>
      state._tag === tag ? Effect.succeed(state as Extract<ProcessState<true>, { _tag: Tag }>) : nextState(states, tag)
    )

  /** Kills the process, lets the wait the supervisor chose pass, and returns that wait once it is ready again. */
  const crashAndRestart = (sidecar: SupervisedProcess<true>, states: Queue.Queue<ProcessState<true>>) =>
    Effect.gen(function* () {
      const killed = sidecar.pid!
      process.kill(killed, "SIGKILL")
      const { restartInMs } = yield* nextState(states, "Crashed")
      const wakeAt = (yield* Clock.currentTimeMillis) + restartInMs
      while (!Chunk.some(yield* TestClock.sleeps(), (sleep) => sleep === wakeAt)) yield* Effect.yieldNow()
      yield* TestClock.adjust(Duration.millis(restartInMs))
      yield* nextState(states, "Ready")
      expect(sidecar.pid).not.toBe(killed)
      return restartInMs
    })

  it("restarts a process that dies at once with growing waits up to a cap, and quickly once it stayed up", async () => {
    const waits = await Effect.gen(function* () {
      const { sidecar, states } = yield* startSidecar
      const waits: Array<number> = []
      for (let crash = 0; crash < 7; crash++) waits.push(yield* crashAndRestart(sidecar, states))
      yield* TestClock.adjust(healthyAfter)
      waits.push(yield* crashAndRestart(sidecar, states))
      return waits
    }).pipe(Effect.scoped, Effect.provide(TestContext.TestContext), Effect.runPromise)
    expect(waits).toEqual([250, 500, 1_000, 2_000, 4_000, 8_000, 8_000, 250])
  })

  it("fails to start, naming why, when the process exits before it is ready", async () => {
    const started = Effect.scoped(
      SupervisedProcess.start({
        name: "sidecar",
        args: ["internal", "sidecar", "--node-id", nodeId, "--socket", join(dir, "bad.sock"), "--arena-bytes", "-1"],
        parseReady: (output) => (output.includes("cornserve sidecar: ready") ? true : undefined),
        startTimeoutMs: 60_000,
        log: () => undefined
      })
    )
    await expect(Effect.runPromise(started)).rejects.toThrow(/sidecar exited with code \d+ before it was ready/)
  })

  it("removes what a killed run leaves (its `leaves`) once it has exited", async () => {
    const { arena, kept } = await Effect.gen(function* () {
      const { sidecar, states } = yield* startSidecarWith((pid) => [arenaOf(pid)])
      const arena = arenaOf(sidecar.pid!)
      const kept = existsSync(arena)
      process.kill(sidecar.pid!, "SIGKILL")
      yield* nextState(states, "Crashed")
      return { arena, kept }
    }).pipe(Effect.scoped, Effect.runPromise)
    expect(kept).toBe(true)
    expect(existsSync(arena)).toBe(false)
  })

  it("stops the process when its scope closes", async () => {
    const pid = await Effect.gen(function* () {
      const { sidecar } = yield* startSidecar
      return sidecar.pid!
    }).pipe(Effect.scoped, Effect.runPromise)
    expect(() => process.kill(pid, 0)).toThrow()
  })
})
