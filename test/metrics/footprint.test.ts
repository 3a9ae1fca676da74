import { type ChildProcess, spawn } from "node:child_process"
import { once } from "node:events"
import { readFileSync, rmSync } from "node:fs"
import { createInterface } from "node:readline"
import { afterEach, describe, expect, it } from "vitest"
import {
  type Footprint,
  footprintBytes,
  formatFootprint,
  measureFootprint,
  processTree
} from "../../src/metrics/Footprint.js"

const MiB = 1024 * 1024

/**
 * A process that holds 32 MiB of its own, maps a /dev/shm file named after it of which it wrote
 * 4 MiB (the file's size is 64 MiB), and has a child of its own; it prints its child's pid once
 * all that is done, and keeps every buffer reachable so that no collection frees one while the
 * test reads it.
 */
const holder = `
const { openSync, ftruncateSync, writeSync } = require("node:fs")
const { spawn } = require("node:child_process")
const mmap = require("@riaskov/mmap-io")
const own = Buffer.alloc(32 * 1024 * 1024, 1)
const path = "/dev/shm/cornserve-test-footprint-" + process.pid
const fd = openSync(path, "wx+", 0o600)
ftruncateSync(fd, 64 * 1024 * 1024)
const written = Buffer.alloc(4 * 1024 * 1024, 2)
writeSync(fd, written, 0, 4 * 1024 * 1024, 0)
const mapped = mmap.map(64 * 1024 * 1024, 3, mmap.MAP_SHARED, fd, 0)
let sum = 0
for (let at = 0; at < 4 * 1024 * 1024; at += 4096) sum += mapped[at]
const child = spawn("sleep", ["600"], { stdio: "ignore" })
// Everything stays reachable: a collection between the test's two reads would free megabytes.
globalThis.held = [own, written, mapped, child]
console.log(child.pid, sum, own.length)
setInterval(() => {}, 1 << 30)
`

const pssOf = (pid: number) =>
  Number(/^Pss:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/smaps_rollup`, "utf8"))![1]) * 1024

describe("Footprint", () => {
  let started: ChildProcess | undefined

  afterEach(async () => {
    if (started?.pid !== undefined) rmSync(`/dev/shm/cornserve-test-footprint-${started.pid}`, { force: true })
    if (started !== undefined && started.exitCode === null && started.signalCode === null) {
      process.kill(-started.pid!, "SIGKILL")
      await once(started, "exit")
    }
    started = undefined
  })

  it("counts a process tree's PSS and the /dev/shm files it made, shared memory once", async () => {
    started = spawn(process.execPath, ["-e", holder], { stdio: ["ignore", "pipe", "inherit"], detached: true })
    const [line] = (await once(createInterface({ input: started.stdout! }), "line")) as [string]
    const grandchild = Number(line.split(" ")[0])
    const root = started.pid!
    expect([...processTree(root)].sort()).toEqual([root, grandchild].sort())

    const footprint = measureFootprint(root)
    expect(footprint.processes).toBe(2)
    expect(footprint.unreadable).toBe(0)
    expect(footprint.sharedMemoryFiles).toBe(1)
    // What was written into the file, not its size.
    expect(footprint.sharedMemoryBytes).toBe(4 * MiB)
    expect(footprint.processBytes).toBeGreaterThanOrEqual(32 * MiB)
    // The 4 MiB the process maps are in its PSS, and counted by the file instead. A live Node
    // process's PSS moves by some pages between two reads (its heap, the pages it shares with the
    // child), so the two reads agree within 1 MiB, well under the 4 MiB that must not be counted twice.
    const later = pssOf(root) + pssOf(grandchild) - 4 * MiB
    expect(Math.abs(footprint.processBytes - later)).toBeLessThanOrEqual(1 * MiB)
    expect(footprintBytes(footprint)).toBe(footprint.processBytes + 4 * MiB)
  })

  it("finds nothing of a tree that has exited", async () => {
    started = spawn(process.execPath, ["-e", "0"], { stdio: "ignore", detached: true })
    const root = started.pid!
    await once(started, "exit")
    expect(processTree(root)).toEqual([])
    expect(measureFootprint(root)).toEqual({
      processes: 0,
      processBytes: 0,
      sharedMemoryBytes: 0,
      sharedMemoryFiles: 0,
      unreadable: 0
    })
  })

  it("reads as one line", () => {
    const footprint: Footprint = {
      processes: 14,
      processBytes: 572 * MiB,
      sharedMemoryBytes: 40 * MiB,
      sharedMemoryFiles: 3,
      unreadable: 0
    }
    expect(formatFootprint(footprint)).toBe("14 processes, 612 MiB (PSS, 40 MiB of it in /dev/shm)")
    expect(formatFootprint({ ...footprint, unreadable: 2 })).toBe(
      "14 processes, 612 MiB (PSS, 40 MiB of it in /dev/shm; 2 of the processes not readable)"
    )
  })
})
