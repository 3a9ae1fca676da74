import { Layer, ManagedRuntime } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  ExecutorWedgedAfter,
  type TaskManager,
  TaskManagers,
  TaskQueueBound
} from "../../../src/control/task-manager/TaskManagers.js"
import { cpuGroups, StandInExecutor, standInKind } from "../../support/standInExecutors.js"

describe("TaskManagers: leasing executors of a task, by their health", () => {
  const runtime = ManagedRuntime.make(TaskManagers.Default)
  let executors: Array<StandInExecutor>
  let task: TaskManager

  const until = async (condition: () => boolean) => {
    const deadline = Date.now() + 5_000
    while (!condition()) {
      if (Date.now() > deadline) throw new Error("the condition did not come true within 5 s")
      await new Promise((resolve) => setTimeout(resolve, 25))
    }
  }
  const healthy = () => task.executors().filter((executor) => executor.healthy).length

  beforeAll(async () => {
    executors = await Promise.all([StandInExecutor.start(), StandInExecutor.start()])
    const managers = await runtime.runPromise(TaskManagers)
    task = await runtime.runPromise(
      managers.deploy(
        { id: "encoder-t", kind: "encoder", name: "encoder", config: {} },
        standInKind("encoder", executors),
        cpuGroups(2)
      )
    )
  })

  afterAll(async () => {
    await runtime.dispose()
    await Promise.all(executors.map((executor) => executor.close()))
  })

  it("leases the executor with the least outstanding work and counts it busy until released", async () => {
    const first = await task.lease({})
    const second = await task.lease({})
    expect(second.executorId).not.toBe(first.executorId)
    expect(task.executors().map((executor) => executor.outstanding)).toEqual([1, 1])
    first.release("ok")
    const third = await task.lease({})
    expect(third.executorId).toBe(first.executorId)
    second.release("ok")
    third.release("ok")
    expect(task.executors().map((executor) => executor.outstanding)).toEqual([0, 0])
  })

  it("tells each lease the load it met: the calls in flight when it was granted, synthetic ones included", async () => {
    const synthetic = await task.lease({ synthetic: true })
    const live = await task.lease({})
    expect([synthetic.level, live.level]).toEqual([1, 2])
    synthetic.release("ok")
    const next = await task.lease({ synthetic: true })
    expect(next.level).toBe(2)
    live.release("ok")
    next.release("ok")
  })

  it("avoids the executor a retry excludes", async () => {
    const first = await task.lease({})
    first.release("ok")
    const retry = await task.lease({ exclude: first.executorId })
    expect(retry.executorId).not.toBe(first.executorId)
    retry.release("ok")
  })

  it("takes an executor that failed its health check out of rotation, and back once it passes", async () => {
    executors[0]!.health = 503
    await until(() => healthy() === 1)
    const leases = await Promise.all([task.lease({}), task.lease({})])
    expect(leases.map((lease) => lease.url)).toEqual([executors[1]!.url, executors[1]!.url])
    for (const lease of leases) lease.release("ok")
    executors[0]!.health = 200
    await until(() => healthy() === 2)
  })

  it("takes an executor that answered unavailable out of rotation until its health check passes", async () => {
    const lease = await task.lease({})
    lease.release("unavailable")
    expect(task.executors().find((executor) => executor.id === lease.executorId)!.healthy).toBe(false)
    await until(() => healthy() === 2)
  })

  it("fails with TaskUnavailable when no executor is healthy and the caller gives up", async () => {
    for (const executor of executors) executor.health = 503
    await until(() => healthy() === 0)
    const gaveUp = new AbortController()
    const lease = task.lease({ signal: gaveUp.signal })
    gaveUp.abort()
    await expect(lease).rejects.toMatchObject({ _tag: "TaskUnavailable" })
    for (const executor of executors) executor.health = 200
    await until(() => healthy() === 2)
  })

  it("waits for an executor to come back rather than failing at once", async () => {
    for (const executor of executors) executor.health = 503
    await until(() => healthy() === 0)
    const lease = task.lease({})
    setTimeout(() => (executors[1]!.health = 200), 300)
    expect((await lease).url).toBe(executors[1]!.url)
    executors[0]!.health = 200
    ;(await lease).release("ok")
    await until(() => healthy() === 2)
  })
})

