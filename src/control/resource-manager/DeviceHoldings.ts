import type { Device } from "../../node/Devices.js"
import type { Holding, PlacedExecutor } from "./Placement.js"

/** The tasks holding a device of a node, in the order they took it. */
export type Holders = (node: string, device: string) => ReadonlyArray<string>

/**
 * Which task holds which device of which node: one holding per task per device, so that a CPU
 * device shared by several tasks has one for each. The resource manager takes holdings for what
 * placement chose and gives them back when executors drain, fail to start or leave with their
 * node; the listings and the rebalancer read them. Plain state: the resource manager changes it
 * under its lock only.
 */
export interface DeviceHoldings {
  /** Every holding, in the order taken: what placement counts as used. */
  readonly all: () => ReadonlyArray<Holding>
  /** The devices of placed executors are now their tasks'. */
  readonly take: (placed: ReadonlyArray<PlacedExecutor>) => void
  /** `taskId` gives back the devices of these executors (they drained, or never started). */
  readonly give: (
    taskId: string,
    executors: ReadonlyArray<{ readonly node: string; readonly devices: ReadonlyArray<Device> }>
  ) => void
  /** Every device of a task, torn down or never started, is free again. */
  readonly giveAllOf: (taskId: string) => void
  /** A node is gone: nothing holds its devices. */
  readonly dropNode: (node: string) => void
  readonly holdersOf: Holders
  /** The holders of every device as they stand, read in one pass (for a round that asks for every device's). */
  readonly snapshot: () => Holders
}

const holdingKey = (node: string, device: string, task: string) => `${node}/${device}/${task}`

export const makeDeviceHoldings = (): DeviceHoldings => {
  const byKey = new Map<string, Holding>()
  return {
    all: () => [...byKey.values()],
    take: (placed) => {
      for (const executor of placed)
        for (const device of executor.devices)
          byKey.set(holdingKey(executor.node, device.id, executor.task), {
            node: executor.node,
            device: device.id,
            task: executor.task
          })
    },
    give: (taskId, executors) => {
      for (const executor of executors)
        for (const device of executor.devices) byKey.delete(holdingKey(executor.node, device.id, taskId))
    },
    giveAllOf: (taskId) => {
      for (const [key, holding] of byKey) if (holding.task === taskId) byKey.delete(key)
    },
    dropNode: (node) => {
      for (const [key, holding] of byKey) if (holding.node === node) byKey.delete(key)
    },
    holdersOf: (node, device) =>
      [...byKey.values()]
        .filter((holding) => holding.node === node && holding.device === device)
        .map((holding) => holding.task),
    snapshot: () => {
      const byDevice = new Map<string, Array<string>>()
      for (const holding of byKey.values()) {
        const key = `${holding.node}/${holding.device}`
        byDevice.set(key, [...(byDevice.get(key) ?? []), holding.task])
      }
      return (node, device) => byDevice.get(`${node}/${device}`) ?? []
    }
  }
}

/** An executor on a device that other tasks hold too. */
export const sharesADevice = (
  executor: { readonly node: string; readonly devices: ReadonlyArray<string> },
  holders: Holders
): boolean => executor.devices.some((device) => holders(executor.node, device).length > 1)
