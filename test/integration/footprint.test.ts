import { readdirSync, statSync } from "node:fs"
import { join } from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { arenaFilePrefix } from "../../src/sidecar/Arena.js"
import { descendants } from "../support/executors.js"
import { eventually, type RunningPlatform, startPlatform } from "../support/platform.js"

const MiB = 1024 * 1024
const arenaBytes = 256 * MiB
/** A bare platform starts its sidecar and nothing else: well within this, however busy the machine. */
const readyWithinMs = 180_000

describe("cornserve serve: what the platform costs", () => {
  let platform: RunningPlatform | undefined

  afterAll(async () => {
    if (platform !== undefined) expect(await platform.stop()).toBe(0)
  }, readyWithinMs)

  it(
    "prints, once ready, its time to ready and its footprint; the sidecar's arena holds no memory until it is used",
    async () => {
      platform = await startPlatform({ args: ["--devices", "cpu:0", "--sidecar-arena-bytes", String(arenaBytes)] })
      const running = platform
      const [, readyS, processes, totalMiB, shmMiB] = await eventually(
        async () =>
          /^cornserve: ready in ([\d.]+) s[^\n]*\ncornserve: the platform holds (\d+) processes, (\d+) MiB \(PSS, (\d+) MiB of it in \/dev\/shm\)$/m.exec(
            running.output()
          ) ?? undefined,
        readyWithinMs
      )
      expect(Number(readyS)).toBeGreaterThan(0)
      // serve and its sidecar at least.
      expect(Number(processes)).toBeGreaterThanOrEqual(2)
      expect(Number(totalMiB)).toBeGreaterThan(0)
      expect(Number(shmMiB)).toBe(0)

      const sidecar = descendants(running.process.pid!).find((entry) => entry.command.includes(" internal sidecar "))
      expect(sidecar).toBeDefined()
      const arena = readdirSync("/dev/shm").find(
        (name) => name.startsWith(arenaFilePrefix) && name.endsWith(`-${sidecar!.pid}`)
      )
      expect(arena).toBeDefined()
      const file = statSync(join("/dev/shm", arena!))
      expect(file.size).toBe(arenaBytes)
      expect(file.blocks).toBe(0)
    },
    readyWithinMs
  )
})
