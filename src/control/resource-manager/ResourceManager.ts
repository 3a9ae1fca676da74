import { Duration, Effect, Either, Runtime, Schedule } from "effect"
import type { UnitTaskSpec } from "../../app-runtime/driver/protocol.js"
import { ExecutorKinds } from "../task-manager/ExecutorKinds.js"
import type { Device } from "../../node/Devices.js"
import { NodeRegistry, type NodeSummary } from "../cluster/NodeRegistry.js"
import { BadRequest, DeploymentFailed, DevicesExhausted, NoExecutorForKind, TaskNotFound } from "../errors.js"
import { ServeConfig } from "../../config/ServeConfig.js"
import { type ExecutorSummary, TaskManagers } from "../task-manager/TaskManagers.js"
import { capacityOf, sustainedOf } from "../task-manager/TaskProfile.js"
import {
  executorsToGive,
  freeDevices,
  type Holding,
  type PlacedExecutor,
  type PlacementNode,
  type PlacementRequest,
  place
} from "./Placement.js"
import { defaultRebalancePolicy, type Move, planMoves, type RebalanceTask } from "./Rebalance.js"
import { makeScaleStore } from "./ScaleStore.js"

export interface TaskSummary {
  readonly id: string
  readonly kind: string
  readonly name: string
  readonly config: unknown
  readonly state: string
  readonly usedBy: ReadonlyArray<string>
  readonly devices: ReadonlyArray<string>
  readonly executors: ReadonlyArray<ExecutorSummary>
  /** Calls refused since deployment because the task was full. */
  readonly callsShed: number
}

/** A node as /nodes/list shows it: what holds each of its devices. */
export interface NodeListing extends Omit<NodeSummary, "devices"> {
  readonly devices: ReadonlyArray<{ readonly id: string; readonly type: string; readonly task: string | null }>
}

/** One task's hold on one device (a shared CPU device has one per task). */
const holdingKey = (node: string, device: string, task: string) => `${node}/${device}/${task}`

/** The tasks holding a device of a node. */
type Holders = (node: string, device: string) => ReadonlyArray<string>

/**
 * Which unit tasks are deployed, who uses them, and which devices of which nodes they hold.
 * Deployment is usage-counted: equal tasks (same id) deploy once and are torn down when their
 * last user goes. A request to use several tasks either deploys them all or rolls back every one
 * it deployed. Where executors go is the placement policy's answer (Placement.ts). When a node is
 * lost, its executors leave their tasks at once and are replaced on free devices of ready nodes;
 * a task that finds no room stays short and is made whole when room appears (a node joins or
 * comes back).
 */
