import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import OpenAI from "openai"
import sharp from "sharp"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { streamedText } from "../support/colorChatRequest.js"
import { descendants } from "../support/executors.js"
import {
  adminHeaders,
  eventually,
  invoke,
  removeStateDir,
  repoRoot,
  runCli,
  type RunningPlatform,
  startPlatform
} from "../support/platform.js"

const example = (name: string) => join(repoRoot, "examples", `${name}.ts`)
const fixture = (name: string) => join(repoRoot, "test", "fixtures", "apps", `${name}.ts`)

const solid = async (r: number, g: number, b: number) =>
  `data:image/png;base64,${(
    await sharp({ create: { width: 48, height: 48, channels: 3, background: { r, g, b } } })
      .png()
      .toBuffer()
  ).toString("base64")}`

const chatRequest = (imageUrl: string, extra: Record<string, unknown> = {}) => ({
  messages: [
    {
      role: "user",
      content: [
        { type: "text", text: "What colour is this?" },
        { type: "image_url", image_url: { url: imageUrl } }
      ]
    }
  ],
  max_tokens: 8,
  ...extra
})

interface TaskRow {
  id: string
  name: string
  usedBy: Array<string>
  devices: Array<string>
  executors: Array<{ healthy: boolean; url: string | null }>
}

