import { Effect } from "effect"
import type { UnitTaskSpec } from "../../app-runtime/driver/protocol.js"
import { ExecutorKinds } from "../../executors/ExecutorKinds.js"
import { type Device, parseDevices } from "../../node/Devices.js"
import { BadRequest, DeploymentFailed, DevicesExhausted, NoExecutorForKind, TaskNotFound } from "../errors.js"
import { ServeConfig } from "../ServeConfig.js"
import { type ExecutorSummary, TaskManagers } from "../task-manager/TaskManagers.js"

export interface TaskSummary {
  readonly id: string
  readonly kind: string
  readonly name: string
  readonly config: unknown
  readonly state: string
  readonly usedBy: ReadonlyArray<string>
  readonly devices: ReadonlyArray<string>
  readonly executors: ReadonlyArray<ExecutorSummary>
}

/**
 * Which unit tasks are deployed, who uses them, and which devices they hold. Deployment is
 * usage-counted: equal tasks (same id) deploy once and are torn down when their last user goes.
 * A request to use several tasks either deploys them all or rolls back every one it deployed.
 */
export class ResourceManager extends Effect.Service<ResourceManager>()("cornserve/ResourceManager", {
  scoped: Effect.gen(function* () {
    const config = yield* ServeConfig
    const taskManagers = yield* TaskManagers
    const { kinds } = yield* ExecutorKinds
    const devices = parseDevices(config.devices)
    const allocated = new Map<string, string>()
    const users = new Map<string, Set<string>>()
    const lock = yield* Effect.makeSemaphore(1)

    const freeDevices = () => devices.filter((device) => !allocated.has(device.id))

    const allocate = (taskId: string, count: number): Effect.Effect<ReadonlyArray<Device>, DevicesExhausted> =>
      Effect.suspend(() => {
        const free = freeDevices()
        if (free.length < count) {
          return Effect.fail(
            new DevicesExhausted({
              message: `task ${taskId} needs ${count} device(s) but ${free.length} of ${devices.length} are free`
            })
          )
        }
        const chosen = free.slice(0, count)
        for (const device of chosen) allocated.set(device.id, taskId)
        return Effect.succeed(chosen)
      })

    const freeTaskDevices = (taskId: string) => {
      for (const [device, owner] of allocated) if (owner === taskId) allocated.delete(device)
    }

    const deployOne = (spec: UnitTaskSpec, onProgress: (message: string) => Effect.Effect<void>) =>
      Effect.gen(function* () {
        const kind = kinds.get(spec.kind)
        if (kind === undefined) return yield* new NoExecutorForKind({ kind: spec.kind, taskId: spec.id })
        if (kind.prepare !== undefined) {
          yield* kind
            .prepare(spec, onProgress)
            .pipe(
              Effect.mapError(
                (error) => new DeploymentFailed({ message: `task ${spec.id} failed to start: ${error.message}` })
              )
            )
        }
        const taskDevices = yield* allocate(spec.id, Math.max(1, kind.devicesPerExecutor(spec)))
        yield* taskManagers
          .deploy(spec, kind, taskDevices)
          .pipe(
            Effect.mapError(
              (error) => new DeploymentFailed({ message: `task ${spec.id} failed to start: ${error.message}` })
            )
          )
      }).pipe(Effect.onError(() => Effect.sync(() => freeTaskDevices(spec.id))))

    const teardown = (taskId: string) =>
      taskManagers.teardown(taskId).pipe(Effect.ensuring(Effect.sync(() => freeTaskDevices(taskId))))

    /** `user` now uses `specs`; deploys those not yet deployed, all or none. */
    const acquire = (
      user: string,
      specs: ReadonlyArray<UnitTaskSpec>,
      onProgress: (message: string) => Effect.Effect<void>
    ) =>
      lock.withPermits(1)(
        Effect.gen(function* () {
          const fresh = specs.filter((spec) => taskManagers.get(spec.id) === undefined)
          for (const spec of specs) {
            if (!fresh.includes(spec))
              yield* onProgress(`task ${spec.name} (${spec.id}) is already deployed; sharing it`)
          }
          // The new tasks start side by side; if one fails, every one that started is torn down.
          yield* Effect.forEach(
            fresh,
            (spec) =>
              Effect.zipRight(onProgress(`deploying task ${spec.name} (${spec.id})`), deployOne(spec, onProgress)),
            {
              concurrency: "unbounded",
              discard: true
            }
          ).pipe(Effect.onError(() => Effect.forEach(fresh, (spec) => teardown(spec.id), { discard: true })))
          for (const spec of specs) {
            const set = users.get(spec.id) ?? new Set<string>()
            set.add(user)
            users.set(spec.id, set)
          }
        })
      )

    /** `user` no longer uses `specs`; tasks nobody uses any more are torn down. */
    const release = (user: string, specs: ReadonlyArray<UnitTaskSpec>) =>
      lock.withPermits(1)(
        Effect.forEach(
          specs,
          (spec) =>
            Effect.suspend(() => {
              const set = users.get(spec.id)
              set?.delete(user)
              if (set !== undefined && set.size > 0) return Effect.void
              users.delete(spec.id)
              return teardown(spec.id)
            }),
          { discard: true }
        )
      )

    /** Adds devices (new executors) to a task, or takes some away: those executors drain first. */
    const scale = (taskId: string, deltaDevices: number) =>
      lock.withPermits(1)(
        Effect.gen(function* () {
          const task = taskManagers.get(taskId)
          if (task === undefined) return yield* new TaskNotFound({ taskId })
          const perExecutor = Math.max(1, kinds.get(task.spec.kind)!.devicesPerExecutor(task.spec))
          if (deltaDevices > 0) {
            const added = yield* allocate(taskId, Math.ceil(deltaDevices / perExecutor) * perExecutor)
            yield* taskManagers.grow(taskId, added).pipe(
              Effect.mapError(
                (error) => new DeploymentFailed({ message: `task ${taskId} could not grow: ${error.message}` })
              ),
              Effect.onError(() => Effect.sync(() => added.forEach((device) => allocated.delete(device.id))))
            )
          } else {
            const executors = Math.ceil(-deltaDevices / perExecutor)
            if (executors >= task.executors().length) {
              return yield* new BadRequest({
                message: `task ${taskId} has ${task.executors().length} executor(s); it keeps at least one (unregister its apps to stop it)`
              })
            }
            const freed = yield* taskManagers.shrink(taskId, executors)
            for (const device of freed) allocated.delete(device.id)
          }
        })
      )

    const tasks = (): ReadonlyArray<TaskSummary> =>
      taskManagers.list().map((task) => ({
        id: task.spec.id,
        kind: task.spec.kind,
        name: task.spec.name,
        config: task.spec.config,
        state: task.state,
        usedBy: [...(users.get(task.spec.id) ?? [])].map((user) => user.split("#")[0]!),
        devices: task.devices.map((device) => device.id),
        executors: task.executors()
      }))

    return {
      acquire,
      release,
      scale,
      tasks,
      devices: () => devices.map((device) => ({ id: device.id, task: allocated.get(device.id) ?? null }))
    }
  }),
  dependencies: [TaskManagers.Default, ExecutorKinds.Default]
}) {}
