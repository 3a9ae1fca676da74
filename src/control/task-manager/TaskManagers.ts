import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as ExecutionStrategy from "effect/ExecutionStrategy"
import * as Exit from "effect/Exit"
import * as Option from "effect/Option"
import * as Scope from "effect/Scope"
import type { UnitTaskSpec } from "../../app-runtime/driver/protocol.js"
import type { ExecutorKind } from "./ExecutorKinds.js"
import { type IdleControl, idleReleaseAfterS } from "./IdleRelease.js"
import type { NodeHandle } from "../cluster/NodeHandle.js"
import { healthWatchPeriodMs } from "../../executors/common/Health.js"
import type { Device } from "../../node/Devices.js"
import { ServeConfig } from "../../config/ServeConfig.js"
import { ExecutorWedgedAfter, watchHealth } from "./HealthWatch.js"
import { ManagedTask, type TaskManager } from "./TaskManager.js"
import type { RecordedProfile } from "./ProfileRecording.js"
import { makeProfileStore } from "./ProfileStore.js"

export { ExecutorWedgedAfter } from "./HealthWatch.js"
export type { ExecutorLease, ExecutorSummary, TaskManager, TaskState } from "./TaskManager.js"

/**
 * How many calls each task takes at the dispatcher, per executor in rotation, before it refuses the
 * next (503, Retry-After): a request refused here is refused before any of its work starts, rather
 * than waiting behind hundreds of others in an executor's queue. `serve --task-queue` sets it.
 */
export class TaskQueueBound extends Context.Reference<TaskQueueBound>()("cornserve/TaskQueueBound", {
  defaultValue: () => 64
}) {}

/** Where one executor goes: a node and its devices there, and the threads it may use on each (default 1). */
export interface ExecutorGroup {
  readonly node: NodeHandle
  readonly devices: ReadonlyArray<Device>
  readonly threads?: number
}

