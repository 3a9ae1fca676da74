import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Layer, Logger, ManagedRuntime } from "effect"
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest"
import { ServeConfig, type ServeOptions } from "../../../src/config/ServeConfig.js"
import type { RecordedProfile } from "../../../src/control/task-manager/ProfileRecording.js"
import { makeProfileStore } from "../../../src/control/task-manager/ProfileStore.js"
import { type TaskManager, TaskManagers } from "../../../src/control/task-manager/TaskManagers.js"
import { TaskProfile } from "../../../src/control/task-manager/TaskProfile.js"
import { cpuGroups, StandInExecutor, standInKind } from "../../support/standInExecutors.js"

/** A profile as a recording makes it: a sweep at loads 1 and 2 measured into a fresh TaskProfile. */
const recordedProfile = (): RecordedProfile => {
  const profile = new TaskProfile(0)
  for (let call = 0; call < 10; call++) {
    profile.record({ endedAt: 100 + call, latencyMs: 10 + call, level: 1, executors: 1, ok: true })
    profile.record({ endedAt: 200 + call, latencyMs: 20 + call, level: 2, executors: 1, ok: true })
  }
  profile.record({ endedAt: 300, latencyMs: 0, level: 2, executors: 1, ok: false })
  return { ...profile.summary(400), recordedAt: "2025-01-02T03:04:05.000Z", levels: [1, 2], secondsPerLevel: 1 }
}

/** Runs `effect`, keeping what it logs. */
const logged = async <A>(effect: Effect.Effect<A>) => {
  const lines: Array<string> = []
  const logger = Logger.make(({ logLevel, message }) =>
    lines.push(`${logLevel.label} ${Array.isArray(message) ? message.join(" ") : String(message)}`)
  )
  const value = await Effect.runPromise(effect.pipe(Effect.provide(Logger.replace(Logger.defaultLogger, logger))))
  return { value, lines }
}

describe("ProfileStore: recorded profiles in the state dir", () => {
  let stateDir: string

  beforeEach(async () => {
    stateDir = await mkdtemp(join(tmpdir(), "cornserve-profiles-"))
  })
  afterEach(() => rm(stateDir, { recursive: true, force: true }))

  it("reads back what it saved, in profiles/<task id>.json, and a second save replaces the first whole", async () => {
    const store = makeProfileStore(stateDir)
    const first = recordedProfile()
    await Effect.runPromise(store.save("llm-abc", first))
    expect(await Effect.runPromise(store.load("llm-abc"))).toEqual(first)
    expect(JSON.parse(await readFile(join(stateDir, "profiles", "llm-abc.json"), "utf8"))).toMatchObject({
      recordedAt: first.recordedAt,
      levels: [1, 2],
      calls: 21,
      failed: 1
    })

    const second = { ...first, recordedAt: "2025-02-03T04:05:06.000Z", levels: [4] as const, secondsPerLevel: 3 }
    await Effect.runPromise(store.save("llm-abc", second))
    expect(await Effect.runPromise(store.load("llm-abc"))).toEqual(second)
    expect(await readdir(join(stateDir, "profiles"))).toEqual(["llm-abc.json"])
  })

  it("keeps a latency of no call (NaN) as null, and reads it back as NaN", async () => {
    const store = makeProfileStore(stateDir)
    const idle = {
      ...recordedProfile(),
      recent: { windowSeconds: 60, calls: 0, callsPerSecond: 0, p50Ms: Number.NaN, p99Ms: Number.NaN }
    }
    await Effect.runPromise(store.save("encoder-abc", idle))
    const stored = JSON.parse(await readFile(join(stateDir, "profiles", "encoder-abc.json"), "utf8"))
    expect(stored.recent).toMatchObject({ p50Ms: null, p99Ms: null })
    expect((await Effect.runPromise(store.load("encoder-abc")))?.recent.p50Ms).toBeNaN()
  })

  it("has none for a task never recorded, without a warning", async () => {
    const { value, lines } = await logged(makeProfileStore(stateDir).load("llm-never"))
    expect(value).toBeUndefined()
    expect(lines).toEqual([])
  })

  it("ignores a file that is not a recorded profile, and says so", async () => {
    const store = makeProfileStore(stateDir)
    await Effect.runPromise(store.save("llm-abc", recordedProfile()))
    const path = join(stateDir, "profiles", "llm-abc.json")

    await writeFile(path, '{"calls": 3, "curves": [')
    const truncated = await logged(store.load("llm-abc"))
    expect(truncated.value).toBeUndefined()
    expect(truncated.lines).toEqual([
      expect.stringMatching(/^WARN ignoring .*llm-abc\.json: it is not a recorded profile/)
    ])

    await writeFile(path, JSON.stringify({ ...recordedProfile(), levels: [] }))
    const wrong = await logged(store.load("llm-abc"))
    expect(wrong.value).toBeUndefined()
    expect(wrong.lines).toEqual([expect.stringMatching(/it is not a recorded profile \(levels\.0: is missing\)$/)])
  })
})

describe("TaskManagers: a task's recorded profile, and the calls that record one", () => {
  let stateDir: string
  let executors: Array<StandInExecutor>
  let runtime: ManagedRuntime.ManagedRuntime<TaskManagers, never>
  let task: TaskManager

  beforeAll(async () => {
    stateDir = await mkdtemp(join(tmpdir(), "cornserve-profiles-"))
    await Effect.runPromise(makeProfileStore(stateDir).save("encoder-t", recordedProfile()))
    executors = [await StandInExecutor.start()]
    // The task managers read only the state dir of the serve configuration.
    const config = { stateDir } as ServeOptions
    runtime = ManagedRuntime.make(TaskManagers.Default.pipe(Layer.provide(Layer.succeed(ServeConfig, config))))
    const managers = await runtime.runPromise(TaskManagers)
    task = await runtime.runPromise(
      managers.deploy(
        { id: "encoder-t", kind: "encoder", name: "encoder", config: {} },
        standInKind("encoder", executors),
        cpuGroups(1)
      )
    )
  })

  afterAll(async () => {
    await runtime.dispose()
    await Promise.all(executors.map((executor) => executor.close()))
    await rm(stateDir, { recursive: true, force: true })
  })

  it("has the profile recorded before it was deployed, read from the state dir", () => {
    expect(task.recorded()).toEqual(recordedProfile())
  })

  it("takes a newly recorded profile, and keeps it in the state dir", async () => {
    const managers = await runtime.runPromise(TaskManagers)
    const fresh = { ...recordedProfile(), recordedAt: "2025-03-04T05:06:07.000Z" }
    await runtime.runPromise(managers.keepRecorded("encoder-t", fresh))
    expect(task.recorded()).toEqual(fresh)
    expect(managers.recordedProfile("encoder-t")?.recordedAt).toBe(fresh.recordedAt)
    expect(await Effect.runPromise(makeProfileStore(stateDir).load("encoder-t"))).toEqual(fresh)
  })

  it("counts a synthetic call in the executor's work but not in the task's own profile or load", async () => {
    const areaBefore = task.loadArea()
    const lease = await task.lease({ synthetic: true })
    expect(task.executors()[0]!.outstanding).toBe(1)
    await new Promise((resolve) => setTimeout(resolve, 20))
    lease.release("ok")
    expect(task.executors()[0]!.outstanding).toBe(0)
    expect(task.loadArea()).toBe(areaBefore)
    expect(task.profile().calls).toBe(0)

    const own = await task.lease({})
    own.release("ok")
    expect(task.profile().calls).toBe(1)
  })
})
