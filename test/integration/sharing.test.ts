/**
 * What apps share, against the real binary. Devices: `cornserve serve` with no flags (one
 * single-thread CPU device per core) registers every example app, whose five tasks share the
 * devices when there are fewer devices than tasks, and every app answers; each executor is started
 * with its share of its device's threads. Encoder outputs: an image sent again, by the same app or
 * another one using the same encoder, is forwarded from the cache and the encoder is not called.
 */
import { mkdtemp, rm } from "node:fs/promises"
import sharp from "sharp"
import { availableParallelism, tmpdir } from "node:os"
import { join } from "node:path"
import { adminHeaders } from "../support/platform.js"
import { solidPngBase64 } from "../support/images.js"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { chatRequest, streamedText } from "../support/colorChatRequest.js"
import { descendants } from "../support/executors.js"
import {
  eventually,
  invoke,
  removeStateDir,
  repoRoot,
  runCli,
  type RunningPlatform,
  startPlatform
} from "../support/platform.js"

interface DeviceRow {
  readonly id: string
  readonly type: string
  readonly threads: number
  readonly task: string | null
  readonly tasks: ReadonlyArray<string>
}

/** A chat request for color_chat and color_studio with a solid 8x8 image. */
const solidImageRequest = async (r: number, g: number, b: number) => {
  const png = await sharp({ create: { width: 8, height: 8, channels: 3, background: { r, g, b } } })
    .png()
    .toBuffer()
  return JSON.stringify({
    messages: [
      {
        role: "user",
        content: [
          { type: "text", text: "What colour is this?" },
          { type: "image_url", image_url: { url: `data:image/png;base64,${png.toString("base64")}` } }
        ]
      }
    ],
    max_tokens: 8
  })
}

/** A chat request for color_chat and color_studio whose image is `url`, as written. */
const imageUrlRequest = (url: string) =>
  JSON.stringify({
    messages: [
      {
        role: "user",
        content: [
          { type: "text", text: "What colour is this?" },
          { type: "image_url", image_url: { url } }
        ]
      }
    ],
    max_tokens: 8
  })

/** One sample of the gateway's /metrics, by its name and labels as written. */
const metricValue = async (url: string, pattern: RegExp): Promise<number> => {
  const text = await (await fetch(`${url}/metrics`, { headers: adminHeaders() })).text()
  return text
    .split("\n")
    .filter((line) => pattern.test(line))
    .reduce((sum, line) => sum + Number(line.slice(line.lastIndexOf(" ") + 1)), 0)
}

describe("shared CPU devices, shared encoder outputs", () => {
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
    // Its settings record (`--settings`, JSON) carries the thread count.
    for (const router of routers) expect(router.command).toMatch(/"threadsPerDevice":1[,}]/)

    const nodes = await runCli(["nodes", "list"], env)
    expect(nodes.code, nodes.stderr).toBe(0)
    const shared = devices.find((device) => device.tasks.length > 1)
    if (shared !== undefined) expect(nodes.stdout).toContain(`${shared.id} (${shared.tasks.join(", ")})`)
  })

  it("forwards an image sent again from the cache of encoder outputs, to any app using the encoder", async () => {
    const imageEncoderCalls = () =>
      metricValue(platform.url, /^cornserve_executor_call_seconds_count\{task="encoder-[^"]*",operation="embed"/)
    const lookups = (result: string) =>
      metricValue(platform.url, new RegExp(`^cornserve_embedding_cache_lookups_total\\{.*result="${result}"`))
    /** Prompts the LLM executors prefilled from their prefix caches (cornserve_llm_prefix_cache_*). */
    const prefixHits = () => metricValue(platform.url, /^cornserve_llm_prefix_cache_hits_total\{/)
    const blue = await solidImageRequest(20, 30, 235)
    const calls = await imageEncoderCalls()
    const [hits, misses] = [await lookups("hit"), await lookups("miss")]
    const prefixHitsBefore = await prefixHits()

    expect(await streamedText(await invoke(platform.url, "color_chat", blue))).toBe("blue")
    expect(await imageEncoderCalls()).toBe(calls + 1)
    expect(await lookups("miss")).toBe(misses + 1)

    // The same bytes again: the same answer, and no encoder call.
    expect(await streamedText(await invoke(platform.url, "color_chat", blue))).toBe("blue")
    expect(await imageEncoderCalls()).toBe(calls + 1)
    expect(await lookups("hit")).toBe(hits + 1)
    // The LLM found the prompt's blocks, image rows included, in its prefix cache.
    expect(await prefixHits()).toBeGreaterThan(prefixHitsBefore)
    expect(await metricValue(platform.url, /^cornserve_llm_prefix_cache_bytes\{/)).toBeGreaterThan(0)
    // Another app on the same encoder task finds it too.
    const studio = await invoke(platform.url, "color_studio", blue)
    expect(((await studio.json()) as { colour: string }).colour).toBe("blue")
    expect(await imageEncoderCalls()).toBe(calls + 1)
    expect(await lookups("hit")).toBe(hits + 2)

    expect(await metricValue(platform.url, /^cornserve_embedding_cache_entries /)).toBeGreaterThan(0)
    expect(await metricValue(platform.url, /^cornserve_embedding_cache_bytes /)).toBeGreaterThan(0)
    // Nothing of it stays in the sidecar: the copies taken for the cache and the forwards were all released.
    expect(await (await fetch(`${platform.url}/metrics`, { headers: adminHeaders() })).text()).toMatch(
      /^cornserve_sidecar_transfers_active\{/m
    )
    await eventually(async () =>
      (await metricValue(platform.url, /^cornserve_sidecar_transfers_active\{/)) === 0 ? true : undefined
    )
    expect(await metricValue(platform.url, /^cornserve_sidecar_bytes_in_use\{/)).toBe(0)
  })

  it("cannot be poisoned by a data: URL that two readers would read differently", async () => {
    const green = await solidPngBase64(20, 230, 30)
    const blue = await solidPngBase64(20, 30, 235)
    expect(green.endsWith("=")).toBe(true)
    // Each crafted URL names one image to a lenient reader of the key and another to the encoder's.
    const crafted = [
      `data:image/png;Base64,${green}${blue}`,
      `data:image/png;base64,${green}${blue}`,
      `data:image/png;BASE64,${blue}`,
      `data:image/png;base64,${green.replace(/=+$/, "")}=${blue}`
    ]
    for (const url of crafted) {
      const response = await invoke(platform.url, "color_chat", imageUrlRequest(url))
      // Refused whole (the one reader finds it malformed), or read as the one image it is.
      if (response.status === 200) expect(await streamedText(response)).toBe("blue")
      else expect(response.status, url.slice(0, 40)).toBe(400)
    }
    // Every client still gets the colour of the image it sent, from either app on the encoder.
    for (const app of ["color_chat", "color_studio"]) {
      for (const [name, base64] of [
        ["green", green],
        ["blue", blue]
      ] as const) {
        const response = await invoke(platform.url, app, imageUrlRequest(`data:image/png;base64,${base64}`))
        expect(response.status).toBe(200)
        const colour =
          app === "color_chat" ? await streamedText(response) : ((await response.json()) as { colour: string }).colour
        expect(colour, `${app} for ${name}`).toBe(name)
      }
    }
  })
})
