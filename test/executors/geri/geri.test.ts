import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as ort from "onnxruntime-node"
import sharp from "sharp"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { loadModelDirectory, onnxPath } from "../../../src/models/ModelDirectory.js"
import { Graph } from "../../../src/models/onnx/Graph.js"
import { buildModel } from "../../../src/models/ModelStore.js"
import { ChatTokenizer } from "../../../src/models/Tokenizer.js"
import { SidecarClient } from "../../../src/sidecar/SidecarClient.js"
import { Tensor } from "../../../src/sidecar/Tensor.js"
import { peakFrequency } from "../../models/support/Spectrum.js"
import { startExecutor, startSidecar } from "../../support/executors.js"
import { authorized, secretEnv } from "../executorSecret.js"

const hidden = 64

/**
 * A model directory holding one image generator: `paint` builds the graph's output from the
 * prompt inputs and, when the generator takes one, its noise input ([batch, 3, 8, 8]).
 */
const writeGenerator = async (
  dir: string,
  paint: (
    g: Graph,
    inputs: { readonly embeds: { name: string }; readonly noise: { name: string } | undefined }
  ) => {
    name: string
  },
  withNoise: boolean
) => {
  const g = new Graph("generator")
  const embeds = g.input("inputs_embeds", "float32", ["batch_size", "sequence_length", hidden])
  g.input("attention_mask", "int64", ["batch_size", "sequence_length"])
  const noise = withNoise ? g.input("noise", "float32", ["batch_size", 3, 8, 8]) : undefined
  g.output(paint(g, { embeds, noise }), "images", "float32", ["batch_size", "channels", "height", "width"])
  await mkdir(join(dir, "onnx"), { recursive: true })
  await writeFile(join(dir, "onnx", "generator.onnx"), g.toBytes())
  await writeFile(
    join(dir, "config.json"),
    JSON.stringify({ model_type: "test_painter", generator: { modality: "image", height: 8, width: 8 } })
  )
}