describe("orchestration: apps' tasks run on executors, shared, supervised and wired through the sidecar", () => {
  let platform: RunningPlatform
  let env: Record<string, string>
  let modelDir: string

  const tasks = async () =>
    (await (await fetch(`${platform.url}/tasks/list`)).json()) as {
      tasks: Array<TaskRow>
      devices: Array<{ id: string; task: string | null }>
    }
  const sidecarBytesInUse = async () => {
    const text = await (await fetch(`${platform.url}/metrics`, { headers: adminHeaders() })).text()
    return Number(/^cornserve_sidecar_bytes_in_use\{[^}]*\} (\d+)$/m.exec(text)![1])
  }

  // Starting the platform and three apps starts their executors: on two busy cores that can take longer
  // than the default hook limit.
  beforeAll(async () => {
    modelDir = await mkdtemp(join(tmpdir(), "cornserve-models-"))
    platform = await startPlatform({
      args: ["--devices", "cpu:0,cpu:1,cpu:2,cpu:3,cpu:4,cpu:5,cpu:6", "--request-timeout", "60"],
      env: { CORNSERVE_MODEL_DIR: modelDir }
    })
    env = { CORNSERVE_GATEWAY_URL: platform.url }
    for (const file of [example("color_chat"), example("color_studio"), fixture("color_chat_local")]) {
      const result = await runCli(["app", "register", file], env)
      expect(result.code, result.stderr).toBe(0)
    }
  }, 180_000)

  afterAll(async () => {
    const code = await platform?.stop()
    expect(code).toBe(0)
    await removeStateDir(platform.stateDir)
    await rm(modelDir, { recursive: true, force: true })
  })

  it("answers a red image with red, with the encoder as its own task and inside the LLM", async () => {
    const red = await solid(235, 25, 20)
    for (const app of ["color_chat", "color_chat_local"]) {
      const response = await invoke(platform.url, app, JSON.stringify(chatRequest(red)))
      expect(response.status).toBe(200)
      expect(response.headers.get("content-type")).toContain("application/x-ndjson")
      expect(await streamedText(response)).toBe("red")
    }
  })

  it("serves color_chat to the official openai client, streaming and not", async () => {
    const client = new OpenAI({ baseURL: `${platform.url}/app/color_chat/v1`, apiKey: "unused" })
    const green = await solid(20, 230, 30)
    const completion = await client.chat.completions.create(
      chatRequest(green, { model: "cornserve/tiny-color-vlm" }) as never
    )
    expect((completion as OpenAI.ChatCompletion).choices[0]!.message.content).toBe("green")
    const stream = await client.chat.completions.create(
      chatRequest(green, { model: "cornserve/tiny-color-vlm", stream: true }) as never
    )
    let text = ""
    for await (const chunk of stream as unknown as AsyncIterable<OpenAI.ChatCompletionChunk>)
      text += chunk.choices[0]?.delta.content ?? ""
    expect(text).toBe("green")
  })

  it("chains encoder → LLM → image generator: color_studio paints the colour it named", async () => {
    const response = await invoke(platform.url, "color_studio", JSON.stringify(chatRequest(await solid(25, 20, 235))))
    expect(response.status).toBe(200)
    const answer = (await response.json()) as { colour: string; image: string; mimeType: string }
    expect(answer.colour).toBe("blue")
    const stats = await sharp(Buffer.from(answer.image, "base64")).stats()
    const [r, g, b] = stats.channels.map((channel) => channel.mean)
    expect(b!).toBeGreaterThan(150)
    expect(r!).toBeLessThan(80)
    expect(g!).toBeLessThan(80)
  })

  it("streams a tone of the named colour with color_studio's audio variant", async () => {
    const response = await invoke(
      platform.url,
      "color_studio",
      JSON.stringify(chatRequest(await solid(235, 25, 20), { output: "audio" }))
    )
    const lines = (await response.text())
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line) as { colour?: string; audio?: string; sampleRate?: number })
    expect(lines[0]).toEqual({ colour: "red" })
    expect(lines.length).toBeGreaterThan(2)
    expect(lines.slice(1).every((line) => typeof line.audio === "string" && line.sampleRate === 16_000)).toBe(true)
  })

  it("deploys an encoder used by two apps once", async () => {
    const { tasks: rows } = await tasks()
    const imageEncoders = rows.filter((task) => task.name === "encoder-image-tiny-color-vlm")
    expect(imageEncoders).toHaveLength(1)
    expect(imageEncoders[0]!.usedBy.sort()).toEqual(["color_chat", "color_studio"])
    const listed = await runCli(["tasks", "list"], env)
    expect(listed.stdout.match(/encoder-image-tiny-color-vlm/g)).toHaveLength(1)
  })

  it("loses no request that can be retried when an executor is killed under load, and recovers", async () => {
    const encoder = (await tasks()).tasks.find((task) => task.name === "encoder-image-tiny-color-vlm")!
    const scaled = await fetch(`${platform.url}/task/scale`, {
      method: "POST",
      headers: adminHeaders({ "content-type": "application/json" }),
      body: JSON.stringify({ taskId: encoder.id, devices: 1 })
    })
    expect(scaled.status).toBe(200)
    await eventually(async () =>
      (await tasks()).tasks.find((task) => task.id === encoder.id)!.executors.filter((executor) => executor.healthy)
        .length === 2
        ? true
        : undefined
    )

    const red = await solid(240, 10, 10)
    const requests = Array.from({ length: 12 }, () =>
      invoke(platform.url, "color_chat", JSON.stringify(chatRequest(red))).then(streamedText)
    )
    const victim = descendants(platform.process.pid!).find(
      (entry) =>
        entry.command.includes("internal executor ") &&
        entry.command.includes("--kind eric") &&
        entry.command.includes("cpu:1")
    )
    expect(victim).toBeDefined()
    process.kill(victim!.pid, "SIGKILL")
    expect(await Promise.all(requests)).toEqual(Array.from({ length: 12 }, () => "red"))
    await eventually(
      async () =>
        (await tasks()).tasks.find((task) => task.id === encoder.id)!.executors.filter((executor) => executor.healthy)
          .length === 2
          ? true
          : undefined,
      60_000
    )
    expect(await streamedText(await invoke(platform.url, "color_chat", JSON.stringify(chatRequest(red))))).toBe("red")

    // Scaling down while requests are in flight drains the leaving executor: none of them fails.
    const during = Array.from({ length: 8 }, () =>
      invoke(platform.url, "color_chat", JSON.stringify(chatRequest(red))).then(streamedText)
    )
    const shrunk = await fetch(`${platform.url}/task/scale`, {
      method: "POST",
      headers: adminHeaders({ "content-type": "application/json" }),
      body: JSON.stringify({ taskId: encoder.id, devices: -1 })
    })
    expect(shrunk.status).toBe(200)
    expect(await Promise.all(during)).toEqual(Array.from({ length: 8 }, () => "red"))
    expect((await tasks()).tasks.find((task) => task.id === encoder.id)!.executors).toHaveLength(1)
  })

  it("leaves the sidecar arena at its baseline when clients go away mid-request", async () => {
    const baseline = await sidecarBytesInUse()
    const yellow = await solid(230, 230, 20)
    await Promise.all(
      [0, 5, 20, 60].map(async (delay) => {
        const controller = new AbortController()
        const pending = fetch(`${platform.url}/app/invoke/color_chat`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify(chatRequest(yellow)),
          signal: controller.signal
        }).then(
          (response) => response.text(),
          () => undefined
        )
        await new Promise((resolve) => setTimeout(resolve, delay))
        controller.abort()
        await pending.catch(() => undefined)
      })
    )
    await eventually(async () => ((await sidecarBytesInUse()) === baseline ? true : undefined), 15_000)
  })

  it("keeps a shared task when one of its apps goes, and frees its devices when the last one does", async () => {
    expect((await runCli(["app", "unregister", "color_studio"], env)).code).toBe(0)
    const afterOne = (await tasks()).tasks
    expect(afterOne.find((task) => task.name === "encoder-image-tiny-color-vlm")?.usedBy).toEqual(["color_chat"])
    expect(afterOne.some((task) => task.name.startsWith("image-generator"))).toBe(false)
    for (const app of ["color_chat", "color_chat_local"])
      expect((await runCli(["app", "unregister", app], env)).code).toBe(0)
    const { tasks: remaining, devices } = await tasks()
    expect(remaining).toEqual([])
    expect(devices.every((device) => device.task === null)).toBe(true)
  })
})
