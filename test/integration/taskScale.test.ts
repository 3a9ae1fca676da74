import { mkdtemp, readFile, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { chatRequest, streamedText } from "../support/colorChatRequest.js"
import {
  appReady,
  eventually,
  invoke,
  makeStateDir,
  readyWithin,
  removeStateDir,
  repoRoot,
  type RunningPlatform,
  runCli,
  startPlatform
} from "../support/platform.js"

/**
 * `cornserve tasks scale ID ±N` on the real binary: a task grows and shrinks, its scale is kept in
 * the state dir and comes back after a restart (or one executor, said so, when the devices are no
 * longer there), and bad input is told. `cornserve tasks profile ID` shows what the task's calls
 * have measured.
 */

interface TaskRow {
  readonly id: string
  readonly name: string
  readonly state: string
  readonly devices: ReadonlyArray<string>
  readonly executors: ReadonlyArray<{ readonly healthy: boolean }>
}

describe("cornserve tasks scale and profile: by hand, kept across restarts, measured from calls", () => {
  let platform: RunningPlatform
  let stateDir: string
  let modelDir: string
  /** Set once color_chat is registered: later starts wait for it to come back. */
  let encoderId = ""

  /** The most executors color_chat has here: its LLM's, its audio encoder's and two of its image encoder's. */
  const executors = 4
  /** The platform on `devices`, once color_chat (registered, or brought back) is ready. */
  const start = (devices: string) =>
    startPlatform({
      args: ["--devices", devices],
      env: { CORNSERVE_MODEL_DIR: modelDir },
      stateDir,
      ...(encoderId === "" ? {} : { ready: ({ url }) => appReady(url, "color_chat", executors) })
    })
  const cli = (args: ReadonlyArray<string>) => runCli(args, { CORNSERVE_GATEWAY_URL: platform.url })
  const encoder = async () =>
    ((await (await fetch(`${platform.url}/tasks/list`)).json()) as { tasks: Array<TaskRow> }).tasks.find(
      (task) => task.id === encoderId
    )
  const readyEncoder = () =>
    eventually(
      async () => {
        const task = await encoder()
        return task?.state === "ready" && task.executors.every((executor) => executor.healthy) ? task : undefined
      },
      readyWithin(2),
      "the encoder's executors ready"
    )
  const storedScales = async () =>
    JSON.parse(await readFile(join(stateDir, "task-scale.json"), "utf8")) as { tasks: Record<string, number> }

  beforeAll(async () => {
    stateDir = await makeStateDir()
    modelDir = await mkdtemp(join(tmpdir(), "cornserve-models-"))
    platform = await start("cpu:0,cpu:1,cpu:2,cpu:3")
    const registered = await cli(["app", "register", join(repoRoot, "examples", "color_chat.ts")])
    expect(registered.code, registered.stderr).toBe(0)
    const listed = ((await (await fetch(`${platform.url}/tasks/list`)).json()) as { tasks: Array<TaskRow> }).tasks
    encoderId = listed.find((task) => task.name.startsWith("encoder-image"))!.id
  }, readyWithin(executors))

  afterAll(async () => {
    await platform?.stop()
    await removeStateDir(stateDir)
    await rm(modelDir, { recursive: true, force: true })
  })

  it(
    "adds a device to a task and says where its executors run; the scale is written to the state dir",
    async () => {
      const scaled = await cli(["tasks", "scale", encoderId, "+1"])
      expect(scaled.code, scaled.stderr).toBe(0)
      expect(scaled.stdout).toMatch(new RegExp(`^task ${encoderId} has 2 executor\\(s\\) on cpu:\\d, cpu:\\d\\n$`))
      expect((await readyEncoder()).executors).toHaveLength(2)
      expect((await storedScales()).tasks).toEqual({ [encoderId]: 2 })
    },
    readyWithin(executors)
  )

  it(
    "brings the task back at its scale after a restart",
    async () => {
      expect(await platform.stop()).toBe(0)
      platform = await start("cpu:0,cpu:1,cpu:2,cpu:3")
      expect((await readyEncoder()).executors).toHaveLength(2)
      expect(await streamedText(await invoke(platform.url, "color_chat", chatRequest))).toBe("red")
    },
    readyWithin(executors)
  )

  it(
    "starts one executor, and says so, when the scale no longer fits the devices",
    async () => {
      expect(await platform.stop()).toBe(0)
      platform = await start("cpu:0,cpu:1,cpu:2")
      expect((await readyEncoder()).executors).toHaveLength(1)
      expect(platform.output()).toMatch(
        new RegExp(
          `task\\(s\\) ${encoderId} \\(2 executors\\) do not fit at the scale they had .*: starting one executor each`
        )
      )
      expect(await streamedText(await invoke(platform.url, "color_chat", chatRequest))).toBe("red")
    },
    readyWithin(executors)
  )

  it(
    "takes a device away, and forgets the scale once the task is back at one executor",
    async () => {
      expect(await platform.stop()).toBe(0)
      platform = await start("cpu:0,cpu:1,cpu:2,cpu:3")
      expect((await readyEncoder()).executors).toHaveLength(2)
      const scaled = await cli(["tasks", "scale", encoderId, "-1"])
      expect(scaled.code, scaled.stderr).toBe(0)
      expect(scaled.stdout).toMatch(/has 1 executor\(s\) on cpu:\d\n$/)
      expect((await storedScales()).tasks).toEqual({})
    },
    readyWithin(executors)
  )

  it("profiles a task from its calls: the curve per executor count, the recent rate, over HTTP and the CLI", async () => {
    const llm = ((await (await fetch(`${platform.url}/tasks/list`)).json()) as { tasks: Array<TaskRow> }).tasks.find(
      (task) => task.name.startsWith("llm")
    )!
    for (let round = 0; round < 5; round++) {
      const answers = await Promise.all(
        Array.from({ length: 4 }, () => invoke(platform.url, "color_chat", chatRequest).then(streamedText))
      )
      expect(answers).toEqual(["red", "red", "red", "red"])
    }
    const profile = (await (await fetch(`${platform.url}/tasks/${llm.id}/profile`)).json()) as {
      calls: number
      failed: number
      recent: { calls: number; callsPerSecond: number }
      curves: Array<{ executors: number; points: Array<{ levelTo: number; calls: number; p50Ms: number }> }>
    }
    expect(profile.calls).toBeGreaterThanOrEqual(20)
    expect(profile.failed).toBe(0)
    expect(profile.recent.calls).toBeGreaterThanOrEqual(20)
    expect(profile.recent.callsPerSecond).toBeGreaterThan(0)
    expect(profile.curves.map((curve) => curve.executors)).toEqual([1])
    const points = profile.curves[0]!.points
    expect(points.reduce((sum, point) => sum + point.calls, 0)).toBe(profile.calls)
    for (const point of points) expect(point.p50Ms).toBeGreaterThan(0)

    const shown = await cli(["tasks", "profile", llm.id])
    expect(shown.code, shown.stderr).toBe(0)
    expect(shown.stdout).toMatch(
      new RegExp(`^task ${llm.id} \\(llm-tiny-color-vlm, llm\\): 1 executor\\(s\\); \\d+ call\\(s\\), 0 failed`)
    )
    expect(shown.stdout).toMatch(/EXECUTORS\s+LOAD\s+CALLS\s+P50 MS\s+P95 MS\s+P99 MS\s+CALLS\/S\n1\s+/)
    const json = await cli(["tasks", "profile", llm.id, "--json"])
    expect(JSON.parse(json.stdout)).toMatchObject({ taskId: llm.id, executors: 1 })
    // By the name `tasks list` prints, as well as by id.
    const byName = await cli(["tasks", "profile", "llm-tiny-color-vlm", "--json"])
    expect(byName.code, byName.stderr).toBe(0)
    expect(JSON.parse(byName.stdout)).toMatchObject({ taskId: llm.id })
    const unknown = await cli(["tasks", "profile", "llm-nonexistent"])
    expect(unknown.code).not.toBe(0)
    expect(unknown.stderr).toMatch(/no task "llm-nonexistent" is deployed/)
  })

  it("bad input: an unknown task, the last executor, a change that is not a number", async () => {
    const unknown = await cli(["tasks", "scale", "encoder-nonexistent", "+1"])
    expect(unknown.code).not.toBe(0)
    expect(unknown.stderr).toMatch(/encoder-nonexistent/)
    const last = await cli(["tasks", "scale", encoderId, "-1"])
    expect(last.code).not.toBe(0)
    expect(last.stderr).toMatch(/keeps at least one/)
    const word = await cli(["tasks", "scale", encoderId, "more"])
    expect(word.code).toBe(2)
    expect(word.stderr).toMatch(/"more" is not a change of devices such as \+1 or -1/)
    const tooMany = await cli(["tasks", "scale", encoderId, "+9"])
    expect(tooMany.code).not.toBe(0)
    expect(tooMany.stderr).toMatch(/free: local 1 of 4/)
    expect((await encoder())!.executors).toHaveLength(1)
  })
})
