import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Random } from "../../../src/models/Random.js"
import { talkerFiles, tinyTalkerSize } from "../../../src/models/recipes/TinyTalker.js"
import { SidecarClient } from "../../../src/sidecar/SidecarClient.js"
import { Tensor } from "../../../src/sidecar/Tensor.js"
import { startExecutor, startSidecar } from "../../support/executors.js"
import { talkerReference } from "../../support/talkerReference.js"
import { authorized, secretEnv } from "../executorSecret.js"

/**
 * A talker on the LLM executor, with a real sidecar: `POST /v1/cornserve/talk` reads a thinker's
 * hidden states from the sidecar, in one chunk or several, and streams the frames of the talker's
 * graphs run in sequence in-process, then a done line; the chunks are released. Hidden states of
 * another width, hidden states that never come, a request over the context and a chat are refused
 * with a status and a message that say why, and the executor goes on.
 */

const model = "cornserve/tiny-talker"
const thinkerHidden = tinyTalkerSize.thinkerHiddenSize

let root: string
let sidecar: Awaited<ReturnType<typeof startSidecar>>
let talker: Awaited<ReturnType<typeof startExecutor>>
let client: SidecarClient

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "cornserve-talker-executor-"))
  const env = { CORNSERVE_MODEL_DIR: root, ...secretEnv }
  sidecar = await startSidecar("talker-node", env)
  talker = await startExecutor(
    [
      "--kind",
      "llm",
      "--model",
      model,
      "--devices",
      "cpu:0",
      "--sidecar-socket",
      sidecar.socket,
      "--embedding-wait-ms",
      "500"
    ],
    env
  )
  client = await SidecarClient.connect(sidecar.socket)
}, 120_000)

afterAll(async () => {
  await client?.close()
  await talker?.stop()
  await sidecar?.stop()
  if (root !== undefined) await rm(root, { recursive: true, force: true })
})

const talk = (body: Record<string, unknown>) =>
  fetch(`${talker.url}/v1/cornserve/talk`, {
    method: "POST",
    headers: { ...authorized, "content-type": "application/json" },
    body: JSON.stringify(body)
  })

type Line = {
  frame?: Array<number>
  done?: true
  frames?: number
  finishReason?: string
  frameRate?: number
  error?: { code: string; message: string }
}

const lines = async (response: Response): Promise<Array<Line>> =>
  (await response.text())
    .trim()
    .split("\n")
    .map((line) => JSON.parse(line) as Line)

/** Sends `states` ([rows, width]) under `id`, in `pieces` chunks of whole rows. */
const send = async (id: string, states: Float32Array, width: number, pieces = 1) => {
  const rows = states.length / width
  const per = Math.ceil(rows / pieces)
  for (let chunk = 0; chunk < pieces; chunk++) {
    const part = states.slice(chunk * per * width, Math.min(rows, (chunk + 1) * per) * width)
    await client.send(id, new Tensor("float32", [part.length / width, width], part), {
      to: [sidecar.nodeId],
      chunk,
      numChunks: pieces
    })
  }
}

