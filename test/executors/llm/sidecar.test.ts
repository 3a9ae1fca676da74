import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import OpenAI from "openai"
import sharp from "sharp"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { EmbeddingsResponse } from "../../../src/executors/eric/api.js"
import { wavFile } from "../../../src/executors/geri/router.js"
import type { PromptEmbeddingsResponse } from "../../../src/executors/llm/api.js"
import { SidecarClient } from "../../../src/sidecar/SidecarClient.js"
import { Tensor } from "../../../src/sidecar/Tensor.js"
import { Random } from "../../../src/models/Random.js"
import { colors } from "../../../src/models/recipes/ColorChannels.js"
import { colorImage, tone } from "../../models/support/Synthetic.js"
import { startExecutor, startSidecar } from "../../support/executors.js"
import { relativeError } from "../../models/support/Ort.js"
import { authorized, postAuthorized, secretEnv, testSecret } from "../executorSecret.js"

/**
 * The LLM executor among the others on one node, as real processes on loopback: Eric sends image
 * and audio embeddings through the sidecar for the LLM (an MLLM task with encoder fission), and the
 * LLM sends prompt embeddings through it to Geri's painter (an LLM embedding task).
 */

const model = "cornserve/tiny-color-vlm"

let root: string
let sidecar: Awaited<ReturnType<typeof startSidecar>>
let eric: Awaited<ReturnType<typeof startExecutor>>
let llm: Awaited<ReturnType<typeof startExecutor>>
let painter: Awaited<ReturnType<typeof startExecutor>>
let client: OpenAI
let sidecarClient: SidecarClient

const post = postAuthorized

const imageUrl = async (color: number, seed: number) => {
  const { image } = colorImage(new Random(seed), colors[color]!, colors[(color + 5) % 8]!, "patch")
  const png = await sharp(Buffer.from(image.data), { raw: { width: image.width, height: image.height, channels: 3 } })
    .png()
    .toBuffer()
  return `data:image/png;base64,${png.toString("base64")}`
}

const audioBase64 = (hertz: number) =>
  wavFile([Int16Array.from(tone(hertz, 16_000, 1, 0.4), (sample) => Math.round(sample * 32767))], 16_000).toString(
    "base64"
  )

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "cornserve-llm-sidecar-"))
  const env = { CORNSERVE_MODEL_DIR: root, ...secretEnv }
  sidecar = await startSidecar("llm-node", env)
  const common = ["--devices", "cpu:0", "--sidecar-socket", sidecar.socket, "--embedding-wait-ms", "500"]
  ;[eric, llm, painter] = await Promise.all([
    startExecutor(["--kind", "eric", "--model", model, ...common], env),
    startExecutor(["--kind", "llm", "--model", model, ...common], env),
    startExecutor(["--kind", "geri", "--model", "cornserve/tiny-color-painter", ...common], env)
  ])
  client = new OpenAI({ baseURL: `${llm.url}/v1`, apiKey: testSecret, maxRetries: 0 })
  sidecarClient = await SidecarClient.connect(sidecar.socket)
})

afterAll(async () => {
  await sidecarClient?.close()
  await Promise.all([eric?.stop(), llm?.stop(), painter?.stop()])
  await sidecar?.stop()
  await rm(root, { recursive: true, force: true })
})

