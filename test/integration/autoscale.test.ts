import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { adminHeaders } from "../support/platform.js"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { chatRequest, streamedText } from "../support/colorChatRequest.js"
import {
  eventually,
  invoke,
  readyWithin,
  removeStateDir,
  repoRoot,
  type RunningPlatform,
  runCli,
  startPlatform
} from "../support/platform.js"

/**
 * `cornserve serve --autoscale` on the real binary: under a steady load of color_chat requests the
 * LLM task is the bottleneck; rebalancing gives it the free device first, then gives the
 * bottleneck of that moment a device taken from a task with slack (the audio encoder, scaled to
 * two executors and sent nothing), never below a task's one executor, and counts and logs each
 * move with its reason. No request fails meanwhile.
 */

interface TaskRow {
  readonly id: string
  readonly name: string
  readonly devices: ReadonlyArray<string>
  readonly executors: ReadonlyArray<{ readonly healthy: boolean }>
}

/**
 * `cornserve serve --autoscale` (a round a second) on `devices` with color_chat registered, for the
 * tests of one describe block; `prepare` runs once it is registered, before the tests.
 */
function autoscaledColorChat(
  devices: string,
  prepare: (platform: AutoscaledColorChat) => Promise<void> = async () => {}
) {
  let platform: RunningPlatform
  let modelDir: string
  const tasks = async () =>
    ((await (await fetch(`${platform.url}/tasks/list`)).json()) as { tasks: Array<TaskRow> }).tasks
  const helpers = {
    env: () => ({ CORNSERVE_GATEWAY_URL: platform.url }),
    output: () => platform.output(),
    tasks,
    named: async (prefix: string) => (await tasks()).find((task) => task.name.startsWith(prefix))!,
    moves: async (kind: string) => {
      const text = await (await fetch(`${platform.url}/metrics`, { headers: adminHeaders() })).text()
      return Number(new RegExp(`^cornserve_rebalance_moves_total\\{kind="${kind}"\\} (\\d+)$`, "m").exec(text)?.[1])
    },
    /** color_chat's answers from eight clients, each sending its next request when answered, until `until` settles. */
    underLoad: async (until: (answers: ReadonlyArray<string>) => Promise<unknown>) => {
      let loading = true
      const answers: Array<string> = []
      const clients = Array.from({ length: 8 }, async () => {
        while (loading) answers.push(await invoke(platform.url, "color_chat", chatRequest).then(streamedText))
      })
      try {
        await until(answers)
      } finally {
        loading = false
        await Promise.all(clients)
      }
      return answers
    }
  }

  // color_chat's three executors, and one more that `prepare` may scale a task to.
  beforeAll(async () => {
    modelDir = await mkdtemp(join(tmpdir(), "cornserve-models-"))
    platform = await startPlatform({
      args: ["--devices", devices, "--autoscale", "--autoscale-interval", "1"],
      env: { CORNSERVE_MODEL_DIR: modelDir }
    })
    const registered = await runCli(["app", "register", join(repoRoot, "examples", "color_chat.ts")], helpers.env())
    expect(registered.code, registered.stderr).toBe(0)
    await prepare(helpers)
  }, readyWithin(4))

  afterAll(async () => {
    await platform?.stop()
    if (platform !== undefined) await removeStateDir(platform.stateDir)
    await rm(modelDir, { recursive: true, force: true })
  })

  return helpers
}

type AutoscaledColorChat = ReturnType<typeof autoscaledColorChat>