describe("a talker on the LLM executor", () => {
  it("streams the frames of its graphs run in sequence, from hidden states in one chunk or three, and releases them", async () => {
    const states = new Random(3).normals(11 * thinkerHidden, 1)
    const expected = await talkerReference(talkerFiles(), states, thinkerHidden, 10)
    for (const pieces of [1, 3]) {
      const id = `states-${pieces}`
      await send(id, states, thinkerHidden, pieces)
      const response = await talk({ model, embeddings: id, maxFrames: 10 })
      expect(response.status).toBe(200)
      expect(response.headers.get("content-type")).toContain("application/x-ndjson")
      const answer = await lines(response)
      expect(answer.slice(0, -1).map((line) => line.frame)).toEqual(expected)
      expect(answer.at(-1)).toEqual({ done: true, frames: 10, finishReason: "length", frameRate: 12.5 })
    }
    const stats = await client.stats()
    expect(stats.transfersActive).toBe(0)
    expect(stats.bytesInUse).toBe(0)
  })

  it("takes a streaming thinker's rows as they come, a row a frame, and passes its transcript on", async () => {
    const random = new Random(8)
    const prompt = random.normals(5 * thinkerHidden, 1)
    const answer = random.normals(4 * thinkerHidden, 1)
    const states = new Float32Array([...prompt, ...answer])
    const expected = await talkerReference(talkerFiles(), states, thinkerHidden, 8, 5)
    // The rows matter: without them the frames after the first differ.
    const alone = await talkerReference(talkerFiles(), prompt, thinkerHidden, 8)
    expect(alone[0]).toEqual(expected[0])
    expect(alone.slice(1)).not.toEqual(expected.slice(1))

    const to = [sidecar.nodeId]
    await client.send("trail", new Tensor("float32", [5, thinkerHidden], prompt), { to, chunk: 0, stream: true })
    const response = await talk({ embeddings: "trail", trailing: true, transcript: "trail-text", maxFrames: 8 })
    expect(response.status).toBe(200)
    const reader = response.body!.getReader()
    const decoder = new TextDecoder()
    let text = ""
    // The first frame comes from the prompt alone; the next waits for the thinker's first row.
    while (!text.includes("\n")) text += decoder.decode((await reader.read()).value, { stream: true })
    expect(JSON.parse(text.slice(0, text.indexOf("\n")))).toEqual({ frame: expected[0] })
    const row = (from: number, rows: number) =>
      new Tensor("float32", [rows, thinkerHidden], answer.slice(from * thinkerHidden, (from + rows) * thinkerHidden))
    const piece = (chunk: number, value: object) =>
      client.send("trail-text", JSON.stringify(value), { to, chunk, stream: true })
    await client.send("trail", row(0, 1), { to, chunk: 1, stream: true })
    await piece(0, { text: "hel" })
    await client.send("trail", row(1, 2), { to, chunk: 2, stream: true })
    await piece(1, { text: "lo" })
    await client.send("trail", row(3, 1), { to, chunk: 3, stream: true })
    await piece(2, { finish_reason: "stop", completion_tokens: 5 })
    await client.closeStream("trail")
    await client.closeStream("trail-text")
    for (let read = await reader.read(); !read.done; read = await reader.read())
      text += decoder.decode(read.value, { stream: true })
    const all = text
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line) as Line & { text?: string; textDone?: unknown })
    expect(all.flatMap((line) => (line.frame === undefined ? [] : [line.frame]))).toEqual(expected)
    expect(all.flatMap((line) => (line.text === undefined ? [] : [line.text]))).toEqual(["hel", "lo"])
    expect(all.filter((line) => line.textDone !== undefined)).toEqual([
      { textDone: { finishReason: "stop", completionTokens: 5 } }
    ])
    expect(all.at(-1)).toEqual({ done: true, frames: 8, finishReason: "length", frameRate: 12.5 })
    const stats = await client.stats()
    expect(stats.transfersActive).toBe(0)
    expect(stats.bytesInUse).toBe(0)
  })

  it("refuses hidden states of another width, ones that never come, and a request over its context, and goes on", async () => {
    await send("narrow", new Random(4).normals(5 * 32, 1), 32)
    const narrow = await talk({ embeddings: "narrow" })
    expect(narrow.status).toBe(400)
    expect(await narrow.text()).toMatch(/float32 \[rows, 64\].*64 wide/)

    const missing = await talk({ embeddings: "never-sent" })
    expect(missing.status).toBe(404)
    expect(await missing.text()).toMatch(/did not arrive within 500 ms/)

    await send("long", new Random(5).normals(20 * thinkerHidden, 1), thinkerHidden)
    const long = await talk({ embeddings: "long", maxFrames: 1010 })
    expect(long.status).toBe(400)
    expect(await long.text()).toMatch(/maximum context is 1024 positions; the hidden states take 20 and maxFrames 1010/)

    const chat = await fetch(`${talker.url}/v1/chat/completions`, {
      method: "POST",
      headers: { ...authorized, "content-type": "application/json" },
      body: JSON.stringify({ messages: [{ role: "user", content: "hello" }] })
    })
    expect(chat.status).toBe(400)
    expect(await chat.text()).toMatch(/is a talker.*TalkerTask/)

    const foreign = await talk({ model: "someone/else", embeddings: "x" })
    expect(foreign.status).toBe(404)

    await send("after", new Random(6).normals(3 * thinkerHidden, 1), thinkerHidden)
    const after = await lines(await talk({ embeddings: "after", maxFrames: 2 }))
    expect(after.map((line) => line.frame?.length ?? line.frames)).toEqual([8, 8, 2])
    expect((await client.stats()).transfersActive).toBe(0)
  })

  it("stops writing for a client that goes away", async () => {
    await send("gone", new Random(7).normals(4 * thinkerHidden, 1), thinkerHidden)
    const response = await talk({ embeddings: "gone", maxFrames: 1000 })
    expect(response.status).toBe(200)
    const reader = response.body!.getReader()
    await reader.read()
    await reader.cancel()
    // The request is dropped from the engine: nothing runs once it has seen the client go.
    const deadline = Date.now() + 10_000
    let running = -1
    while (Date.now() < deadline) {
      const stats = (await (await fetch(`${talker.url}/v1/cornserve/stats`, { headers: authorized })).json()) as {
        running: number
      }
      running = stats.running
      if (running === 0) break
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
    expect(running).toBe(0)
  })
})
