import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { descendants } from "../support/executors.js"
import {
  adminHeaders,
  appState,
  eventually,
  invoke,
  removeStateDir,
  repoRoot,
  type RunningPlatform,
  runCli,
  startPlatform
} from "../support/platform.js"

/**
 * Scale to zero on the real binary: an app whose task sets `idleReleaseS: 1` has its executor
 * stopped once no call came for a second; calls that arrive together then start it again once and
 * all answer; /metrics, `tasks list` and `tasks scale` tell and act on it; after a restart the app
 * comes back released, its executor started by its first call; an app unregistered while its task
 * is released goes cleanly.
 */

interface TaskRow {
  readonly id: string
  readonly name: string
  readonly state: string
  readonly devices: ReadonlyArray<string>
  readonly executors: ReadonlyArray<{ readonly id: string; readonly healthy: boolean }>
  readonly idleRelease: {
    readonly releaseAfterS: number
    readonly releases: number
    readonly lastColdStartS: number | null
  }
}

describe("idle executors released: stopped after their idle time, started again by the next call", () => {
  let platform: RunningPlatform
  let modelDir: string
  const cli = (args: ReadonlyArray<string>) => runCli(args, { CORNSERVE_GATEWAY_URL: platform.url })
  const tasks = async () =>
    ((await (await fetch(`${platform.url}/tasks/list`)).json()) as { tasks: Array<TaskRow> }).tasks
  const executorProcesses = () =>
    descendants(platform.process.pid!).filter((process) => / internal executor /.test(process.command))
  const allReleased = () =>
    eventually(async () => {
      const listed = await tasks()
      return listed.length === 1 && listed.every((task) => task.state === "released" && task.executors.length === 0)
        ? listed
        : undefined
    }, 120_000)
  /** Embeds two texts through the app: answers how many vectors came back. */
  const embed = async () => {
    const response = await invoke(platform.url, "idle_embed", JSON.stringify({ input: ["warm today", "cold"] }))
    const answer = (await response.json()) as { readonly data?: ReadonlyArray<unknown>; readonly error?: unknown }
    if (response.status !== 200) throw new Error(`the call answered ${response.status}: ${JSON.stringify(answer)}`)
    return answer.data?.length
  }
  /** Registers the fixture app `test/fixtures/apps/<name>.ts` under its own name. */
  const register = (name: string) =>
    cli(["app", "register", join(repoRoot, "test", "fixtures", "apps", `${name}.ts`), "--name", name])
  const metrics = async () => (await fetch(`${platform.url}/metrics`, { headers: adminHeaders() })).text()

  beforeAll(async () => {
    modelDir = await mkdtemp(join(tmpdir(), "cornserve-models-"))
    platform = await startPlatform({
      args: ["--devices", "cpu:0"],
      env: { CORNSERVE_MODEL_DIR: modelDir }
    })
    const registered = await register("idle_embed")
    expect(registered.code, registered.stderr).toBe(0)
    // A platform and an executor to start: on a busy machine, minutes.
  }, 240_000)

  afterAll(async () => {
    await platform?.stop()
    if (platform !== undefined) await removeStateDir(platform.stateDir)
    await rm(modelDir, { recursive: true, force: true })
  }, 60_000)

  it("answers a call, then stops the task's executor and frees its device once no call came for its idle time", async () => {
    expect(await embed()).toBe(2)
    const released = await allReleased()
    expect(released.map((task) => task.idleRelease.releaseAfterS)).toEqual([1])
    expect(released.every((task) => task.devices.length === 0)).toBe(true)
    await eventually(async () => (executorProcesses().length === 0 ? true : undefined), 60_000)
    const { devices } = (await (await fetch(`${platform.url}/tasks/list`)).json()) as {
      devices: Array<{ readonly task: string | null }>
    }
    expect(devices.map((device) => device.task)).toEqual([null])
    const listed = await cli(["tasks", "list"])
    expect(listed.code, listed.stderr).toBe(0)
    expect(listed.stdout).toMatch(/released\s+after 1 s/)
    expect(await metrics()).toMatch(/cornserve_task_released\{task="text-embedder-[0-9a-f]+"\} 1/)
  }, 240_000)

  it("starts it again for the next calls: calls that arrive together wait for one cold start and all answer", async () => {
    await allReleased()
    const before = await metrics()
    const answers = await Promise.all(Array.from({ length: 4 }, embed))
    expect(answers).toEqual([2, 2, 2, 2])
    const after = await metrics()
    for (const task of await tasks()) {
      const count = (text: string) =>
        Number(new RegExp(`cornserve_task_cold_start_seconds_count\\{task="${task.id}"\\} (\\d+)`).exec(text)?.[1])
      expect(count(after) - count(before)).toBe(1)
      expect(task.idleRelease.lastColdStartS).toBeGreaterThan(0)
      expect(after).toMatch(new RegExp(`cornserve_task_releases_total\\{task="${task.id}"\\} [1-9]`))
    }
    expect((await cli(["tasks", "list"])).stdout).toMatch(/last cold start \d+\.\d s/)
  }, 240_000)

  it("brings a released task back on `tasks scale +1`; taking from a released task is refused", async () => {
    const [embedder] = await allReleased()
    const refused = await cli(["tasks", "scale", embedder!.id, "-1"])
    expect(refused.code).not.toBe(0)
    expect(refused.stderr).toMatch(/released: it has no executor to take away/)
    const scaled = await cli(["tasks", "scale", embedder!.id, "+1"])
    expect(scaled.code, scaled.stderr).toBe(0)
    expect(scaled.stdout).toMatch(new RegExp(`task ${embedder!.id} has 1 executor\\(s\\) on cpu:\\d`))
    // Idle again, it is released again.
    await allReleased()
  }, 240_000)

  it("brings the app back released after a restart: no executor starts until its first call, which answers", async () => {
    expect(await platform.stop()).toBe(0)
    platform = await startPlatform({
      args: ["--devices", "cpu:0"],
      env: { CORNSERVE_MODEL_DIR: modelDir },
      stateDir: platform.stateDir
    })
    await eventually(async () => ((await appState(platform.url, "idle_embed")) === "ready" ? true : undefined), 120_000)
    const [embedder] = await tasks()
    expect(embedder).toMatchObject({ state: "released", executors: [] })
    expect(executorProcesses()).toEqual([])
    expect(await embed()).toBe(2)
    expect((await tasks())[0]!.idleRelease.lastColdStartS).toBeGreaterThan(0)
  }, 240_000)

  it("unregisters an app while its task starts again for a call: the call is answered or told why, nothing is left running", async () => {
    await allReleased()
    const call = invoke(platform.url, "idle_embed", JSON.stringify({ input: ["warm"] }))
    await eventually(async () => ((await tasks())[0]?.state === "starting" ? true : undefined), 60_000)
    const unregistered = await cli(["app", "unregister", "idle_embed"])
    expect(unregistered.code, unregistered.stderr).toBe(0)
    const answer = await call
    const body = (await answer.json()) as { readonly data?: unknown; readonly error?: { readonly message: string } }
    if (answer.status === 200) expect(body.data).toHaveLength(1)
    else expect(body.error?.message).toBeTruthy()
    expect(await tasks()).toEqual([])
    expect(executorProcesses()).toEqual([])
    const registered = await register("idle_embed")
    expect(registered.code, registered.stderr).toBe(0)
  }, 240_000)

  it("unregisters an app whose task is released: the task goes, nothing is left running", async () => {
    await allReleased()
    const unregistered = await cli(["app", "unregister", "idle_embed"])
    expect(unregistered.code, unregistered.stderr).toBe(0)
    expect(await tasks()).toEqual([])
    expect(executorProcesses()).toEqual([])
  }, 120_000)

  it("starts an app's released tasks together: a call to one starts the others too", async () => {
    const registered = await register("idle_pair")
    expect(registered.code, registered.stderr).toBe(0)
    const bothReleased = () =>
      eventually(async () => {
        const listed = await tasks()
        return listed.length === 2 && listed.every((task) => task.state === "released") ? listed : undefined
      }, 120_000)
    const [one, other] = await bothReleased()
    const response = await invoke(platform.url, "idle_pair", JSON.stringify({ input: ["both"] }))
    expect(response.status, await response.text()).toBe(200)
    // The app called one task; both have started again (the one it did not call starts on its own time).
    const counts = async () => {
      const text = await metrics()
      return [one!, other!].map((task) =>
        Number(new RegExp(`cornserve_task_cold_start_seconds_count\\{task="${task.id}"\\} (\\d+)`).exec(text)?.[1])
      )
    }
    await eventually(async () => ((await counts()).every((count) => count >= 1) ? true : undefined), 120_000)
    const unregistered = await cli(["app", "unregister", "idle_pair"])
    expect(unregistered.code, unregistered.stderr).toBe(0)
    expect(await tasks()).toEqual([])
  }, 240_000)
})
