import * as Effect from "effect/Effect"
import type { UnitTaskSpec } from "../../app-runtime/driver/protocol.js"
import { type BadRequest, type DeploymentFailed, DevicesExhausted, TaskNotFound } from "../errors.js"
import type { TaskManager, TaskManagers } from "../task-manager/TaskManagers.js"
import { type DeviceHoldings, sharesADevice } from "./DeviceHoldings.js"
import { executorsToGive, freeDevices, type PlacementNode, type PlacementRequest } from "./Placement.js"
import type { Move, SharedDevice } from "./Rebalance.js"

/** A ready task on its devices, as a rebalancing round plans with it (its load is the rebalancer's to read). */
export interface TaskOnDevices {
  readonly task: TaskManager
  readonly devicesPerExecutor: number
  /** Its executors on devices that other tasks hold too (they free no device when they go). */
  readonly sharing: number
  /** It runs executors, all on CPU devices: it may grow onto a CPU device other tasks hold. */
  readonly mayShare: boolean
  /** When it last grew or shrank, ms; undefined: never. */
  readonly changedAt: number | undefined
}

/** The ready tasks and the devices of the ready nodes, as they stand between two changes. */
export interface Fleet {
  readonly tasks: ReadonlyArray<TaskOnDevices>
  /** Devices no task holds, node by node. */
  readonly freeByNode: ReadonlyArray<number>
  /** Every CPU device of the ready nodes, with the tasks holding it. */
  readonly cpuDevices: ReadonlyArray<SharedDevice>
}

export type MoveError = TaskNotFound | BadRequest | DevicesExhausted | DeploymentFailed

/**
 * The resource manager's side of rebalancing: the fleet a round plans with, and the moves it
 * asks for made with the resource manager's own scaling, each counted by its kind. The caller
 * holds the resource manager's lock for both.
 */
export const makeRebalanceMoves = (options: {
  readonly taskManagers: TaskManagers
  readonly holdings: DeviceHoldings
  readonly placementNodes: () => ReadonlyArray<PlacementNode>
  readonly devicesPerExecutor: (spec: UnitTaskSpec) => number
  /** Tasks that exchange data with a task: placement puts its executors near theirs. */
  readonly relatedTo: (taskId: string) => ReadonlyArray<string>
  readonly changedAt: (taskId: string) => number | undefined
  /** `shareOn`: the new executors may share those CPU devices when none is free. */
  readonly grow: (
    taskId: string,
    deltaDevices: number,
    shareOn?: PlacementRequest["shareOn"]
  ) => Effect.Effect<void, MoveError>
  /** Fewer executors of a task: how many (its latest), or which. */
  readonly shrink: (taskId: string, executors: number | ReadonlyArray<string>) => Effect.Effect<void, MoveError>
}) => {
  const { taskManagers, holdings, placementNodes, devicesPerExecutor, relatedTo, grow, shrink } = options
  const moves = new Map<string, number>()

  const fleet = (): Fleet => {
    const holders = holdings.snapshot()
    const nodes = placementNodes()
    const cpu = new Set(
      nodes.flatMap((node) =>
        node.devices.filter((device) => device.type === "cpu").map((device) => `${node.name}/${device.id}`)
      )
    )
    const tasks = taskManagers
      .list()
      .filter((task) => task.state === "ready")
      .map((task): TaskOnDevices => {
        const executors = task.executors()
        return {
          task,
          devicesPerExecutor: devicesPerExecutor(task.spec),
          sharing: executors.filter((executor) => sharesADevice(executor, holders)).length,
          mayShare:
            executors.length > 0 &&
            executors.every((executor) => executor.devices.every((device) => cpu.has(`${executor.node}/${device}`))),
          changedAt: options.changedAt(task.spec.id)
        }
      })
    const freeByNode = [...freeDevices(nodes, holdings.all()).values()].map((devices) => devices.length)
    const cpuDevices = nodes
      .filter((node) => node.state === "ready")
      .flatMap((node) =>
        node.devices
          .filter((device) => device.type === "cpu")
          .map((device) => ({ node: node.name, id: device.id, tasks: holders(node.name, device.id) }))
      )
    return { tasks, freeByNode, cpuDevices }
  }

  /** Devices per executor of a task the round planned for; it may have been torn down since. */
  const devicesOf = (taskId: string) =>
    Effect.suspend(() => {
      const task = taskManagers.get(taskId)
      return task === undefined
        ? Effect.fail(new TaskNotFound({ taskId }))
        : Effect.succeed(devicesPerExecutor(task.spec))
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
      const given = executorsToGive(placementNodes(), holdings.all(), offers, request)
      if (given === undefined)
        return yield* new DevicesExhausted({
          message: `no node would hold an executor of ${move.to} (${request.devicesPerExecutor} device(s) on one node) once ${[...new Set(move.from)].join(", ")} gave theirs; nothing was taken`
        })
      return given
    })

  const count = (kind: string) => moves.set(kind, (moves.get(kind) ?? 0) + 1)

  const make = (move: Move): Effect.Effect<void, MoveError> =>
    Effect.gen(function* () {
      switch (move._tag) {
        case "Release":
          yield* shrink(move.task, 1)
          count("released")
          break
        case "Grow":
          yield* grow(move.task, yield* devicesOf(move.task))
          count("free_device")
          break
        case "Take": {
          const given = yield* givenFor(move)
          for (const executor of given) yield* shrink(executor.task, [executor.id])
          yield* grow(move.to, yield* devicesOf(move.to))
          count("taken_from_slack")
          break
        }
        case "Share":
          yield* grow(move.task, yield* devicesOf(move.task), { node: move.node, devices: move.devices })
          count("shared_device")
          break
        case "Unshare": {
          const task = taskManagers.get(move.task)
          if (task === undefined) return yield* new TaskNotFound({ taskId: move.task })
          // Its latest executor on a shared device; the other tasks there may have gone since the round planned.
          const leaving = task
            .executors()
            .filter((executor) => sharesADevice(executor, holdings.holdersOf))
            .at(-1)
          if (leaving === undefined)
            return yield* Effect.logInfo(`rebalancing: ${move.task} shares no device any more; nothing goes back`)
          yield* shrink(move.task, [leaving.id])
          count("unshared")
          break
        }
      }
    })

  /** Devices moved by rebalancing, by kind of move. */
  const counts = (): ReadonlyMap<string, number> => new Map(moves)

  return { fleet, make, counts }
}
