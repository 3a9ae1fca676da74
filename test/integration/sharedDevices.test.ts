/**
 * Shared CPU devices against the real binary: `cornserve serve` with no flags (one single-thread
 * CPU device per core) registers every example app, whose five tasks share the devices when there
 * are fewer devices than tasks, and every app answers. Each executor is started with its share of
 * its device's threads.
 */
import { mkdtemp, rm } from "node:fs/promises"
import { availableParallelism, tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { chatRequest, streamedText } from "../support/colorChatRequest.js"
import { descendants } from "../support/executors.js"
import { invoke, removeStateDir, repoRoot, runCli, type RunningPlatform, startPlatform } from "../support/platform.js"

interface DeviceRow {
  readonly id: string
  readonly type: string
  readonly threads: number
  readonly task: string | null
  readonly tasks: ReadonlyArray<string>
}

describe("shared CPU devices", () => {
  let platform: RunningPlatform
  let modelDir: string
  let env: Record<string, string>

  beforeAll(async () => {
    modelDir = await mkdtemp(join(tmpdir(), "cornserve-models-"))
    // No --devices: the default, as a user's first `cornserve serve` on a laptop.
    platform = await startPlatform({ env: { CORNSERVE_MODEL_DIR: modelDir } })
    env = { CORNSERVE_GATEWAY_URL: platform.url }
  }, 60_000)

  afterAll(async () => {
    expect(await platform?.stop()).toBe(0)
    if (platform !== undefined) await removeStateDir(platform.stateDir)
    await rm(modelDir, { recursive: true, force: true })
  })

  it("registers color_chat and color_studio with no flags, and both answer", async () => {
    for (const name of ["color_chat", "color_studio"]) {
      const registered = await runCli(["app", "register", join(repoRoot, "examples", `${name}.ts`)], env)
      expect(registered.code, registered.stderr).toBe(0)
    }
    expect(await streamedText(await invoke(platform.url, "color_chat", chatRequest))).toBe("red")
    const studio = await invoke(platform.url, "color_studio", chatRequest)
    expect(studio.status).toBe(200)
    const painted = (await studio.json()) as { colour: string; image: string }
    expect(painted.colour).toBe("red")
    expect(Buffer.from(painted.image, "base64").subarray(1, 4).toString()).toBe("PNG")
  }, 180_000)

  it("lists which tasks share which device, and starts each executor with its share of the threads", async () => {
    const { tasks, devices } = (await (await fetch(`${platform.url}/tasks/list`)).json()) as {
      tasks: Array<{ id: string; devices: Array<string> }>
      devices: Array<DeviceRow>
    }
    expect(tasks).toHaveLength(5)
    expect(devices).toHaveLength(availableParallelism())
    for (const device of devices) {
      expect(device).toMatchObject({ type: "cpu", threads: 1 })
      expect(device.task).toBe(device.tasks[0] ?? null)
    }
    // Every task holds exactly one device, a task never twice the same one, and the tasks spread out.
    const holdings = devices.flatMap((device) => device.tasks.map((task) => `${task}@${device.id}`))
    expect(new Set(holdings).size).toBe(holdings.length)
    expect(holdings.map((holding) => holding.split("@")[0]).sort()).toEqual(tasks.map((task) => task.id).sort())
    for (const task of tasks) expect(task.devices).toEqual([devices.find((d) => d.tasks.includes(task.id))!.id])
    const counts = devices.map((device) => device.tasks.length)
    expect(Math.max(...counts) - Math.min(...counts)).toBeLessThanOrEqual(1)
    if (devices.length < tasks.length) expect(Math.max(...counts)).toBeGreaterThan(1)

    // A one-thread device shared by several executors gives each one thread.
    const routers = descendants(platform.process.pid!).filter((entry) => entry.command.includes("internal executor "))
    expect(routers).toHaveLength(5)
    for (const router of routers) expect(router.command).toMatch(/--threads-per-device 1(\s|$)/)

    const nodes = await runCli(["nodes", "list"], env)
    expect(nodes.code, nodes.stderr).toBe(0)
    const shared = devices.find((device) => device.tasks.length > 1)
    if (shared !== undefined) expect(nodes.stdout).toContain(`${shared.id} (${shared.tasks.join(", ")})`)
  })
})
