import * as Cause from "effect/Cause"
import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Exit from "effect/Exit"
import * as Runtime from "effect/Runtime"
import type { UnitTaskSpec } from "../../app-runtime/driver/protocol.js"
import { DeploymentFailed } from "../errors.js"
import type { IdleControl } from "../task-manager/IdleRelease.js"
import type { TaskManager, TaskManagers } from "../task-manager/TaskManagers.js"
import type { DeviceHoldings } from "./DeviceHoldings.js"
import type { LivePlacement } from "./LivePlacement.js"
import type { PlacedExecutor, PlacementRequest } from "./Placement.js"
import type { ScaleStore } from "./ScaleStore.js"
import { batchedByTurn } from "./TurnBatch.js"

/**
 * Scale to zero, the resource manager's side (the task's side is IdleRelease.ts): an idle task's
 * executors stopped and their devices freed, and a released task's executors placed and started
 * again for its calls (cold starts), those asked for in one turn together. Each runs under the
 * resource manager's lock.
 */
export const makeColdStarts = (options: {
  readonly taskManagers: TaskManagers
  readonly holdings: DeviceHoldings
  readonly scales: ScaleStore
  readonly placement: LivePlacement
  readonly lock: Effect.Semaphore
  readonly runtime: Runtime.Runtime<never>
  /** Which users each deployed task has. */
  readonly users: ReadonlyMap<string, ReadonlySet<string>>
  readonly devicesPerExecutor: (spec: UnitTaskSpec) => number
  /** Tasks that exchange data with a task: placement puts its executors near theirs. */
  readonly relatedTo: (taskId: string) => ReadonlyArray<string>
  /** The task grew or shrank now. */
  readonly changed: (taskId: string) => void
}) => {
  const { taskManagers, holdings, scales, placement, lock, runtime, users, devicesPerExecutor, relatedTo, changed } =
    options

  /**
   * An idle task's executors stop and their devices are free (IdleRelease.ts): unless a call came
   * for them meanwhile, or the task is going. Its scale is kept for its next start.
   */
  const releaseIdle = (taskId: string) =>
    lock.withPermits(1)(
      Effect.gen(function* () {
        const task = taskManagers.get(taskId)
        if (task === undefined || task.state !== "releasing") return false
        const freed = yield* taskManagers.shrink(
          taskId,
          task.executors().map((executor) => executor.id)
        )
        holdings.give(taskId, freed)
        changed(taskId)
        yield* Effect.logInfo(`task ${taskId} was idle for ${task.idleStats().releaseAfterS} s: its executors stopped`)
        return true
      })
    )

  /**
   * Released tasks' executors start again for calls (cold starts): each task as many as it had
   * (the scale kept for it), else one, on a shared CPU device when no device is free. Starts
   * asked for together (an app's tasks, woken by its first call) are placed under the lock one
   * after another and their executors started side by side; each task's own outcome is its.
   */
  const startReleased = (taskIds: ReadonlyArray<string>) =>
    lock.withPermits(1)(
      Effect.gen(function* () {
        const placements = yield* Effect.forEach(taskIds, (taskId) =>
          Effect.either(
            Effect.gen(function* () {
              const task = taskManagers.get(taskId)
              if (task === undefined || task.state !== "starting")
                return yield* new DeploymentFailed({ message: `task ${taskId} is being torn down` })
              if (task.executors().length > 0) return undefined
              const request: PlacementRequest = {
                task: taskId,
                executors: scales.executorsOf(taskId),
                devicesPerExecutor: devicesPerExecutor(task.spec),
                related: relatedTo(taskId),
                preferred: placement.preferredFor(taskId)
              }
              const placed = yield* placement
                .placeExecutors([request])
                .pipe(
                  Effect.catchTag("DevicesExhausted", () =>
                    placement.placeExecutors([{ ...request, executors: 1, share: true }])
                  )
                )
              yield* placement.logPlacement(placed)
              return { task, placed }
            })
          )
        )
        return yield* Effect.forEach(
          placements,
          (outcome) =>
            Either.isLeft(outcome) || outcome.right === undefined
              ? Effect.succeed(Either.map(outcome, () => undefined))
              : Effect.either(startPlaced(outcome.right.task, outcome.right.placed)),
          { concurrency: "unbounded" }
        )
      })
    )

  /** A released task's executors started where they were placed; the devices given back if they fail. */
  const startPlaced = (task: TaskManager, placed: ReadonlyArray<PlacedExecutor>) =>
    Effect.gen(function* () {
      yield* placement.prepareOn(task.spec, placed, () => Effect.void)
      yield* taskManagers
        .grow(task.spec.id, yield* placement.groupsOf(placed))
        .pipe(Effect.tapError((error) => placement.noteFailure(error)))
      changed(task.spec.id)
    }).pipe(Effect.onError(() => Effect.sync(() => holdings.give(task.spec.id, placed))))

  /**
   * The cold starts the task managers ask for in one turn of the event loop, started together
   * (see `startReleased`); a start asked for while others run waits for the lock, with those
   * asked for beside it.
   */
  const coldStarts = batchedByTurn((taskIds) => Runtime.runPromise(runtime)(startReleased(taskIds)))

  /** Runs one of the resource manager's effects for the task managers' promises: it fails with its error's message. */
  const asPromise = <A, E extends { readonly message: string }>(effect: Effect.Effect<A, E>) =>
    Runtime.runPromiseExit(runtime)(effect).then((exit) => {
      if (Exit.isSuccess(exit)) return exit.value
      const failure = Cause.failureOption(exit.cause)
      throw new Error(failure._tag === "Some" ? failure.value.message : Cause.pretty(exit.cause))
    })

  /** How the task managers stop an idle task's executors and start them again. */
  const idleControl: IdleControl = {
    release: (taskId) => asPromise(releaseIdle(taskId)),
    start: coldStarts
  }

  /** A released task scaled up starts its executors again (its scale as it was), as its next call would. */
  const wakeReleased = (task: TaskManager) =>
    Effect.tryPromise({
      try: () => task.wake(),
      catch: (error) =>
        new DeploymentFailed({
          message: error instanceof Error ? error.message : `task ${task.spec.id} could not start`
        })
    })

  /**
   * An app's call to one of its tasks: its other released tasks start now too, side by side with
   * that one, rather than each at the app's first call to it.
   */
  const wakeTasksOf = (user: string): void => {
    for (const [taskId, taskUsers] of users) {
      if (!taskUsers.has(user)) continue
      const task = taskManagers.get(taskId)
      // Its own call, if any, hears of a failed start.
      if (task?.state === "released") task.wake().catch(() => undefined)
    }
  }

  return { idleControl, wakeReleased, wakeTasksOf }
}
