import { availableParallelism } from "node:os"

/**
 * A device executor workers run on: CPU cores with a budget of threads, or one CUDA GPU. A GPU is
 * one executor's alone; a CPU device may be shared by the executors of several tasks, each given a
 * share of its threads (see Placement).
 */
export interface Device {
  readonly id: string
  readonly type: "cpu" | "cuda"
  readonly index: number
  /** The ONNX Runtime threads a CPU device has to give (1 for a GPU). */
  readonly threads: number
}

const devicePattern = /^(cpu|cuda):(\d+)(?:\/(\d+))?$/

/** The most threads one CPU device may be given. */
const maxThreads = 1024

/**
 * Parses `--devices`: "auto" (one cpu device of one thread per core), or a comma list such as
 * "cpu:0,cpu:1" or "cpu:0/4,cuda:0", where `/T` gives a CPU device a budget of T threads (default
 * 1). Throws with the offending entry named.
 */
export const parseDevices = (spec: string): ReadonlyArray<Device> => {
  if (spec.trim() === "auto") {
    return Array.from({ length: availableParallelism() }, (_, index) => ({
      id: `cpu:${index}`,
      type: "cpu",
      index,
      threads: 1
    }))
  }
  const devices = spec
    .split(",")
    .map((entry) => entry.trim())
    .filter((entry) => entry.length > 0)
    .map((entry): Device => {
      const match = devicePattern.exec(entry)
      if (match === null)
        throw new Error(
          `--devices: "${entry}" is not a device: write auto, or a list of cpu:N (cpu:N/T for T threads) and cuda:N`
        )
      const type = match[1] as Device["type"]
      const threads = match[3] === undefined ? 1 : Number(match[3])
      if (match[3] !== undefined && type !== "cpu")
        throw new Error(`--devices: "${entry}": only a cpu device has a thread budget`)
      if (threads < 1 || threads > maxThreads)
        throw new Error(`--devices: "${entry}": a cpu device has 1 to ${maxThreads} threads`)
      return { id: `${type}:${match[2]}`, type, index: Number(match[2]), threads }
    })
  const ids = new Set(devices.map((device) => device.id))
  if (ids.size !== devices.length) throw new Error(`--devices names a device twice: ${spec}`)
  return devices
}