describe("the LLM executor with embeddings from Eric through the sidecar", () => {
  it("gives the same answers as with its own encoder, whole and streamed", async () => {
    const media = [
      { id: "image-red", modality: "image" as const, url: await imageUrl(0, 1), part: "image_url" as const },
      { id: "image-cyan", modality: "image" as const, url: await imageUrl(5, 2), part: "image_url" as const },
      {
        id: "tone-high",
        modality: "audio" as const,
        url: `data:audio/wav;base64,${audioBase64(2000)}`,
        part: "input_audio" as const
      }
    ]
    const embedded = await post<EmbeddingsResponse>(`${eric.url}/embeddings`, {
      items: media.map(({ id, modality, url }) => ({ id, modality, url })),
      receivers: [sidecar.nodeId]
    })
    expect(embedded.status).toBe(200)

    for (const [index, item] of media.entries()) {
      const part: OpenAI.Chat.ChatCompletionContentPart =
        item.part === "image_url"
          ? { type: "image_url", image_url: { url: item.url } }
          : { type: "input_audio", input_audio: { data: audioBase64(2000), format: "wav" } }
      const messages: Array<OpenAI.Chat.ChatCompletionMessageParam> = [
        { role: "user", content: [part, { type: "text", text: "What is this?" }] }
      ]
      const inProcess = await client.chat.completions.create({ model, messages, temperature: 0 })
      const fromEric = await client.chat.completions.create({
        model,
        messages,
        temperature: 0,
        cornserve_embeddings: [{ id: item.id, modality: item.modality }]
      } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming)
      expect(fromEric.choices[0]!.message.content, item.id).toBe(inProcess.choices[0]!.message.content)
      expect(fromEric.usage).toEqual(inProcess.usage)
      expect(inProcess.choices[0]!.message.content).toBe(["red", colors[5]!.name, "high"][index])
    }

    // A second embedding of the first image, taken by a streaming request.
    await post(`${eric.url}/embeddings`, { items: [{ id: "image-red-2", modality: "image", url: media[0]!.url }] })
    const stream = await client.chat.completions.create({
      model,
      messages: [
        {
          role: "user",
          content: [
            { type: "image_url", image_url: { url: media[0]!.url } },
            { type: "text", text: "Colour?" }
          ]
        }
      ],
      temperature: 0,
      stream: true,
      cornserve_embeddings: [{ id: "image-red-2", modality: "image" }]
    } as OpenAI.Chat.ChatCompletionCreateParamsStreaming)
    let text = ""
    for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? ""
    expect(text).toBe("red")
  })

  it("404 for an embedding that never arrives; 400 when the embeddings do not match the media parts", async () => {
    const messages = [{ role: "user", content: [{ type: "image_url", image_url: { url: "cornserve:image" } }] }]
    const missing = await post<{ error: { code: string } }>(`${llm.url}/v1/chat/completions`, {
      model,
      messages,
      cornserve_embeddings: [{ id: "never-sent", modality: "image" }]
    })
    expect(missing).toMatchObject({ status: 404, body: { error: { code: "EmbeddingMissing" } } })
    const mismatched = await post(`${llm.url}/v1/chat/completions`, {
      model,
      messages,
      cornserve_embeddings: [{ id: "x", modality: "audio" }]
    })
    expect(mismatched.status).toBe(400)
    const tooMany = await post(`${llm.url}/v1/chat/completions`, { model, messages, cornserve_embeddings: [] })
    expect(tooMany.status).toBe(400)
  })
})

