import { spawn } from "node:child_process"
import { existsSync, readdirSync, rmSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { type ColorChatPlatform, colorChatLoad, startColorChat } from "../support/colorChat.js"
import { descendants } from "../support/executors.js"
import { eventually, isAlive, readyWithin } from "../support/platform.js"

/** The shared-memory files whose names end with one of these pids. */
const sharedMemoryFilesOf = (pids: ReadonlySet<number>) =>
  readdirSync("/dev/shm").filter((name) => name.startsWith("cornserve-") && pids.has(Number(/-(\d+)$/.exec(name)?.[1])))

/** The pid of a process that has come and gone. */
const deadPid = () =>
  new Promise<number>((resolve) => {
    const child = spawn(process.execPath, ["-e", ""], { stdio: "ignore" })
    child.once("exit", () => resolve(child.pid!))
  })

describe("cornserve serve killed with SIGKILL under load", () => {
  const started: Array<ColorChatPlatform> = []
  const planted: Array<string> = []

  afterAll(async () => {
    for (const running of started) await running.dispose()
    for (const path of planted) rmSync(path, { force: true })
  })

  it(
    "takes its whole process tree with it, and the next start removes the dead run's shared memory only",
    async () => {
      const first = await startColorChat(`tree-${process.pid}`)
      started.push(first)
      const load = colorChatLoad(first.platform.url, 4)
      await eventually(async () => (load.answers.some((answer) => answer.status === 200) ? true : undefined), 60_000)
      const tree = descendants(first.platform.process.pid!)
      const kinds = tree.map((entry) => /internal (\S+)/.exec(entry.command)?.[1])
      expect(kinds).toEqual(expect.arrayContaining(["sidecar", "executor", "executor-worker"]))
      const treePids = new Set(tree.map((entry) => entry.pid))

      await first.platform.kill()
      // Each child sees its lifeline end at once and stops within a short grace of its own time; on
      // a busy host that time comes late (seconds), so the test waits for the exits rather than
      // holding them to a wall time.
      const survivors = await eventually(
        async () => (tree.some((entry) => isAlive(entry.pid)) ? undefined : []),
        30_000,
        "the killed platform's processes gone"
      ).catch(() => tree.filter((entry) => isAlive(entry.pid)))
      expect(survivors).toEqual([])
      await load.stop()

      // Files as a killed run leaves them, one for a process that is gone and one for a live one.
      const abandoned = join("/dev/shm", `cornserve-batches-${await deadPid()}`)
      const inUse = join("/dev/shm", `cornserve-batches-${process.pid}`)
      for (const path of [abandoned, inUse]) {
        planted.push(path)
        writeFileSync(path, "")
      }

      const second = await startColorChat(`tree-next-${process.pid}`)
      started.push(second)
      expect(sharedMemoryFilesOf(treePids)).toEqual([])
      expect(existsSync(abandoned)).toBe(false)
      expect(existsSync(inUse)).toBe(true)
    },
    // Two platforms, each with color_chat's three executors.
    2 * readyWithin(3)
  )
})
