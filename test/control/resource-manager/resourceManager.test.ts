import { type ChildProcess, spawn } from "node:child_process"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Layer } from "effect"
import type { UnitTaskSpec } from "../../../src/app-runtime/driver/protocol.js"
import { NodeRegistry } from "../../../src/control/cluster/NodeRegistry.js"
import { ResourceManager } from "../../../src/control/resource-manager/ResourceManager.js"
import { ServeConfig, type ServeOptions } from "../../../src/config/ServeConfig.js"
import { TaskManagers } from "../../../src/control/task-manager/TaskManagers.js"
import { type ExecutorKind, ExecutorKinds } from "../../../src/control/task-manager/ExecutorKinds.js"

const options = (stateDir: string, devices: string): ServeOptions => ({
  role: "all",
  host: "127.0.0.1",
  port: 0,
  stateDir,
  devices,
  nodeId: "local",
  clusterToken: undefined,
  internalSecret: "test-internal-secret",
  clusterPort: 0,
  join: undefined,
  advertiseHost: "127.0.0.1",
  sidecarArenaBytes: 1 << 24,
  adminToken: undefined,
  metricsToken: undefined,
  publicMetrics: false,
  allowPrivateOutbound: false,
  apiKeys: [],
  tls: undefined,
  tlsCa: undefined,
  maxBodyBytes: 1 << 20,
  headersTimeoutMs: 30_000,
  receiveTimeoutMs: 300_000,
  bodyIdleTimeoutMs: 10_000,
  maxJsonDepth: 64,
  appLimits: { heapMiB: 768, rssMiB: 1024, stallMs: 10_000, maxResponseBytes: 1 << 20 },
  allowedHosts: [],
  requestTimeoutMs: 1_000,
  taskQueue: 64,
  embeddingCacheBytes: 0,
  appLoadTimeoutMs: 10_000,
  shutdownGraceMs: 1_000,
  executorGraceMs: 30_000,
  unregisterGraceMs: 1_000
})

/** The threads per device each task's last executor was started with. */
const startedThreads = new Map<string, number>()

/**
 * An executor kind for this test alone: each executor is a real idle child process, so the test
 * can see which executors run. A task whose model is "broken" fails to start.
 */
const processKind = (running: Set<ChildProcess>): ExecutorKind => ({
  kind: "encoder",
  devicesPerExecutor: () => 1,
  start: (task, slot) =>
    Effect.acquireRelease(
      Effect.suspend(() => {
        startedThreads.set(task.id, slot.threads)
        if ((task.config as { model: string }).model === "broken") {
          return Effect.fail(new Error("the executor crashed on start"))
        }
        const child = spawn(process.execPath, ["-e", "setInterval(() => {}, 1000)"], { stdio: "ignore" })
        running.add(child)
        return Effect.succeed({
          child,
          executor: { devices: slot.devices, url: () => `process:${child.pid}`, restart: () => child.kill("SIGKILL") }
        })
      }),
      ({ child }) =>
        Effect.async<void>((resume) => {
          child.once("exit", () => {
            running.delete(child)
            resume(Effect.void)
          })
          child.kill("SIGTERM")
        })
    ).pipe(Effect.map(({ executor }) => executor))
})

const spec = (id: string, model: string): UnitTaskSpec => ({
  id,
  kind: "encoder",
  name: `encoder-${model}`,
  config: { model }
})
const noProgress = () => Effect.void

const withResources = <A, E>(
  devices: string,
  body: (resources: ResourceManager, running: Set<ChildProcess>) => Effect.Effect<A, E>
) =>
  Effect.gen(function* () {
    const stateDir = yield* Effect.promise(() => mkdtemp(join(tmpdir(), "cornserve-rm-")))
    const running = new Set<ChildProcess>()
    const layer = ResourceManager.DefaultWithoutDependencies.pipe(
      Layer.provide(TaskManagers.Default),
      // The node's real agent and registry (its sidecar runs): the executors are this test's own processes.
      Layer.provide(NodeRegistry.Default),
      Layer.provide(
        Layer.succeed(ExecutorKinds, ExecutorKinds.make({ kinds: new Map([["encoder", processKind(running)]]) }))
      ),
      Layer.provide(Layer.succeed(ServeConfig, options(stateDir, devices)))
    )
    const result = yield* Effect.flatMap(ResourceManager, (resources) => body(resources, running)).pipe(
      Effect.provide(layer)
    )
    yield* Effect.promise(() => rm(stateDir, { recursive: true, force: true }))
    return { result, running }
  })

