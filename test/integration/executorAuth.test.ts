import { randomBytes } from "node:crypto"
import sharp from "sharp"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type ColorChatPlatform, chatRequest, startColorChat } from "../support/colorChat.js"
import { streamedText } from "../support/colorChatRequest.js"
import { adminHeaders, invoke, type RunningPlatform } from "../support/platform.js"

/**
 * The platform's executors, called directly by a stranger who read their addresses from
 * `/tasks/list` (as anyone on the machine can, apps included): without the platform's secret each
 * call is refused from its headers, nothing lands in the sidecar's arena, the executors' queues
 * stay empty, and color_chat answers as before.
 */

const nodeId = `executor-auth-${process.pid}`

interface TaskRow {
  readonly name: string
  readonly executors: ReadonlyArray<{
    readonly url: string | null
    readonly healthy: boolean
    readonly outstanding: number
  }>
}

describe("an executor's routes", () => {
  let running: ColorChatPlatform
  let platform: RunningPlatform

  const tasks = async () =>
    (
      (await (await fetch(`${platform.url}/tasks/list`, { headers: adminHeaders() })).json()) as {
        tasks: Array<TaskRow>
      }
    ).tasks

  /** One sample of the node's sidecar metrics. */
  const sidecarSample = async (name: string) => {
    const text = await (await fetch(`${platform.url}/metrics`, { headers: adminHeaders() })).text()
    return Number(new RegExp(`^${name}\\{node="${nodeId}"\\} (\\d+)$`, "m").exec(text)?.[1] ?? Number.NaN)
  }

  const colorChatAnswer = async () => {
    const response = await invoke(platform.url, "color_chat", chatRequest)
    expect(response.status).toBe(200)
    return streamedText(response)
  }

  beforeAll(async () => {
    running = await startColorChat(nodeId)
    platform = running.platform
  })

  afterAll(async () => {
    await running?.dispose()
  })

  it("refuse a stranger's calls without the platform's secret; the arena, the queues and the apps' answers are untouched", async () => {
    const before = await colorChatAnswer()
    const listed = await tasks()
    const urlOf = (prefix: string) => listed.find((task) => task.name.startsWith(prefix))!.executors[0]!.url!
    const encoder = urlOf("encoder")
    const llm = urlOf("llm")
    const transferredBefore = await sidecarSample("cornserve_sidecar_transferred_bytes_total")

    // A large image per call, its embedding to go into the node's sidecar and stay there.
    const image = await sharp({ create: { width: 512, height: 512, channels: 3, background: { r: 0, g: 200, b: 0 } } })
      .png()
      .toBuffer()
    const item = (index: number) => ({
      id: `stolen-${index}`,
      modality: "image",
      url: `data:image/png;base64,${image.toString("base64")}`
    })
    const attacks = Array.from({ length: 40 }, (_, index) =>
      fetch(`${encoder}/embeddings`, {
        method: "POST",
        headers: {
          "content-type": "application/json",
          // No token for half, a made-up one for the rest.
          ...(index % 2 === 0 ? {} : { authorization: `Bearer ${randomBytes(32).toString("base64url")}` })
        },
        body: JSON.stringify({ items: [item(index)], receivers: [nodeId] })
      })
    )
    const chat = fetch(`${llm}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ messages: [{ role: "user", content: "hi" }], max_tokens: 1000, ignore_eos: true })
    })
    const answers = await Promise.all([...attacks, chat])
    expect(answers.map((answer) => answer.status)).toEqual(answers.map(() => 401))
    const body = (await answers[0]!.json()) as { error: { code: string } }
    expect(body.error.code).toBe("Unauthorized")
    expect((await fetch(`${encoder}/info`)).status).toBe(401)
    expect((await fetch(`${llm}/v1/cornserve/stats`)).status).toBe(401)
    // Health probes answer anyone.
    expect((await fetch(`${encoder}/health`)).status).toBe(200)

    expect(await sidecarSample("cornserve_sidecar_bytes_in_use")).toBe(0)
    expect(await sidecarSample("cornserve_sidecar_transfers_active")).toBe(0)
    expect(await sidecarSample("cornserve_sidecar_transferred_bytes_total")).toBe(transferredBefore)
    for (const task of await tasks())
      for (const executor of task.executors) expect(executor).toMatchObject({ healthy: true, outstanding: 0 })
    expect(await colorChatAnswer()).toBe(before)
  })
})
