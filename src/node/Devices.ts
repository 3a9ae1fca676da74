import { availableParallelism } from "node:os"

/** A device one executor worker runs on: a slice of CPU cores, or one CUDA GPU. */
export interface Device {
  readonly id: string
  readonly type: "cpu" | "cuda"
  readonly index: number
}

const devicePattern = /^(cpu|cuda):(\d+)$/

/**
 * Parses `--devices`: "auto" (one cpu device per core), or a comma list such as "cpu:0,cpu:1".
 * Throws with the offending entry named.
 */
export const parseDevices = (spec: string): ReadonlyArray<Device> => {
  if (spec.trim() === "auto") {
    return Array.from({ length: availableParallelism() }, (_, index) => ({ id: `cpu:${index}`, type: "cpu", index }))
  }
  const devices = spec
    .split(",")
    .map((entry) => entry.trim())
    .filter((entry) => entry.length > 0)
    .map((entry): Device => {
      const match = devicePattern.exec(entry)
      if (match === null)
        throw new Error(`--devices: "${entry}" is not a device: write auto, or a list of cpu:N and cuda:N`)
      return { id: entry, type: match[1] as Device["type"], index: Number(match[2]) }
    })
  const ids = new Set(devices.map((device) => device.id))
  if (ids.size !== devices.length) throw new Error(`--devices names a device twice: ${spec}`)
  return devices
}