describe("cornserve serve --autoscale: devices follow the load", () => {
  const { output, tasks, named, moves, underLoad } = autoscaledColorChat(
    "cpu:0,cpu:1,cpu:2,cpu:3,cpu:4",
    async ({ named, env }) => {
      // The audio encoder, sent nothing, has an executor of slack.
      const scaled = await runCli(["tasks", "scale", (await named("encoder-audio")).id, "+1"], env())
      expect(scaled.code, scaled.stderr).toBe(0)
    }
  )

  it(
    "grows the bottleneck on the free device, then on a device taken from a task with slack",
    async () => {
      expect(await moves("free_device")).toBe(0)
      const llm = await named("llm")
      const image = await named("encoder-image")
      const audio = await named("encoder-audio")
      expect(llm.executors).toHaveLength(1)
      expect(audio.executors).toHaveLength(2)

      // Two moves, each starting an executor.
      const answers = await underLoad(() =>
        eventually(
          async () => ((await moves("taken_from_slack")) >= 1 ? true : undefined),
          readyWithin(2),
          "a device taken from slack"
        )
      )

      expect(answers.length).toBeGreaterThan(0)
      expect(new Set(answers)).toEqual(new Set(["red"]))
      expect(await moves("free_device")).toBeGreaterThanOrEqual(1)
      // A task on color_chat's path was the bottleneck first: the LLM, or on a busy host (where the
      // image's preprocessing waits for the cores) the image encoder as often; the second move went
      // to whichever task was then, on the audio encoder's second device. A bottleneck is measured
      // by its calls in flight, or by its profile once that shows what an executor sustains.
      const pressed =
        "(?:\\d+\\.\\d+ calls in flight per executor \\(above 2\\)|\\d+\\.\\d+ calls/s against \\d+\\.\\d+ per executor \\(\\d+ executor\\(s\\), utilisation \\d+\\.\\d+\\))"
      expect(output()).toMatch(
        new RegExp(`rebalancing: (?:${llm.id}|${image.id}) is a bottleneck: ${pressed}; a free device takes it`)
      )
      expect(output()).toMatch(
        new RegExp(
          `rebalancing: \\S+ is a bottleneck: ${pressed}; ${audio.id} has slack: 0\\.00 per executor \\(below 0\\.5\\)`
        )
      )
      const after = await tasks()
      expect(after.find((task) => task.id === audio.id)!.executors).toHaveLength(1)
      // Five devices; an executor the profile showed no gain from may have gone back to the pool. On a
      // busy machine a later bottleneck may also have shared a calm task's device for a while.
      const shared = (await moves("shared_device")) - (await moves("unshared"))
      expect(after.reduce((sum, task) => sum + task.executors.length, 0)).toBeLessThanOrEqual(5 + shared)
    },
    readyWithin(2) + 60_000
  )

  it("leaves the devices where they are once the load is gone", async () => {
    const before = (await tasks()).map((task) => [task.id, task.executors.length])
    const given = [await moves("free_device"), await moves("taken_from_slack")]
    const givenBack = async () => [await moves("released"), await moves("unshared")]
    const released = await givenBack()
    await new Promise((resolve) => setTimeout(resolve, 4_000))
    // No task grows without load. (An executor its profile showed no gain from, or one that shared
    // a device under the load, may still go back.)
    expect([await moves("free_device"), await moves("taken_from_slack")]).toEqual(given)
    if ((await givenBack()).every((count, index) => count === released[index]))
      expect((await tasks()).map((task) => [task.id, task.executors.length])).toEqual(before)
  })
})

/**
 * On a host whose CPU devices are all shared (two devices, color_chat's three tasks), no device is
 * ever free: under color_chat load the LLM, the bottleneck, grows onto the CPU device it does not
 * hold, whose only task (an encoder) is calm, and gives that executor back once the load is gone.
 * No request fails meanwhile.
 */
describe("cornserve serve --autoscale on shared CPU devices: a bottleneck takes the core calm tasks leave idle", () => {
  const { output, tasks, named, moves, underLoad } = autoscaledColorChat("cpu:0,cpu:1")

  it(
    "grows the LLM onto the other core under load, and gives it back when the load is gone",
    async () => {
      const llm = await named("llm")
      expect(llm.executors).toHaveLength(1)
      const [held] = llm.devices
      const other = held === "cpu:0" ? "cpu:1" : "cpu:0"

      const answers = await underLoad(async (answers) => {
        // One move, starting an executor.
        await eventually(
          async () => ((await moves("shared_device")) >= 1 ? true : undefined),
          readyWithin(1),
          "a shared device"
        )
        // The load goes on for a while with the LLM on both cores.
        const served = answers.length
        await eventually(async () => (answers.length >= served + 16 ? true : undefined), 60_000, "16 more answers")
      })
      expect(new Set(answers)).toEqual(new Set(["red"]))
      expect(output()).toMatch(
        new RegExp(
          `rebalancing: ${llm.id} is a bottleneck: [^\\n]*; no device is free or taken from slack, and ${other} holds only calm tasks \\(encoder-[^)]*\\): it shares it`
        )
      )
      expect(await moves("free_device")).toBe(0)

      // It goes back once the LLM has slack, or sooner if its profile showed that two executors
      // sustained no more than one (as on two busy cores).
      await eventually(
        async () => ((await moves("unshared")) + (await moves("released")) >= 1 ? true : undefined),
        60_000,
        "the shared device given back"
      )
      expect(output()).toMatch(
        new RegExp(
          `rebalancing: ${llm.id} (?:has slack: [^\\n]*; an executor it runs on a shared device goes back|gains nothing from its 2 executors)`
        )
      )
      const after = (await tasks()).find((task) => task.id === llm.id)!
      expect(after.executors).toHaveLength(1)
    },
    readyWithin(1) + 180_000
  )
})
