import * as Effect from "effect/Effect"
import * as Either from "effect/Either"
import * as Runtime from "effect/Runtime"
import type { UnitTaskSpec } from "../../app-runtime/driver/protocol.js"
import { ExecutorKinds } from "../task-manager/ExecutorKinds.js"
import { NodeRegistry } from "../cluster/NodeRegistry.js"
import { BadRequest, DeploymentFailed, type DevicesExhausted, NoExecutorForKind, TaskNotFound } from "../errors.js"
import { ServeConfig } from "../../config/ServeConfig.js"
import { idleReleaseAfterS } from "../task-manager/IdleRelease.js"
import { TaskManagers } from "../task-manager/TaskManagers.js"
import { makeColdStarts } from "./ColdStarts.js"
import { makeDeviceHoldings } from "./DeviceHoldings.js"
import { makeListings } from "./Listings.js"
import { makeLivePlacement } from "./LivePlacement.js"
import type { PlacedExecutor, PlacementRequest } from "./Placement.js"
import type { Move } from "./Rebalance.js"
import { type Fleet, makeRebalanceMoves } from "./RebalanceMoves.js"
import { makeScaleStore } from "./ScaleStore.js"

export type { TaskSummary } from "./Listings.js"

/**
 * Which unit tasks are deployed, who uses them, and which devices of which nodes they hold.
 * Deployment is usage-counted: equal tasks (same id) deploy once and are torn down when their
 * last user goes. A request to use several tasks either deploys them all or rolls back every one
 * it deployed. Where executors go is the placement policy's answer (Placement.ts) on the cluster
 * as it stands (LivePlacement.ts). When a node is lost, its executors leave their tasks at once
 * and are replaced on free devices of ready nodes; a task that finds no room stays short and is
 * made whole when room appears (a node joins or comes back). Every change to the devices is made
 * under one lock, the rebalancer's moves (Rebalancer.ts) and idle tasks' releases and cold starts
 * (ColdStarts.ts) included.
 */