describe("Geri: the generator executor", () => {
  let root: string
  let env: Record<string, string>
  let sidecar: Awaited<ReturnType<typeof startSidecar>>
  let painter: Awaited<ReturnType<typeof startExecutor>>
  let tones: Awaited<ReturnType<typeof startExecutor>>
  let client: SidecarClient
  let tokenizer: ChatTokenizer
  let embedTokens: ort.InferenceSession
  let next = 0

  /** A prompt as the VLM's embed_tokens sees it, sent into the sidecar; answers its id. */
  const sendPrompt = async (text: string): Promise<string> => {
    const ids = tokenizer.encode(text)
    const output = await embedTokens.run({
      input_ids: new ort.Tensor("int64", BigInt64Array.from(ids, BigInt), [1, ids.length])
    })
    const embeds = output.inputs_embeds!
    const id = `prompt-${next++}`
    await client.send(id, new Tensor("float32", [ids.length, embeds.dims[2]!], embeds.data as Float32Array), {
      to: [sidecar.nodeId]
    })
    return id
  }

  const generate = (url: string, body: unknown) =>
    fetch(`${url}/generate`, {
      method: "POST",
      headers: { ...authorized, "content-type": "application/json" },
      body: JSON.stringify(body)
    })

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-geri-"))
    env = { CORNSERVE_MODEL_DIR: root, ...secretEnv }
    const vlm = await loadModelDirectory(await buildModel("cornserve/tiny-color-vlm", root))
    tokenizer = new ChatTokenizer(vlm)
    embedTokens = await ort.InferenceSession.create(onnxPath(vlm, "embed_tokens"))
    sidecar = await startSidecar("geri-node", env)
    client = await SidecarClient.connect(sidecar.socket)
    const common = [
      "--kind",
      "geri",
      "--devices",
      "cpu:0",
      "--sidecar-socket",
      sidecar.socket,
      "--embedding-wait-ms",
      "500"
    ]
    ;[painter, tones] = await Promise.all([
      startExecutor([...common, "--model", "cornserve/tiny-color-painter"], env),
      startExecutor([...common, "--model", "cornserve/tiny-color-tones"], env)
    ])
  })

  afterAll(async () => {
    await client?.close()
    await Promise.all([painter?.stop(), tones?.stop()])
    await sidecar?.stop()
    await rm(root, { recursive: true, force: true })
  })

  it("paints the colour the prompt names", async () => {
    for (const [word, expected] of [
      ["red", [1, 0, 0]],
      ["blue", [0, 0, 1]],
      ["yellow", [1, 1, 0]]
    ] as const) {
      const response = await generate(painter.url, {
        embeddings: await sendPrompt(`paint the sky ${word}`),
        width: 64,
        height: 48
      })
      expect(response.status).toBe(200)
      const answer = (await response.json()) as { image: string; width: number; height: number; mimeType: string }
      expect(answer).toMatchObject({ width: 64, height: 48, mimeType: "image/png" })
      const stats = await sharp(Buffer.from(answer.image, "base64")).stats()
      const mean = stats.channels.slice(0, 3).map((channel) => channel.mean / 255)
      const distance = (colour: ReadonlyArray<number>) =>
        colour.reduce((sum, value, index) => sum + (value - mean[index]!) ** 2, 0)
      for (const other of [
        [0, 0, 0],
        [1, 1, 1],
        [1, 0, 0],
        [0, 1, 0],
        [0, 0, 1],
        [1, 1, 0],
        [0, 1, 1],
        [1, 0, 1]
      ]) {
        if (other.join() !== expected.join())
          expect(distance(expected), `${word} vs ${other}`).toBeLessThan(distance(other))
      }
    }
  })

  it("streams a tone of the named colour's pitch, chunk by chunk, as NDJSON", async () => {
    const response = await generate(tones.url, { embeddings: await sendPrompt("play me something red"), chunks: 5 })
    expect(response.status).toBe(200)
    expect(response.headers.get("content-type")).toContain("application/x-ndjson")
    const lines = (await response.text())
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line) as Record<string, unknown>)
    expect(lines.at(-1)).toEqual({ done: true, chunks: 5, sampleRate: 16_000 })
    const chunks = lines.slice(0, -1) as Array<{ chunk: number; audio: string; sampleRate: number }>
    expect(chunks.map((line) => line.chunk)).toEqual([0, 1, 2, 3, 4])
    const samples = chunks.flatMap((line) => {
      const bytes = Buffer.from(line.audio, "base64")
      return Array.from({ length: bytes.length / 2 }, (_, i) => bytes.readInt16LE(i * 2) / 32768)
    })
    expect(samples).toHaveLength(5 * 1600)
    expect(Math.abs(peakFrequency(samples, 16_000) - 650)).toBeLessThan(5)
  })

  it("answers one WAV file when not streaming", async () => {
    const response = await generate(tones.url, {
      embeddings: await sendPrompt("a blue note"),
      chunks: 3,
      stream: false
    })
    expect(response.status).toBe(200)
    expect(response.headers.get("content-type")).toBe("audio/wav")
    const wav = Buffer.from(await response.arrayBuffer())
    expect(wav.toString("ascii", 0, 4)).toBe("RIFF")
    expect(wav.readUInt32LE(24)).toBe(16_000)
    const samples = Array.from({ length: (wav.length - 44) / 2 }, (_, i) => wav.readInt16LE(44 + i * 2) / 32768)
    expect(samples).toHaveLength(3 * 1600)
    expect(Math.abs(peakFrequency(samples, 16_000) - 350)).toBeLessThan(5)
  })

  it("answers 404 for an embedding that never arrives, after a bounded wait", async () => {
    const response = await generate(painter.url, { embeddings: "never-sent" })
    expect(response.status).toBe(404)
    expect(((await response.json()) as { error: { code: string; message: string } }).error).toEqual({
      code: "EmbeddingMissing",
      message: "embedding never-sent did not arrive within 500 ms"
    })
  })

  it("regroups a tone into chunks of the asked size", async () => {
    const response = await generate(tones.url, {
      embeddings: await sendPrompt("play me something green"),
      chunks: 4,
      chunkSize: 1000
    })
    const lines = (await response.text())
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line) as { chunk?: number; audio?: string })
    expect(lines.at(-1)).toEqual({ done: true, chunks: 4, sampleRate: 16_000 })
    expect(lines.slice(0, -1).map((line) => [line.chunk, Buffer.from(line.audio!, "base64").length / 2])).toEqual([
      [0, 1000],
      [1, 1000],
      [2, 1000],
      [3, 1000]
    ])
  })

  it("refuses a malformed request (400)", async () => {
    const response = await generate(painter.url, { embeddings: [], width: -3 })
    expect(response.status).toBe(400)
  })

  describe("with generators of its own", () => {
    let noisy: Awaited<ReturnType<typeof startExecutor>>
    let broken: Awaited<ReturnType<typeof startExecutor>>

    /** A prompt's embeddings in the sidecar: four rows of arbitrary values. */
    const sendRows = async () => {
      const id = `rows-${next++}`
      const rows = Float32Array.from({ length: 4 * hidden }, (_, i) => Math.sin(i))
      await client.send(id, new Tensor("float32", [4, hidden], rows), { to: [sidecar.nodeId] })
      return id
    }

    const paint = async (seed?: number) => {
      const response = await generate(noisy.url, {
        embeddings: await sendRows(),
        ...(seed === undefined ? {} : { seed })
      })
      expect(response.status).toBe(200)
      return ((await response.json()) as { image: string }).image
    }

    beforeAll(async () => {
      const noisyDir = join(root, "noisy-painter")
      // Pixels are the noise itself, squeezed into [0, 1].
      await writeGenerator(noisyDir, (g, { noise }) => g.op("Sigmoid", [noise!]), true)
      const brokenDir = join(root, "broken-painter")
      // 4 rows of 64 values never make 5 × 7 × 11: the run fails inside ONNX Runtime, every time.
      await writeGenerator(brokenDir, (g, { embeds }) => g.op("Reshape", [embeds, g.int64s([5, 7, 11])]), false)
      const common = ["--kind", "geri", "--devices", "cpu:0", "--sidecar-socket", sidecar.socket]
      ;[noisy, broken] = await Promise.all([
        startExecutor([...common, "--model", noisyDir], env),
        startExecutor([...common, "--model", brokenDir], env)
      ])
    })

    afterAll(async () => {
      await Promise.all([noisy?.stop(), broken?.stop()])
    })

    it("paints the same image for the same seed and another for another seed", async () => {
      const first = await paint(7)
      expect(await paint(7)).toBe(first)
      expect(await paint(8)).not.toBe(first)
    })

    it("draws fresh noise for each request without a seed", async () => {
      expect(await paint()).not.toBe(await paint())
    })

    it("answers 500 when the model fails while running, naming the failure", async () => {
      const response = await generate(broken.url, { embeddings: await sendRows() })
      expect(response.status).toBe(500)
      const { error } = (await response.json()) as { error: { code: string; message: string } }
      expect(error.code).toBe("ExecutorFailed")
      expect(error.message).toContain("worker 0 failed")
      expect((await fetch(`${broken.url}/health`)).status).toBe(200)
    })
  })
})
