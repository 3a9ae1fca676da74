import { Effect, Exit, Scope } from "effect"
import type { UnitTaskSpec } from "../../app-runtime/driver/protocol.js"
import type { Executor, ExecutorKind } from "../../executors/ExecutorKinds.js"
import type { Device } from "../../node/Devices.js"

export type TaskState = "deploying" | "ready" | "tearing-down"

/** One deployed unit task: its executors and the devices they hold. */
export interface TaskManager {
  readonly spec: UnitTaskSpec
  readonly state: TaskState
  readonly devices: ReadonlyArray<Device>
  readonly executors: ReadonlyArray<Executor>
}

interface ManagedTask {
  spec: UnitTaskSpec
  state: TaskState
  devices: Array<Device>
  executors: Array<Executor>
  scope: Scope.CloseableScope
}

/** The task managers of every deployed unit task, by task id. */
export class TaskManagers extends Effect.Service<TaskManagers>()("cornserve/TaskManagers", {
  scoped: Effect.gen(function* () {
    const tasks = new Map<string, ManagedTask>()

    const teardown = (taskId: string) =>
      Effect.suspend(() => {
        const task = tasks.get(taskId)
        if (task === undefined) return Effect.void
        task.state = "tearing-down"
        return Scope.close(task.scope, Exit.void).pipe(Effect.ensuring(Effect.sync(() => tasks.delete(taskId))))
      })

    yield* Effect.addFinalizer(() => Effect.forEach([...tasks.keys()], teardown, { discard: true }))

    /** Starts the task's executors, one per `devicesPerExecutor` devices, and waits for them all. */
    const deploy = (spec: UnitTaskSpec, kind: ExecutorKind, devices: ReadonlyArray<Device>) =>
      Effect.gen(function* () {
        const scope = yield* Scope.make()
        const task: ManagedTask = { spec, state: "deploying", devices: [...devices], executors: [], scope }
        tasks.set(spec.id, task)
        const perExecutor = Math.max(1, kind.devicesPerExecutor(spec))
        const groups = Array.from({ length: Math.floor(devices.length / perExecutor) }, (_, index) =>
          devices.slice(index * perExecutor, (index + 1) * perExecutor)
        )
        const executors = yield* Effect.forEach(groups, (group) => Scope.extend(kind.start(spec, group), scope), {
          concurrency: "unbounded"
        }).pipe(Effect.onError(() => teardown(spec.id)))
        task.executors = [...executors]
        task.state = "ready"
        return task as TaskManager
      })

    return {
      deploy,
      teardown,
      get: (taskId: string): TaskManager | undefined => tasks.get(taskId),
      list: (): ReadonlyArray<TaskManager> => [...tasks.values()]
    }
  })
}) {}