export class ResourceManager extends Effect.Service<ResourceManager>()("cornserve/ResourceManager", {
  scoped: Effect.gen(function* () {
    const config = yield* ServeConfig
    const taskManagers = yield* TaskManagers
    const registry = yield* NodeRegistry
    const { kinds } = yield* ExecutorKinds
    const runtime = yield* Effect.runtime<never>()
    const holdings = makeDeviceHoldings()
    const users = new Map<string, Set<string>>()
    const lock = yield* Effect.makeSemaphore(1)
    const scales = yield* makeScaleStore(config.stateDir)
    /** Tasks told to be short of executors, so that the same shortfall is logged once. */
    const toldShort = new Map<string, string>()
    /** When each task last grew or shrank: the rebalancing policy leaves it alone for a while. */
    const changedAt = new Map<string, number>()
    const placement = makeLivePlacement({ role: config.role, registry, kinds, holdings })
    const { placementNodes, preferredFor, noteFailure, placeExecutors, groupsOf, logPlacement, prepareOn } = placement

    /** Tasks that share a user with `taskId`: they exchange data with it (an app's encoder and LLM). */
    const relatedTo = (taskId: string, extra: ReadonlyArray<string> = []): ReadonlyArray<string> => {
      const mine = users.get(taskId) ?? new Set<string>()
      const related = new Set(extra.filter((id) => id !== taskId))
      for (const [other, otherUsers] of users) {
        if (other !== taskId && [...otherUsers].some((user) => mine.has(user))) related.add(other)
      }
      return [...related]
    }

    /** `failedOn` hears of the nodes it failed on. */
    const deployOne = (
      spec: UnitTaskSpec,
      placed: ReadonlyArray<PlacedExecutor>,
      onProgress: (message: string) => Effect.Effect<void>,
      failedOn: Set<string>
    ) =>
      Effect.gen(function* () {
        const kind = kinds.get(spec.kind)!
        yield* prepareOn(spec, placed, onProgress, failedOn)
        const groups = yield* groupsOf(placed)
        yield* taskManagers.deploy(spec, kind, groups).pipe(
          Effect.tapError((error) => noteFailure(error, failedOn)),
          Effect.mapError(
            (error) => new DeploymentFailed({ message: `task ${spec.id} failed to start: ${error.message}` })
          )
        )
      }).pipe(Effect.onError(() => Effect.sync(() => holdings.giveAllOf(spec.id))))

    const teardown = (taskId: string) =>
      taskManagers.teardown(taskId).pipe(Effect.ensuring(Effect.sync(() => holdings.giveAllOf(taskId))))

    const perExecutorOf = (spec: UnitTaskSpec) => Math.max(1, kinds.get(spec.kind)!.devicesPerExecutor(spec))

    const { idleControl, wakeReleased, wakeTasksOf } = makeColdStarts({
      taskManagers,
      holdings,
      scales,
      placement,
      lock,
      runtime,
      users,
      devicesPerExecutor: perExecutorOf,
      relatedTo,
      changed: (taskId) => changedAt.set(taskId, Date.now())
    })
    taskManagers.controlIdle(idleControl)

    /**
     * Places the new tasks and starts them, all or none. Where every new task goes is decided at
     * once, so that an app's tasks land together; a task scaled before a restart gets its
     * executors back when they all fit on free devices, else one. A task's one executor shares a
     * CPU device when no device is free. `failedOn` hears of the nodes a start failed on.
     */
    const placeAndStart = (
      fresh: ReadonlyArray<UnitTaskSpec>,
      ids: ReadonlyArray<string>,
      onProgress: (message: string) => Effect.Effect<void>,
      failedOn: Set<string>
    ) =>
      Effect.gen(function* () {
        const requestsAt = (executorsOf: (spec: UnitTaskSpec) => number, share: boolean) =>
          fresh.map((spec) => ({
            task: spec.id,
            executors: executorsOf(spec),
            devicesPerExecutor: perExecutorOf(spec),
            related: relatedTo(spec.id, ids),
            preferred: preferredFor(spec.id),
            share
          }))
        const scaled = fresh.filter((spec) => scales.executorsOf(spec.id) > 1)
        const placed = yield* placeExecutors(
          requestsAt((spec) => scales.executorsOf(spec.id), scaled.length === 0)
        ).pipe(
          Effect.catchTag("DevicesExhausted", (error) =>
            scaled.length === 0
              ? Effect.fail(error)
              : Effect.zipRight(
                  Effect.logWarning(
                    `task(s) ${scaled.map((spec) => `${spec.id} (${scales.executorsOf(spec.id)} executors)`).join(", ")} do not fit at the scale they had (${error.message}): starting one executor each`
                  ),
                  placeExecutors(requestsAt(() => 1, true))
                )
          )
        )
        yield* logPlacement(placed)
        // The new tasks start side by side; if one fails, every one that started is torn down.
        yield* Effect.forEach(
          fresh,
          (spec) =>
            Effect.zipRight(
              onProgress(`deploying task ${spec.name} (${spec.id})`),
              deployOne(
                spec,
                placed.filter((executor) => executor.task === spec.id),
                onProgress,
                failedOn
              )
            ),
          { concurrency: "unbounded", discard: true }
        ).pipe(
          Effect.onError(() =>
            Effect.forEach(fresh, (spec) => teardown(spec.id), { discard: true }).pipe(
              Effect.ensuring(Effect.sync(() => fresh.forEach((spec) => holdings.giveAllOf(spec.id))))
            )
          )
        )
        placement.startedOn(placed)
      })

    /**
     * `placeAndStart`, placed again without the nodes a start failed on while others have room:
     * each node is given one chance per deployment, so that a node that cannot start what it is
     * given (or lies about its devices) does not fail every registration.
     */
    const deployFresh = (
      fresh: ReadonlyArray<UnitTaskSpec>,
      ids: ReadonlyArray<string>,
      onProgress: (message: string) => Effect.Effect<void>,
      tried: ReadonlySet<string>
    ): Effect.Effect<void, DevicesExhausted | DeploymentFailed> =>
      Effect.gen(function* () {
        const failedOn = new Set<string>()
        const attempt = yield* Effect.either(placeAndStart(fresh, ids, onProgress, failedOn))
        if (Either.isRight(attempt)) return
        const newly = [...failedOn].filter((node) => !tried.has(node))
        if (newly.length === 0) return yield* Effect.fail(attempt.left)
        yield* onProgress(`${attempt.left.message}; placing again, avoiding node(s) ${newly.join(", ")}`)
        return yield* deployFresh(fresh, ids, onProgress, new Set([...tried, ...newly]))
      })

    /**
     * `user` now uses `specs`; deploys those not yet deployed, all or none. An app with no tasks
     * waits for nothing. `released`: those whose executors stop when idle are deployed released,
     * their executors started by their first call (apps brought back when the platform starts).
     */
    const acquire = (
      user: string,
      specs: ReadonlyArray<UnitTaskSpec>,
      onProgress: (message: string) => Effect.Effect<void>,
      released = false
    ): Effect.Effect<void, NoExecutorForKind | DevicesExhausted | DeploymentFailed> =>
      specs.length === 0
        ? Effect.void
        : lock.withPermits(1)(
            Effect.gen(function* () {
              for (const spec of specs) {
                if (!kinds.has(spec.kind)) return yield* new NoExecutorForKind({ kind: spec.kind, taskId: spec.id })
              }
              const undeployed = specs.filter((spec) => taskManagers.get(spec.id) === undefined)
              for (const spec of specs) {
                if (!undeployed.includes(spec))
                  yield* onProgress(`task ${spec.name} (${spec.id}) is already deployed; sharing it`)
              }
              const idle = released
                ? undeployed.filter((spec) => idleReleaseAfterS(spec.config, config.idleReleaseS ?? 0) > 0)
                : []
              for (const spec of idle) {
                yield* onProgress(`task ${spec.name} (${spec.id}) is deployed released: its first call starts it`)
                yield* taskManagers.deployReleased(spec, kinds.get(spec.kind)!)
              }
              const fresh = undeployed.filter((spec) => !idle.includes(spec))
              if (fresh.length > 0)
                yield* deployFresh(
                  fresh,
                  specs.map((spec) => spec.id),
                  onProgress,
                  new Set()
                ).pipe(Effect.onError(() => Effect.forEach(idle, (spec) => teardown(spec.id), { discard: true })))
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
              toldShort.delete(spec.id)
              return Effect.zipRight(teardown(spec.id), scales.forget(spec.id))
            }),
          { discard: true }
        )
      )

    /**
     * Adds devices to a task (new executors, on free devices; when none is free, on CPU devices
     * other tasks hold, as the autoscaler shares them, never one the task holds: a second executor
     * there would add no cores), or takes some away: those executors drain first.
     */
    const scale = (taskId: string, deltaDevices: number) =>
      Effect.suspend(() => {
        const task = taskManagers.get(taskId)
        if (task === undefined || task.state === "ready" || task.state === "deploying")
          return lock.withPermits(1)(scaleNow(taskId, deltaDevices, "when-full"))
        return deltaDevices > 0
          ? wakeReleased(task)
          : Effect.fail(new BadRequest({ message: `task ${taskId} is ${task.state}: it has no executor to take away` }))
      })

    /**
     * `sharing`: "when-full", the executors may share CPU devices other tasks hold when none is
     * free; or only those devices (rebalancing chose them); or none.
     */
    const scaleNow = (taskId: string, deltaDevices: number, sharing?: "when-full" | PlacementRequest["shareOn"]) =>
      Effect.gen(function* () {
        const task = taskManagers.get(taskId)
        if (task === undefined) return yield* new TaskNotFound({ taskId })
        const perExecutor = perExecutorOf(task.spec)
        if (deltaDevices > 0) {
          const request: PlacementRequest = {
            task: taskId,
            executors: Math.ceil(deltaDevices / perExecutor),
            devicesPerExecutor: perExecutor,
            related: relatedTo(taskId),
            ...(sharing === undefined || sharing === "when-full" ? {} : { share: true, shareOn: sharing })
          }
          const placed = yield* placeExecutors([request]).pipe(
            Effect.catchTag("DevicesExhausted", (error) =>
              sharing === "when-full" ? placeExecutors([{ ...request, share: true }]) : Effect.fail(error)
            )
          )
          yield* logPlacement(placed)
          yield* Effect.gen(function* () {
            yield* prepareOn(task.spec, placed, () => Effect.void)
            yield* taskManagers
              .grow(taskId, yield* groupsOf(placed))
              .pipe(Effect.tapError((error) => noteFailure(error)))
          }).pipe(
            Effect.mapError(
              (error) => new DeploymentFailed({ message: `task ${taskId} could not grow: ${error.message}` })
            ),
            Effect.onError(() => Effect.sync(() => holdings.give(taskId, placed)))
          )
        } else {
          return yield* shrinkNow(taskId, Math.ceil(-deltaDevices / perExecutor))
        }
        yield* scales.set(taskId, task.wanted)
        changedAt.set(taskId, Date.now())
      })

    /** Fewer executors of a task: how many (its latest), or which; they drain, then their devices are free. */
    const shrinkNow = (taskId: string, executors: number | ReadonlyArray<string>) =>
      Effect.gen(function* () {
        const task = taskManagers.get(taskId)
        if (task === undefined) return yield* new TaskNotFound({ taskId })
        const leaving = typeof executors === "number" ? executors : executors.length
        if (leaving >= task.executors().length) {
          return yield* new BadRequest({
            message: `task ${taskId} has ${task.executors().length} executor(s); it keeps at least one (unregister its apps to stop it)`
          })
        }
        const freed = yield* taskManagers.shrink(taskId, executors)
        holdings.give(taskId, freed)
        yield* scales.set(taskId, task.wanted)
        changedAt.set(taskId, Date.now())
      })

    /**
     * Gives every task short of executors (it lost some with a node) new ones where there is
     * room: free devices, or, for a task left with none, one executor on a shared CPU device. A
     * task that finds no room is told once and tried again on the next change.
     */
    const reconcile = Effect.gen(function* () {
      for (const task of taskManagers.list()) {
        if (task.state !== "ready") continue
        const missing = task.wanted - task.executors().length
        if (missing <= 0) {
          toldShort.delete(task.spec.id)
          continue
        }
        const request = {
          task: task.spec.id,
          executors: missing,
          devicesPerExecutor: perExecutorOf(task.spec),
          related: relatedTo(task.spec.id)
        }
        const attempt = yield* placeExecutors([request]).pipe(
          Effect.catchTag("DevicesExhausted", (error) =>
            task.executors().length === 0
              ? placeExecutors([{ ...request, executors: 1, share: true }])
              : Effect.fail(error)
          ),
          Effect.either
        )
        if (Either.isLeft(attempt)) {
          const message = attempt.left.message
          if (toldShort.get(task.spec.id) !== message) {
            toldShort.set(task.spec.id, message)
            yield* Effect.logWarning(
              `task ${task.spec.id} runs ${task.executors().length} of ${task.wanted} executor(s) and has no room for the rest: ${message}`
            )
          }
          continue
        }
        const placed = attempt.right
        yield* logPlacement(placed)
        yield* Effect.gen(function* () {
          yield* prepareOn(task.spec, placed, () => Effect.void)
          yield* taskManagers
            .grow(task.spec.id, yield* groupsOf(placed), true)
            .pipe(Effect.tapError((error) => noteFailure(error)))
          toldShort.delete(task.spec.id)
          yield* Effect.logInfo(`task ${task.spec.id} has its ${task.wanted} executor(s) again`)
        }).pipe(
          Effect.catchAll((error) =>
            Effect.zipRight(
              Effect.sync(() => holdings.give(task.spec.id, placed)),
              Effect.logWarning(`task ${task.spec.id} could not replace its executors: ${error.message}`)
            )
          )
        )
      }
    })

    /** A node's executors are gone: they leave their tasks, and the tasks are made whole elsewhere. */
    const nodeGone = (name: string, reason: string) =>
      lock.withPermits(1)(
        Effect.gen(function* () {
          const dropped = yield* taskManagers.dropNode(name)
          holdings.dropNode(name)
          if (dropped.length > 0) {
            yield* Effect.logWarning(
              `node ${name} is gone (${reason}): its executors of ${[...new Set(dropped.map((entry) => entry.taskId))].join(", ")} left their tasks; replacing them`
            )
          }
          yield* reconcile
        })
      )

    const unsubscribe = registry.subscribe((event) => {
      const work = event._tag === "Gone" ? nodeGone(event.name, event.reason) : lock.withPermits(1)(reconcile)
      Runtime.runFork(runtime)(work)
    })
    yield* Effect.addFinalizer(() => Effect.sync(unsubscribe))

    const rebalancing = makeRebalanceMoves({
      taskManagers,
      holdings,
      placementNodes,
      devicesPerExecutor: perExecutorOf,
      relatedTo,
      changedAt: (taskId) => changedAt.get(taskId),
      grow: scaleNow,
      shrink: shrinkNow
    })

    /**
     * Runs `plan` on the fleet as it stands, under the lock: no deployment, scaling or move is
     * half done while a rebalancing round reads the tasks and plans its moves.
     */
    const survey = <A>(plan: (fleet: Fleet) => A): Effect.Effect<A> =>
      lock.withPermits(1)(Effect.sync(() => plan(rebalancing.fleet())))

    /** Makes one move a round planned, under the lock for its own drains and start only. */
    const move = (planned: Move) => lock.withPermits(1)(rebalancing.make(planned))

    const listings = makeListings({
      role: config.role,
      engineDefaults: config.engineDefaults,
      registry,
      taskManagers,
      holdings,
      usersOf: (taskId) => users.get(taskId) ?? []
    })

    return {
      acquire,
      release,
      scale,
      wakeTasksOf,
      ...listings,
      rebalanceMoves: rebalancing.counts,
      survey,
      move
    }
  }),
  dependencies: [TaskManagers.Default, ExecutorKinds.Default, NodeRegistry.Default]
}) {}
