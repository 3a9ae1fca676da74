import * as Effect from "effect/Effect"
import type { ServeOptions } from "../../config/ServeConfig.js"
import type { Device } from "../../node/Devices.js"
import type { NodeRegistry, NodeSummary } from "../cluster/NodeRegistry.js"
import { TaskNotFound } from "../errors.js"
import type { IdleStats } from "../task-manager/IdleRelease.js"
import type { ExecutorSummary, TaskManagers } from "../task-manager/TaskManagers.js"
import { type TaskSettings, taskSettings } from "../task-manager/TaskSettings.js"
import type { DeviceHoldings } from "./DeviceHoldings.js"

export interface TaskSummary {
  readonly id: string
  readonly kind: string
  readonly name: string
  readonly config: unknown
  /** What its executors run with: its config's engine settings over `serve`'s defaults. */
  readonly settings: TaskSettings
  readonly state: string
  readonly usedBy: ReadonlyArray<string>
  readonly devices: ReadonlyArray<string>
  readonly executors: ReadonlyArray<ExecutorSummary>
  /** Calls refused since deployment because the task was full. */
  readonly callsShed: number
  /** Its executors stopped when idle and started again for a call (scale to zero). */
  readonly idleRelease: IdleStats
}

/** A device as the listings show it: the first task holding it (null: free), and every task sharing it. */
export interface DeviceListing {
  readonly id: string
  readonly type: string
  readonly threads: number
  readonly task: string | null
  readonly tasks: ReadonlyArray<string>
}

/** A node as /nodes/list shows it: what holds each of its devices. */
export interface NodeListing extends Omit<NodeSummary, "devices"> {
  readonly devices: ReadonlyArray<DeviceListing>
}

/**
 * What /tasks/list, /devices, /nodes/list and a task's profile show of the deployed tasks and the
 * devices they hold: read-only views of the resource manager's state.
 */
export const makeListings = (options: {
  readonly role: ServeOptions["role"]
  readonly engineDefaults: ServeOptions["engineDefaults"]
  readonly registry: NodeRegistry
  readonly taskManagers: TaskManagers
  readonly holdings: DeviceHoldings
  /** The users (apps) of a deployed task. */
  readonly usersOf: (taskId: string) => Iterable<string>
}) => {
  const { role, engineDefaults, registry, taskManagers, holdings, usersOf } = options
  const deviceName = (node: string, device: string) => (role === "all" ? device : `${node}/${device}`)

  const tasks = (): ReadonlyArray<TaskSummary> =>
    taskManagers.list().map((task) => ({
      id: task.spec.id,
      kind: task.spec.kind,
      name: task.spec.name,
      config: task.spec.config,
      settings: taskSettings(task.spec, engineDefaults),
      state: task.state,
      usedBy: [...usersOf(task.spec.id)].map((user) => user.split("#")[0]!),
      devices: task.executors().flatMap((executor) => executor.devices.map((id) => deviceName(executor.node, id))),
      executors: task.executors(),
      callsShed: task.shed,
      idleRelease: task.idleStats()
    }))

  /** A device as listed: `task` the first of its tasks (null: free), `tasks` all of them. */
  const deviceListing = (node: string, device: Device): Omit<DeviceListing, "id"> => {
    const tasks = holdings.holdersOf(node, device.id)
    return { type: device.type, threads: device.threads, task: tasks[0] ?? null, tasks }
  }

  const devices = (): ReadonlyArray<DeviceListing> =>
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

  return { tasks, devices, nodes, profile }
}