describe("ResourceManager", () => {
  it.effect("deploys an equal task once and shares it; tears it down when its last user goes", () =>
    Effect.gen(function* () {
      const { running } = yield* withResources("cpu:0,cpu:1", (resources, running) =>
        Effect.gen(function* () {
          yield* resources.acquire("app-a", [spec("encoder-1", "m")], noProgress)
          yield* resources.acquire("app-b", [spec("encoder-1", "m")], noProgress)
          expect(running.size).toBe(1)
          expect(resources.tasks()).toMatchObject([
            { id: "encoder-1", state: "ready", usedBy: ["app-a", "app-b"], devices: ["cpu:0"] }
          ])

          yield* resources.release("app-a", [spec("encoder-1", "m")])
          expect(running.size).toBe(1)
          yield* resources.release("app-b", [spec("encoder-1", "m")])
          expect(running.size).toBe(0)
          expect(resources.tasks()).toEqual([])
          expect(resources.devices()).toEqual([
            { id: "cpu:0", type: "cpu", threads: 1, task: null, tasks: [] },
            { id: "cpu:1", type: "cpu", threads: 1, task: null, tasks: [] }
          ])
        })
      )
      expect(running.size).toBe(0)
    })
  )

  it.effect("rolls back every task it deployed when one of them fails", () =>
    withResources("cpu:0,cpu:1,cpu:2", (resources, running) =>
      Effect.gen(function* () {
        yield* resources.acquire("app-a", [spec("shared", "m")], noProgress)
        const exit = yield* Effect.exit(
          resources.acquire("app-b", [spec("shared", "m"), spec("fresh", "n"), spec("bad", "broken")], noProgress)
        )
        expect(Exit.isFailure(exit)).toBe(true)
        expect(String(exit)).toContain("the executor crashed on start")
        expect(resources.tasks().map((task) => [task.id, task.usedBy])).toEqual([["shared", ["app-a"]]])
        expect(running.size).toBe(1)
        expect(
          resources
            .devices()
            .filter((device) => device.task !== null)
            .map((device) => [device.id, device.tasks])
        ).toEqual([["cpu:0", ["shared"]]])
      })
    )
  )

  it.effect("says clearly when devices run out, and when a task kind has no executor", () =>
    // A GPU is never shared: the second task finds no device.
    withResources("cuda:0", (resources) =>
      Effect.gen(function* () {
        yield* resources.acquire("app-a", [spec("one", "m")], noProgress)
        const exhausted = yield* Effect.flip(resources.acquire("app-b", [spec("two", "n")], noProgress))
        expect(exhausted.message).toBe(
          "task two needs 1 device(s) per executor, 1 executor(s); free: local 0 of 1 (1 executor(s) short); CPU devices held by other tasks were open to it, one executor of a task per device"
        )
        const unknown = yield* Effect.flip(
          resources.acquire("app-c", [{ id: "llm-1", kind: "llm", name: "llm-x", config: { model: "x" } }], noProgress)
        )
        expect(unknown.message).toBe('no executor for task kind "llm" (task llm-1) on this platform')
      })
    )
  )

  it.effect("shares a CPU device between tasks when none is free, each with its share of the threads", () =>
    withResources("cpu:0/4", (resources, running) =>
      Effect.gen(function* () {
        yield* resources.acquire("app-a", [spec("one", "m")], noProgress)
        yield* resources.acquire("app-b", [spec("two", "n"), spec("three", "o")], noProgress)
        expect(running.size).toBe(3)
        expect(resources.devices()).toEqual([
          { id: "cpu:0", type: "cpu", threads: 4, task: "one", tasks: ["one", "two", "three"] }
        ])
        expect(startedThreads.get("one")).toBe(4)
        expect(startedThreads.get("two")).toBe(2)
        expect(startedThreads.get("three")).toBe(1)
        // More executors of a task go on free devices only (on a shared one they would add no cores).
        const more = yield* Effect.flip(resources.scale("one", 1))
        expect(more.message).toContain("free: local 0 of 1")
        yield* resources.release("app-a", [spec("one", "m")])
        expect(resources.devices()[0]!.tasks).toEqual(["two", "three"])
      })
    )
  )

  it.effect("stops every executor when the platform's scope closes", () =>
    Effect.gen(function* () {
      const { running } = yield* withResources("cpu:0,cpu:1", (resources, running) =>
        Effect.gen(function* () {
          yield* resources.acquire("app-a", [spec("one", "m"), spec("two", "n")], noProgress)
          expect(running.size).toBe(2)
        })
      )
      expect(running.size).toBe(0)
    })
  )
})