/** The task managers of every deployed unit task, by task id. */
export class TaskManagers extends Effect.Service<TaskManagers>()("cornserve/TaskManagers", {
  scoped: Effect.gen(function* () {
    const queueBound = yield* TaskQueueBound
    const wedgedAfterMs = yield* ExecutorWedgedAfter
    // Recorded profiles are kept in the state dir; task managers without one (in a test) keep none.
    const config = yield* Effect.serviceOption(ServeConfig)
    const profiles = Option.map(config, (served) => makeProfileStore(served.stateDir))
    // The internal secret executors take calls with, their health watch included.
    const secret = Option.getOrUndefined(Option.map(config, (served) => served.internalSecret))
    const idleDefaultS = Option.match(config, { onNone: () => 0, onSome: (served) => served.idleReleaseS ?? 0 })
    /** Who stops and starts idle tasks' executors: the resource manager, once it is up. */
    let idleControl: IdleControl | undefined
    const tasks = new Map<string, ManagedTask>()

    const teardown = (taskId: string) =>
      Effect.suspend(() => {
        const task = tasks.get(taskId)
        if (task === undefined) return Effect.void
        task.tearDown()
        return Scope.close(task.scope, Exit.void).pipe(Effect.ensuring(Effect.sync(() => tasks.delete(taskId))))
      })

    // All at once: a stop waits for the slowest executor, not for the sum of them.
    yield* Effect.addFinalizer(() =>
      Effect.forEach([...tasks.keys()], teardown, { concurrency: "unbounded", discard: true })
    )

    const startExecutor = (task: ManagedTask, group: ExecutorGroup) =>
      Effect.gen(function* () {
        const scope = yield* Scope.fork(task.scope, ExecutionStrategy.sequential)
        const id = task.newExecutorId()
        const executor = yield* Scope.extend(
          task.kind.start(task.spec, { node: group.node, devices: group.devices, threads: group.threads ?? 1, id }),
          scope
        ).pipe(Effect.onError(() => Scope.close(scope, Exit.void)))
        const member = task.add(id, group.node.name, executor, scope)
        const heard = {
          health: (healthy: boolean) => task.setHealth(member, healthy),
          queue: (inFlight: number, looks: number) => task.profileOf.observeQueue(inFlight, Date.now(), looks)
        }
        yield* watchHealth(member.executor, heard, secret, wedgedAfterMs).pipe(
          Effect.zipRight(Effect.sleep(healthWatchPeriodMs)),
          Effect.forever,
          Effect.forkIn(scope)
        )
        return member
      })

    /** A task's manager, with its recorded profile, before any executor starts. */
    const newTask = (spec: UnitTaskSpec, kind: ExecutorKind) =>
      Effect.gen(function* () {
        const task = new ManagedTask(spec, kind, yield* Scope.make(), queueBound, {
          afterS: idleReleaseAfterS(spec.config, idleDefaultS),
          control: () => idleControl
        })
        if (Option.isSome(profiles)) task.recordedProfile = yield* profiles.value.load(spec.id)
        return task
      })

    /** Starts the task's executors, one per group, and waits until each is up. */
    const deploy = (spec: UnitTaskSpec, kind: ExecutorKind, groups: ReadonlyArray<ExecutorGroup>) =>
      Effect.gen(function* () {
        const task = yield* newTask(spec, kind)
        task.wanted = groups.length
        tasks.set(spec.id, task)
        yield* Effect.forEach(groups, (group) => startExecutor(task, group), {
          concurrency: "unbounded"
        }).pipe(Effect.onError(() => teardown(spec.id)))
        task.state = "ready"
        task.idle.started()
        return task as TaskManager
      })

    /** The task deployed released: no executor until its first call starts them (IdleRelease.ts). */
    const deployReleased = (spec: UnitTaskSpec, kind: ExecutorKind) =>
      Effect.gen(function* () {
        const task = yield* newTask(spec, kind)
        tasks.set(spec.id, task)
        task.idle.deployedReleased()
        return task as TaskManager
      })

    /**
     * More executors. `replacing`: they stand in for executors the task lost (its wanted count
     * stays); otherwise the task grows.
     */
    const grow = (taskId: string, groups: ReadonlyArray<ExecutorGroup>, replacing = false) =>
      Effect.gen(function* () {
        const task = tasks.get(taskId)!
        if (!replacing) task.wanted += groups.length
        yield* Effect.forEach(groups, (group) => startExecutor(task, group), {
          concurrency: "unbounded",
          discard: true
        }).pipe(
          Effect.onError(() =>
            Effect.sync(() => {
              if (!replacing) task.wanted -= groups.length
            })
          )
        )
      })

    /**
     * Fewer executors: each leaves rotation, finishes its requests, then stops. `executors` is how
     * many (the latest started), or which, by id. Answers where they ran.
     */
    const shrink = (taskId: string, executors: number | ReadonlyArray<string>) =>
      Effect.gen(function* () {
        const task = tasks.get(taskId)!
        const leaving =
          typeof executors === "number"
            ? task.members.slice(-executors)
            : task.members.filter((member) => executors.includes(member.id))
        task.wanted -= leaving.length
        yield* Effect.forEach(
          leaving,
          (member) =>
            Effect.promise(() => task.drain(member)).pipe(
              Effect.zipRight(Scope.close(member.scope, Exit.void)),
              Effect.ensuring(Effect.sync(() => task.members.splice(task.members.indexOf(member), 1)))
            ),
          { concurrency: "unbounded", discard: true }
        )
        return leaving.map((member) => ({ node: member.node, devices: member.executor.devices }))
      })

    /**
     * Every executor on `node` leaves its task at once (the node is lost, or its process started
     * again): calls in flight to them are aborted, and stopping them is left to run in the
     * background (a lost node may not answer). Answers, per task, the devices they held.
     */
    const dropNode = (node: string) =>
      Effect.gen(function* () {
        const dropped: Array<{ readonly taskId: string; readonly devices: ReadonlyArray<Device> }> = []
        for (const task of tasks.values()) {
          const gone = task.members.filter((member) => member.node === node)
          for (const member of gone) {
            task.members.splice(task.members.indexOf(member), 1)
            member.healthy = false
            member.gone.abort()
            dropped.push({ taskId: task.spec.id, devices: member.executor.devices })
            yield* Effect.forkDaemon(Scope.close(member.scope, Exit.void))
          }
        }
        return dropped
      })

    /**
     * A recording of the task's profile ended: it is the task's recorded profile from now on, and is
     * kept in the state dir (failing when it could not be written there).
     */
    const keepRecorded = (taskId: string, profile: RecordedProfile) =>
      Effect.suspend(() => {
        const task = tasks.get(taskId)
        if (task !== undefined) task.recordedProfile = profile
        return Option.isSome(profiles) ? profiles.value.save(taskId, profile) : Effect.void
      })

    return {
      deploy,
      deployReleased,
      teardown,
      /** Who stops idle tasks' executors and starts them again (the resource manager, which holds the devices). */
      controlIdle: (control: IdleControl) => {
        idleControl = control
      },
      grow,
      shrink,
      dropNode,
      keepRecorded,
      /** The task's recorded profile, with when and how it was recorded. */
      recordedProfile: (taskId: string): RecordedProfile | undefined => tasks.get(taskId)?.recordedProfile,
      get: (taskId: string): TaskManager | undefined => tasks.get(taskId),
      list: (): ReadonlyArray<TaskManager> => [...tasks.values()]
    }
  })
}) {}
