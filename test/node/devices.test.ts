import { describe, expect, it } from "vitest"
import { parseDevices } from "../../src/node/Devices.js"

describe("--devices", () => {
  it("reads CPU devices with their thread budgets, and GPUs", () => {
    expect(parseDevices("cpu:0, cpu:1/4 ,cuda:0")).toEqual([
      { id: "cpu:0", type: "cpu", index: 0, threads: 1 },
      { id: "cpu:1", type: "cpu", index: 1, threads: 4 },
      { id: "cuda:0", type: "cuda", index: 0, threads: 1 }
    ])
  })

  it("gives auto one single-thread CPU device per core", () => {
    const devices = parseDevices("auto")
    expect(devices.length).toBeGreaterThan(0)
    devices.forEach((device, index) => expect(device).toEqual({ id: `cpu:${index}`, type: "cpu", index, threads: 1 }))
  })

  it("refuses what it cannot read, naming the entry", () => {
    expect(() => parseDevices("cpu:0,gpu:1")).toThrow('"gpu:1" is not a device')
    expect(() => parseDevices("cuda:0/2")).toThrow('"cuda:0/2": only a cpu device has a thread budget')
    expect(() => parseDevices("cpu:0/0")).toThrow("1 to 1024 threads")
    expect(() => parseDevices("cpu:0/99999")).toThrow("1 to 1024 threads")
    expect(() => parseDevices("cpu:0,cpu:0/2")).toThrow("names a device twice")
  })
})