export class ResourceManager extends Effect.Service<ResourceManager>()("cornserve/ResourceManager", {
  scoped: Effect.gen(function* () {
    const config = yield* ServeConfig
    const taskManagers = yield* TaskManagers
    const registry = yield* NodeRegistry
    const { kinds } = yield* ExecutorKinds
    const runtime = yield* Effect.runtime<never>()
    /** Which task holds each device, by `node/device`. */
    const allocated = new Map<string, Holding>()
    const users = new Map<string, Set<string>>()
    const lock = yield* Effect.makeSemaphore(1)
    const scales = yield* makeScaleStore(config.stateDir)
    /** Tasks told to be short of executors, so that the same shortfall is logged once. */
    const toldShort = new Map<string, string>()

    const placementNodes = (): ReadonlyArray<PlacementNode> =>
      registry.nodes().map((node) => ({ name: node.name, state: node.state, devices: node.devices }))

    /** Tasks that share a user with `taskId`: they exchange data with it (an app's encoder and LLM). */
    const relatedTo = (taskId: string, extra: ReadonlyArray<string> = []): ReadonlyArray<string> => {
      const mine = users.get(taskId) ?? new Set<string>()
      const related = new Set(extra.filter((id) => id !== taskId))
      for (const [other, otherUsers] of users) {
        if (other !== taskId && [...otherUsers].some((user) => mine.has(user))) related.add(other)
      }
      return [...related]
    }

    /** Device groups of ready nodes that already run an executor of this task (kept across a restart). */
    const preferredFor = (taskId: string) =>
      registry
        .nodes()
        .filter((node) => node.state === "ready")
        .flatMap((node) =>
          [...node.executors.values()]
            .filter((executor) => executor.taskId === taskId)
            .map((executor) => ({ node: node.name, devices: executor.devices }))
        )

    const placeExecutors = (
      requests: ReadonlyArray<PlacementRequest>
    ): Effect.Effect<ReadonlyArray<PlacedExecutor>, DevicesExhausted> =>
      Effect.suspend(() =>
        Either.match(place(placementNodes(), [...allocated.values()], requests), {
          onLeft: (shortfall) => Effect.fail(new DevicesExhausted({ message: shortfall.message })),
          onRight: (placed) => {
            for (const executor of placed)
              for (const device of executor.devices)
                allocated.set(holdingKey(executor.node, device.id, executor.task), {
                  node: executor.node,
                  device: device.id,
                  task: executor.task
                })
            return Effect.succeed(placed)
          }
        })
      )

    const freeHoldings = (
      taskId: string,
      placed: ReadonlyArray<{ readonly node: string; readonly devices: ReadonlyArray<Device> }>
    ) => {
      for (const group of placed)
        for (const device of group.devices) allocated.delete(holdingKey(group.node, device.id, taskId))
    }

    const freeTaskDevices = (taskId: string) => {
      for (const [key, holding] of allocated) if (holding.task === taskId) allocated.delete(key)
    }

    /** The placed executors as the task manager starts them: each with its node's handle. */
    const groupsOf = (placed: ReadonlyArray<PlacedExecutor>) =>
      Effect.forEach(placed, (executor) => {
        const node = registry.handle(executor.node)
        return node === undefined
          ? Effect.fail(new DeploymentFailed({ message: `node ${executor.node} is gone` }))
          : Effect.succeed({ node, devices: executor.devices, threads: executor.threads })
      })

    /** Where executors went: on a cluster, each; on one node, those that share a device. */
    const logPlacement = (placed: ReadonlyArray<PlacedExecutor>) =>
      Effect.forEach(
        placed.filter((executor) => config.role !== "all" || executor.reason.startsWith("shares")),
        (executor) =>
          Effect.logInfo(
            `placing an executor of task ${executor.task} on node ${executor.node} (${executor.devices.map((device) => device.id).join(", ")}, ${executor.threads} thread(s) each): ${executor.reason}`
          ),
        { discard: true }
      )

    /** Makes the task's model present on every node it is placed on. */
    const prepareOn = (
      spec: UnitTaskSpec,
      placed: ReadonlyArray<PlacedExecutor>,
      onProgress: (message: string) => Effect.Effect<void>
    ) =>
      Effect.suspend(() => {
        const kind = kinds.get(spec.kind)!
        const prepare = kind.prepare
        if (prepare === undefined) return Effect.void
        const nodes = [...new Set(placed.map((executor) => executor.node))]
        return Effect.forEach(
          nodes,
          (name) => {
            const node = registry.handle(name)
            return node === undefined
              ? Effect.fail(new DeploymentFailed({ message: `task ${spec.id} failed to start: node ${name} is gone` }))
              : prepare(spec, node, onProgress).pipe(
                  Effect.mapError(
                    (error) => new DeploymentFailed({ message: `task ${spec.id} failed to start: ${error.message}` })
                  )
                )
          },
          { concurrency: "unbounded", discard: true }
        )
      })

    const deployOne = (
      spec: UnitTaskSpec,
      placed: ReadonlyArray<PlacedExecutor>,
      onProgress: (message: string) => Effect.Effect<void>
    ) =>
      Effect.gen(function* () {
        const kind = kinds.get(spec.kind)!
        yield* prepareOn(spec, placed, onProgress)
        const groups = yield* groupsOf(placed)
        yield* taskManagers
          .deploy(spec, kind, groups)
          .pipe(
            Effect.mapError(
              (error) => new DeploymentFailed({ message: `task ${spec.id} failed to start: ${error.message}` })
            )
          )
      }).pipe(Effect.onError(() => Effect.sync(() => freeTaskDevices(spec.id))))

    const teardown = (taskId: string) =>
      taskManagers.teardown(taskId).pipe(Effect.ensuring(Effect.sync(() => freeTaskDevices(taskId))))

    const perExecutorOf = (spec: UnitTaskSpec) => Math.max(1, kinds.get(spec.kind)!.devicesPerExecutor(spec))

    /** `user` now uses `specs`; deploys those not yet deployed, all or none. */
    const acquire = (
      user: string,
      specs: ReadonlyArray<UnitTaskSpec>,
      onProgress: (message: string) => Effect.Effect<void>
    ) =>
      lock.withPermits(1)(
        Effect.gen(function* () {
          for (const spec of specs) {
            if (!kinds.has(spec.kind)) return yield* new NoExecutorForKind({ kind: spec.kind, taskId: spec.id })
          }
          const fresh = specs.filter((spec) => taskManagers.get(spec.id) === undefined)
          for (const spec of specs) {
            if (!fresh.includes(spec))
              yield* onProgress(`task ${spec.name} (${spec.id}) is already deployed; sharing it`)
          }
          const ids = specs.map((spec) => spec.id)
          // Where every new task goes is decided at once, so that an app's tasks land together; a
          // task scaled before a restart gets its executors back when they all fit on free devices,
          // else one. A task's one executor shares a CPU device when no device is free.
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
                  onProgress
                )
              ),
            {
              concurrency: "unbounded",
              discard: true
            }
          ).pipe(
            Effect.onError(() =>
              Effect.forEach(fresh, (spec) => teardown(spec.id), { discard: true }).pipe(
                Effect.ensuring(Effect.sync(() => fresh.forEach((spec) => freeTaskDevices(spec.id))))
              )
            )
          )
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

    /** When each task last grew or shrank: the rebalancing policy leaves it alone for a while. */
    const changedAt = new Map<string, number>()

    /**
     * Adds devices (new executors, on free devices: a task's second executor on a device it shares
     * would add no cores) to a task, or takes some away: those executors drain first.
     */
    const scale = (taskId: string, deltaDevices: number) => lock.withPermits(1)(scaleNow(taskId, deltaDevices))

    /** `shareOn`: the executors may share those CPU devices (rebalancing chose them) when none is free. */
    const scaleNow = (taskId: string, deltaDevices: number, shareOn?: PlacementRequest["shareOn"]) =>
      Effect.gen(function* () {
        const task = taskManagers.get(taskId)
        if (task === undefined) return yield* new TaskNotFound({ taskId })
        const perExecutor = perExecutorOf(task.spec)
        if (deltaDevices > 0) {
          const placed = yield* placeExecutors([
            {
              task: taskId,
              executors: Math.ceil(deltaDevices / perExecutor),
              devicesPerExecutor: perExecutor,
              related: relatedTo(taskId),
              ...(shareOn === undefined ? {} : { share: true, shareOn })
            }
          ])
          yield* logPlacement(placed)
          yield* Effect.gen(function* () {
            yield* prepareOn(task.spec, placed, () => Effect.void)
            yield* taskManagers.grow(taskId, yield* groupsOf(placed))
          }).pipe(
            Effect.mapError(
              (error) => new DeploymentFailed({ message: `task ${taskId} could not grow: ${error.message}` })
            ),
            Effect.onError(() => Effect.sync(() => freeHoldings(taskId, placed)))
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
        freeHoldings(taskId, freed)
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
          yield* taskManagers.grow(task.spec.id, yield* groupsOf(placed), true)
          toldShort.delete(task.spec.id)
          yield* Effect.logInfo(`task ${task.spec.id} has its ${task.wanted} executor(s) again`)
        }).pipe(
          Effect.catchAll((error) =>
            Effect.zipRight(
              Effect.sync(() => freeHoldings(task.spec.id, placed)),
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
          for (const [key, holding] of allocated) if (holding.node === name) allocated.delete(key)
          if (dropped.length > 0) {
            yield* Effect.logWarning(
              `node ${name} is gone (${reason}): its executors of ${[...new Set(dropped.map((entry) => entry.taskId))].join(", ")} left their tasks; replacing them`
            )
          }
          yield* reconcile
        })
      )

    // Rebalancing (--autoscale): each round reads every task's mean load and arrival rate since the
    // last round, and what one executor sustains from its profile (recorded ahead of time, else
    // measured online once it shows saturation), then makes the moves the policy asks for.
    const moves = new Map<string, number>()
    const lastReading = new Map<string, { readonly area: number; readonly arrived: number; readonly at: number }>()
    const rebalanceTasks = (holders: Holders): ReadonlyArray<RebalanceTask> => {
      const now = performance.now()
      const cpu = new Set(
        registry
          .nodes()
          .flatMap((node) =>
            node.devices.filter((device) => device.type === "cpu").map((device) => `${node.name}/${device.id}`)
          )
      )
      return taskManagers
        .list()
        .filter((task) => task.state === "ready")
        .map((task) => {
          const area = task.loadArea()
          const online = task.profile()
          // Counted as calls ask for an executor: a round in which no call ends still sees its arrivals.
          const arrived = task.arrived
          const previous = lastReading.get(task.spec.id)
          lastReading.set(task.spec.id, { area, arrived, at: now })
          const span = previous === undefined ? 0 : now - previous.at
          const bounds = task.spec.config as { readonly minExecutors?: unknown; readonly maxExecutors?: unknown }
          const executors = task.executors()
          const recorded = task.recorded()
          const profiles = recorded === undefined ? [online] : [recorded, online]
          return {
            id: task.spec.id,
            executors: executors.length,
            devicesPerExecutor: perExecutorOf(task.spec),
            sharing: executors.filter((executor) => sharesADevice(executor, holders)).length,
            mayShare:
              executors.length > 0 &&
              executors.every((executor) => executor.devices.every((device) => cpu.has(`${executor.node}/${device}`))),
            minExecutors: typeof bounds?.minExecutors === "number" ? Math.max(1, bounds.minExecutors) : 1,
            maxExecutors: typeof bounds?.maxExecutors === "number" ? bounds.maxExecutors : Number.POSITIVE_INFINITY,
            meanLoad: span <= 0 ? 0 : (area - previous!.area) / span,
            rate: span <= 0 ? undefined : ((arrived - previous!.arrived) * 1000) / span,
            capacity: profiles.map(capacityOf).find((capacity) => capacity !== undefined),
            // Online measurements where there are any, else the recorded ones, per executor count.
            sustained: [
              ...new Map(
                profiles.flatMap((profile) =>
                  sustainedOf(profile).map((curve) => [curve.executors, curve.callsPerSecond] as const)
                )
              )
            ],
            changedAt: changedAt.get(task.spec.id)
          }
        })
    }
    /** The tasks holding each device now, read in one pass over the holdings (a round asks for every device's). */
    const holdersNow = (): Holders => {
      const byDevice = new Map<string, Array<string>>()
      for (const holding of allocated.values()) {
        const key = `${holding.node}/${holding.device}`
        byDevice.set(key, [...(byDevice.get(key) ?? []), holding.task])
      }
      return (node, device) => byDevice.get(`${node}/${device}`) ?? []
    }
    /** An executor on a device that other tasks hold too. */
    const sharesADevice = (
      executor: { readonly node: string; readonly devices: ReadonlyArray<string> },
      holders: Holders
    ) => executor.devices.some((device) => holders(executor.node, device).length > 1)
    /** Every CPU device of the ready nodes, with the tasks holding it. */
    const cpuDevices = (holders: Holders) =>
      placementNodes()
        .filter((node) => node.state === "ready")
        .flatMap((node) =>
          node.devices
            .filter((device) => device.type === "cpu")
            .map((device) => ({ node: node.name, id: device.id, tasks: holders(node.name, device.id) }))
        )
    const count = (kind: string) => moves.set(kind, (moves.get(kind) ?? 0) + 1)
    /** Devices per executor of a task the round planned for; it may have been torn down since. */
    const devicesOf = (taskId: string) =>
      Effect.suspend(() => {
        const task = taskManagers.get(taskId)
        return task === undefined ? Effect.fail(new TaskNotFound({ taskId })) : Effect.succeed(perExecutorOf(task.spec))
      })

    /**
     * The executors a Take gives up: for each donor asked, one of its executors (its latest first),
     * chosen so that the bottleneck's executor then fits on one node. None is given up when no
     * choice would make it fit.
     */
    const givenFor = (move: Extract<Move, { _tag: "Take" }>) =>
      Effect.gen(function* () {
        const offers = move.from.map((donor) =>
          (taskManagers.get(donor)?.executors() ?? [])
            .map((executor) => ({ task: donor, id: executor.id, node: executor.node, devices: executor.devices }))
            .reverse()
        )
        const request = {
          task: move.to,
          executors: 1,
          devicesPerExecutor: yield* devicesOf(move.to),
          related: relatedTo(move.to)
        }
        const given = executorsToGive(placementNodes(), [...allocated.values()], offers, request)
        if (given === undefined)
          return yield* new DevicesExhausted({
            message: `no node would hold an executor of ${move.to} (${request.devicesPerExecutor} device(s) on one node) once ${[...new Set(move.from)].join(", ")} gave theirs; nothing was taken`
          })
        return given
      })

    const make = (move: Move) =>
      Effect.gen(function* () {
        switch (move._tag) {
          case "Release":
            yield* shrinkNow(move.task, 1)
            count("released")
            break
          case "Grow":
            yield* scaleNow(move.task, yield* devicesOf(move.task))
            count("free_device")
            break
          case "Take": {
            const given = yield* givenFor(move)
            for (const executor of given) yield* shrinkNow(executor.task, [executor.id])
            yield* scaleNow(move.to, yield* devicesOf(move.to))
            count("taken_from_slack")
            break
          }
          case "Share":
            yield* scaleNow(move.task, yield* devicesOf(move.task), { node: move.node, devices: move.devices })
            count("shared_device")
            break
          case "Unshare": {
            const task = taskManagers.get(move.task)
            if (task === undefined) return yield* new TaskNotFound({ taskId: move.task })
            // Its latest executor on a shared device; the other tasks there may have gone since the round planned.
            const leaving = task
              .executors()
              .filter((executor) => sharesADevice(executor, holdersOf))
              .at(-1)
            if (leaving === undefined)
              return yield* Effect.logInfo(`rebalancing: ${move.task} shares no device any more; nothing goes back`)
            yield* shrinkNow(move.task, [leaving.id])
            count("unshared")
            break
          }
        }
      })

    // A round reads the tasks and plans under the lock, then makes its moves one at a time, each
    // under the lock for its own drain and start only: a registration or a `tasks scale` waits for
    // one move, not for the whole round. A move that fails (a registration took the devices it
    // counted on, say) is logged, and the round goes on with the others.
    const rebalance = Effect.gen(function* () {
      const plan = yield* lock.withPermits(1)(
        Effect.sync(() => {
          const holders = holdersNow()
          const tasksNow = rebalanceTasks(holders)
          const freeByNode = [...freeDevices(placementNodes(), [...allocated.values()]).values()].map(
            (devices) => devices.length
          )
          // A task just changed waits three rounds: its new executor is measured before the next move.
          return planMoves(
            {
              now: Date.now(),
              tasks: tasksNow,
              freeDevices: freeByNode.reduce((sum, count) => sum + count, 0),
              freeByNode,
              cpuDevices: cpuDevices(holders)
            },
            { ...defaultRebalancePolicy, cooldownMs: 3 * (config.autoscaleIntervalMs ?? 0) }
          )
        })
      )
      for (const move of plan) {
        yield* Effect.logInfo(`rebalancing: ${move.reason}`)
        yield* lock
          .withPermits(1)(make(move))
          .pipe(Effect.catchAll((error) => Effect.logWarning(`rebalancing: the move failed: ${error.message}`)))
      }
    })
    if (config.autoscaleIntervalMs !== undefined) {
      yield* rebalance.pipe(
        // A round that dies of a defect is logged; the next round runs all the same.
        Effect.catchAllCause((cause) => Effect.logError("rebalancing: the round failed", cause)),
        Effect.repeat(Schedule.spaced(Duration.millis(config.autoscaleIntervalMs))),
        Effect.forkScoped
      )
    }

    const unsubscribe = registry.subscribe((event) => {
      const work = event._tag === "Gone" ? nodeGone(event.name, event.reason) : lock.withPermits(1)(reconcile)
      Runtime.runFork(runtime)(work)
    })
    yield* Effect.addFinalizer(() => Effect.sync(unsubscribe))

    const deviceName = (node: string, device: string) => (config.role === "all" ? device : `${node}/${device}`)

    const tasks = (): ReadonlyArray<TaskSummary> =>
      taskManagers.list().map((task) => ({
        id: task.spec.id,
        kind: task.spec.kind,
        name: task.spec.name,
        config: task.spec.config,
        state: task.state,
        usedBy: [...(users.get(task.spec.id) ?? [])].map((user) => user.split("#")[0]!),
        devices: task.executors().flatMap((executor) => executor.devices.map((id) => deviceName(executor.node, id))),
        executors: task.executors(),
        callsShed: task.shed
      }))

    /** The tasks holding a device of a node (several on a shared CPU device), in the order they took it. */
    const holdersOf = (node: string, device: string) =>
      [...allocated.values()]
        .filter((holding) => holding.node === node && holding.device === device)
        .map((holding) => holding.task)

    /** A device as listed: `task` the first of its tasks (null: free), `tasks` all of them. */
    const deviceListing = (node: string, device: Device) => {
      const tasks = holdersOf(node, device.id)
      return { type: device.type, threads: device.threads, task: tasks[0] ?? null, tasks }
    }

    const devices = () =>
      registry
        .nodes()
        .flatMap((node) =>
          node.devices.map((device) => ({ id: deviceName(node.name, device.id), ...deviceListing(node.name, device) }))
        )

    const nodes = (): ReadonlyArray<NodeListing> => {
      const byName = new Map(registry.nodes().map((node) => [node.name, node]))
      return registry.list().map((summary) => ({
        ...summary,
        devices: (byName.get(summary.name)?.devices ?? []).map((device) => ({
          id: device.id,
          ...deviceListing(summary.name, device)
        }))
      }))
    }

    /** What a task's calls have shown: its throughput–latency curve per executor count, rate, queues. */
    const profile = (taskId: string) =>
      Effect.suspend(() => {
        const task = taskManagers.get(taskId)
        if (task === undefined) return Effect.fail(new TaskNotFound({ taskId }))
        return Effect.succeed({
          taskId,
          name: task.spec.name,
          kind: task.spec.kind,
          executors: task.executors().length,
          ...task.profile()
        })
      })

    /** Devices moved by rebalancing, by kind of move. */
    const rebalanceMoves = (): ReadonlyMap<string, number> => new Map(moves)

    return { acquire, release, scale, tasks, devices, nodes, profile, rebalanceMoves }
  }),
  dependencies: [TaskManagers.Default, ExecutorKinds.Default, NodeRegistry.Default]
}) {}