describe("TaskManagers: a slow executor stays in rotation, a wedged one leaves it and is restarted", () => {
  // A short wedged bound, so that the test sees one pass; the default is 30 s.
  const wedgedAfterMs = 2_000
  const runtime = ManagedRuntime.make(
    TaskManagers.Default.pipe(Layer.provide(Layer.succeed(ExecutorWedgedAfter, wedgedAfterMs)))
  )
  let executor: StandInExecutor
  let task: TaskManager

  beforeAll(async () => {
    executor = await StandInExecutor.start()
    const managers = await runtime.runPromise(TaskManagers)
    task = await runtime.runPromise(
      managers.deploy(
        { id: "llm-slow", kind: "llm", name: "llm", config: {} },
        standInKind("llm", [executor]),
        cpuGroups(1)
      )
    )
  })

  afterAll(async () => {
    await runtime.dispose()
    await executor.close()
  })

  it("keeps a silent executor in rotation, leasing it, until the wedged bound; then restarts it", async () => {
    executor.silent = true
    // Until it is restarted, it is in rotation at every look, and a call gets it.
    let leftRotation = false
    while (executor.restarts.length === 0) {
      if (!task.executors()[0]!.healthy) leftRotation = true
      const lease = await task.lease({})
      expect(lease.url).toBe(executor.url)
      lease.release("ok")
      await new Promise((resolve) => setTimeout(resolve, 50))
    }
    expect(leftRotation).toBe(false)
    expect(executor.restarts).toEqual([`its health watch was silent for ${wedgedAfterMs / 1000} s`])
    expect(task.executors()[0]!.healthy).toBe(false)
    // Speaking again, it is back.
    executor.silent = false
    const deadline = Date.now() + 5_000
    while (!task.executors()[0]!.healthy && Date.now() < deadline)
      await new Promise((resolve) => setTimeout(resolve, 25))
    expect(task.executors()[0]!.healthy).toBe(true)
  })
})

describe("TaskManagers: a task's bound on calls in flight", () => {
  // Two calls per executor in rotation: a third call to a one-executor task is refused before it starts.
  const runtime = ManagedRuntime.make(TaskManagers.Default.pipe(Layer.provide(Layer.succeed(TaskQueueBound, 2))))
  let executor: StandInExecutor
  let task: TaskManager

  beforeAll(async () => {
    executor = await StandInExecutor.start()
    const managers = await runtime.runPromise(TaskManagers)
    task = await runtime.runPromise(
      managers.deploy(
        { id: "llm-bounded", kind: "llm", name: "llm", config: {} },
        standInKind("llm", [executor]),
        cpuGroups(1)
      )
    )
  })

  afterAll(async () => {
    await runtime.dispose()
    await executor.close()
  })

  it("refuses a call over the bound as unavailable at once, counts it shed, and takes calls again once one ends", async () => {
    const first = await task.lease({})
    const second = await task.lease({})
    await expect(task.lease({})).rejects.toMatchObject({
      _tag: "TaskUnavailable",
      message: "task llm-bounded is full: 2 calls in flight, its limit with 1 executor(s) in rotation is 2"
    })
    expect(task.shed).toBe(1)
    first.release("ok")
    const third = await task.lease({})
    third.release("ok")
    second.release("ok")
    expect(task.executors()[0]!.outstanding).toBe(0)
  })
})

describe("TaskManagers: a call waiting for an executor", () => {
  const runtime = ManagedRuntime.make(TaskManagers.Default)
  let executor: StandInExecutor

  beforeAll(async () => {
    executor = await StandInExecutor.start()
  })

  afterAll(async () => {
    await runtime.dispose()
    await executor.close()
  })

  it("is refused as soon as its task is torn down, not at the end of its wait", async () => {
    const managers = await runtime.runPromise(TaskManagers)
    const task = await runtime.runPromise(
      managers.deploy(
        { id: "encoder-going", kind: "encoder", name: "encoder", config: {} },
        standInKind("encoder", [executor]),
        cpuGroups(1)
      )
    )
    executor.health = 503
    const deadline = Date.now() + 5_000
    while (task.executors().some((member) => member.healthy)) {
      if (Date.now() > deadline) throw new Error("the executor did not leave rotation within 5 s")
      await new Promise((resolve) => setTimeout(resolve, 25))
    }
    const waiting = task.lease({})
    const asked = Date.now()
    await runtime.runPromise(managers.teardown("encoder-going"))
    await expect(waiting).rejects.toMatchObject({
      _tag: "TaskUnavailable",
      message: "task encoder-going is being torn down"
    })
    expect(Date.now() - asked).toBeLessThan(5_000)
  })
})