describe("prompt embeddings through the sidecar (the LLM embedding task)", () => {
  it("sends embed_tokens of the prompt under the id, to the node named", async () => {
    const messages = [{ role: "user", content: "paint the sky green" }]
    const inline = await post<PromptEmbeddingsResponse>(`${llm.url}/v1/cornserve/prompt-embeddings`, {
      model,
      messages,
      id: "inline",
      return: "inline"
    })
    const sent = await post<PromptEmbeddingsResponse>(`${llm.url}/v1/cornserve/prompt-embeddings`, {
      model,
      messages,
      id: "prompt-green",
      receivers: [sidecar.nodeId]
    })
    expect(sent.status).toBe(200)
    expect(sent.body.shape).toEqual(inline.body.shape)
    const received = await sidecarClient.recv("prompt-green", 0, { timeoutMs: 5_000 })
    expect(received).toBeInstanceOf(Tensor)
    const tensor = received as Tensor
    expect([tensor.dtype, ...tensor.shape]).toEqual(["float32", ...sent.body.shape])
    expect(Array.from(tensor.data as Float32Array)).toEqual(inline.body.embedding)
    await sidecarClient.markDone("prompt-green")
  })

  it("sends the decoder's final hidden states of the prompt, as it answers them inline, with their shape", async () => {
    const messages = [{ role: "user", content: "paint the hills brown" }]
    const body = { model, messages, source: "hidden_states" }
    const inline = await post<PromptEmbeddingsResponse>(`${llm.url}/v1/cornserve/prompt-embeddings`, {
      ...body,
      id: "inline",
      return: "inline"
    })
    expect(inline.status).toBe(200)
    const sent = await post<PromptEmbeddingsResponse>(`${llm.url}/v1/cornserve/prompt-embeddings`, {
      ...body,
      id: "prompt-states",
      receivers: [sidecar.nodeId]
    })
    expect(sent.status).toBe(200)
    expect(sent.body.source).toBe("hidden_states")
    expect(sent.body.shape).toEqual(inline.body.shape)
    const tensor = (await sidecarClient.recv("prompt-states", 0, { timeoutMs: 5_000 })) as Tensor
    expect([tensor.dtype, ...tensor.shape]).toEqual(["float32", ...sent.body.shape])
    expect(Array.from(tensor.data as Float32Array)).toEqual(inline.body.embedding)
    // Hidden states, not the embedding table's rows.
    const tokens = await post<PromptEmbeddingsResponse>(`${llm.url}/v1/cornserve/prompt-embeddings`, {
      model,
      messages,
      id: "tokens",
      return: "inline"
    })
    expect(tokens.body.embedding).not.toEqual(inline.body.embedding)
    await sidecarClient.markDone("prompt-states")
  })

  it("streams a generation's hidden states, the prompt's at once and then a row a token, its text beside them", async () => {
    const messages = [{ role: "user", content: [{ type: "image_url", image_url: { url: await imageUrl(2, 11) } }] }]
    const body = { model, messages, source: "hidden_states" }
    const whole = await post<PromptEmbeddingsResponse>(`${llm.url}/v1/cornserve/prompt-embeddings`, {
      ...body,
      id: "whole",
      return: "inline",
      generate: { max_tokens: 6 }
    })
    expect(whole.status).toBe(200)
    const response = await fetch(`${llm.url}/v1/cornserve/prompt-embeddings`, {
      method: "POST",
      headers: { ...authorized, "content-type": "application/json" },
      body: JSON.stringify({
        ...body,
        id: "streamed",
        receivers: [sidecar.nodeId],
        generate: { max_tokens: 6, stream: true, transcript: { id: "streamed-text" } }
      })
    })
    expect(response.status).toBe(200)
    expect(response.headers.get("content-type")).toContain("application/x-ndjson")
    const lines = (await response.text())
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line) as Record<string, unknown>)
    const completion = whole.body.completion!
    const [width, generated] = [whole.body.shape[1], completion.token_ids.length]
    const promptRows = whole.body.shape[0] - generated
    expect(lines).toEqual([
      { id: "streamed", source: "hidden_states", dtype: "float32", shape: [promptRows, width] },
      { done: true, completion }
    ])
    // Chunk 0 the prompt's rows, then one a generated token but the last, then the stream's end.
    const rows: Array<Float32Array> = []
    for (let chunk = 0; ; chunk++) {
      const tensor = (await sidecarClient.recv("streamed", chunk, { timeoutMs: 5_000 })) as Tensor | undefined
      if (tensor === undefined) break
      expect(tensor.shape).toEqual([chunk === 0 ? promptRows : 1, width])
      rows.push((tensor.data as Float32Array).slice())
      await sidecarClient.markDone("streamed", chunk)
    }
    expect(rows).toHaveLength(generated)
    const streamed = Float32Array.from(rows.flatMap((part) => Array.from(part)))
    const expected = whole.body.embedding!.slice(0, streamed.length)
    expect(relativeError(streamed, Float32Array.from(expected))).toBeLessThanOrEqual(1e-5)
    // The text's pieces, then how it ended.
    const pieces: Array<Record<string, unknown>> = []
    for (let chunk = 0; ; chunk++) {
      const piece = await sidecarClient.recv("streamed-text", chunk, { timeoutMs: 5_000 })
      if (piece === undefined) break
      pieces.push(JSON.parse(piece as string) as Record<string, unknown>)
      await sidecarClient.markDone("streamed-text", chunk)
    }
    expect(
      pieces
        .slice(0, -1)
        .map((piece) => piece.text)
        .join("")
    ).toBe(completion.text)
    expect(pieces.at(-1)).toEqual({ finish_reason: completion.finish_reason, completion_tokens: generated })
    expect((await sidecarClient.stats()).transfersActive).toBe(0)

    const inline = await post<{ error: { message: string } }>(`${llm.url}/v1/cornserve/prompt-embeddings`, {
      ...body,
      id: "inline-stream",
      return: "inline",
      generate: { stream: true }
    })
    expect(inline.status).toBe(400)
    expect(inline.body.error.message).toMatch(/not "inline"/)
  })

  it("feeds Geri's painter, which paints the colour the prompt names", async () => {
    for (const [word, rgb] of [
      ["red", [1, 0, 0]],
      ["blue", [0, 0, 1]]
    ] as const) {
      const id = `paint-${word}`
      const sent = await post(`${llm.url}/v1/cornserve/prompt-embeddings`, {
        model,
        messages: [{ role: "user", content: `Paint me something ${word}.` }],
        id
      })
      expect(sent.status).toBe(200)
      const painted = await post<{ image: string }>(`${painter.url}/generate`, {
        embeddings: id,
        width: 32,
        height: 32
      })
      expect(painted.status).toBe(200)
      const stats = await sharp(Buffer.from(painted.body.image, "base64")).stats()
      const mean = stats.channels.slice(0, 3).map((channel) => channel.mean / 255)
      mean.forEach((value, channel) => expect(Math.round(value), `${word} channel ${channel}`).toBe(rgb[channel]))
    }
  })
})
