import net from "node:net"
import { randomBytes } from "node:crypto"
import { cp, mkdir, mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { pathToFileURL } from "node:url"
import * as ort from "onnxruntime-node"
import sharp from "sharp"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { decodeAudio, decodeImage, decodeVideoFrames } from "../../../src/executors/common/media/MediaDecoder.js"
import { wavFile } from "../../../src/executors/geri/router.js"
import { decodeAudioProcessorConfig, inputValues } from "../../../src/models/AudioProcessor.js"
import { decodeImageProcessorConfig, normalizePixels, resizeTarget } from "../../../src/models/ImageProcessor.js"
import { loadModelDirectory, onnxPath } from "../../../src/models/ModelDirectory.js"
import { buildModel } from "../../../src/models/ModelStore.js"
import { SidecarClient } from "../../../src/sidecar/SidecarClient.js"
import { Tensor } from "../../../src/sidecar/Tensor.js"
import { descendants, startExecutor, startSidecar } from "../../support/executors.js"
import { authorized, secretEnv } from "../executorSecret.js"

const png = (r: number, g: number, b: number, size = 40) =>
  sharp({ create: { width: size, height: size, channels: 3, background: { r, g, b } } })
    .png()
    .toBuffer()
const dataUrl = (mime: string, bytes: Buffer) => `data:${mime};base64,${bytes.toString("base64")}`

const wavTone = (hertz: number, sampleRate: number, seconds: number): Buffer =>
  wavFile(
    [
      Int16Array.from({ length: Math.round(sampleRate * seconds) }, (_, i) =>
        Math.round(0.4 * 32767 * Math.sin((2 * Math.PI * hertz * i) / sampleRate))
      )
    ],
    sampleRate
  )

interface Answer {
  readonly items: ReadonlyArray<{
    id: string
    modality: string
    dtype: string
    shape: [number, number]
    embedding?: Array<number>
  }>
}

const expectClose = (actual: ArrayLike<number>, expected: ArrayLike<number>) => {
  expect(actual.length).toBe(expected.length)
  let worst = 0
  for (let i = 0; i < actual.length; i++)
    worst = Math.max(worst, Math.abs(actual[i]! - expected[i]!) / (1 + Math.abs(expected[i]!)))
  expect(worst).toBeLessThan(1e-5)
}

describe("Eric: the multimodal encoder executor", () => {
  let root: string
  let mediaRoot: string
  let env: Record<string, string>
  let sidecar: Awaited<ReturnType<typeof startSidecar>>
  let eric: Awaited<ReturnType<typeof startExecutor>>
  let vlmDir: string
  let vision: ort.InferenceSession
  let audioEncoder: ort.InferenceSession

  const embed = (body: unknown) =>
    fetch(`${eric.url}/embeddings`, {
      method: "POST",
      headers: { ...authorized, "content-type": "application/json" },
      body: JSON.stringify(body)
    })

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-eric-"))
    mediaRoot = join(root, "media")
    await mkdir(mediaRoot)
    env = { CORNSERVE_MODEL_DIR: join(root, "models"), ...secretEnv }
    vlmDir = await buildModel("cornserve/tiny-color-vlm", env.CORNSERVE_MODEL_DIR)
    const model = await loadModelDirectory(vlmDir)
    vision = await ort.InferenceSession.create(onnxPath(model, "vision_encoder"))
    audioEncoder = await ort.InferenceSession.create(onnxPath(model, "audio_encoder"))
    sidecar = await startSidecar("eric-node", env)
    eric = await startExecutor(
      [
        "--kind",
        "eric",
        "--model",
        "cornserve/tiny-color-vlm",
        "--devices",
        "cpu:0,cpu:1",
        "--sidecar-socket",
        sidecar.socket,
        "--media-root",
        mediaRoot,
        "--max-media-bytes",
        "300000"
      ],
      env
    )
  })

  afterAll(async () => {
    await eric?.stop()
    await sidecar?.stop()
    await rm(root, { recursive: true, force: true })
  })

  const directVision = async (frames: ReadonlyArray<Float32Array>, size: number) => {
    const stacked = new Float32Array(frames.length * frames[0]!.length)
    frames.forEach((frame, index) => stacked.set(frame, index * frame.length))
    const output = await vision.run({
      pixel_values: new ort.Tensor("float32", stacked, [frames.length, 3, size, size])
    })
    return output.image_features!.data as Float32Array
  }

  it("reports its model, modalities and devices", async () => {
    const info = (await (await fetch(`${eric.url}/info`, { headers: authorized })).json()) as Record<string, unknown>
    expect(info).toMatchObject({
      kind: "eric",
      model: "cornserve/tiny-color-vlm",
      devices: ["cpu:0", "cpu:1"],
      modalities: ["image", "video", "audio"]
    })
    expect((await fetch(`${eric.url}/health`)).status).toBe(200)
  })

  it("takes calls only with the platform's secret, refusing from the headers alone; its health answers anyone", async () => {
    // Headers that announce a 10 MB body, and no body: the refusal comes without it, and the connection closes.
    const socket = net.connect(Number(new URL(eric.url).port), "127.0.0.1")
    socket.write(
      "POST /embeddings HTTP/1.1\r\nHost: executor\r\nContent-Type: application/json\r\nContent-Length: 10000000\r\n\r\n"
    )
    let answer = ""
    socket.on("data", (chunk: Buffer) => (answer += chunk.toString()))
    await new Promise((resolve) => socket.once("close", resolve))
    expect(answer).toMatch(/^HTTP\/1\.1 401 /)
    expect(answer).toMatch(/connection: close/i)
    expect(JSON.parse(answer.slice(answer.indexOf("\r\n\r\n") + 4))).toMatchObject({ error: { code: "Unauthorized" } })

    const wrong = await fetch(`${eric.url}/info`, { headers: { authorization: "Bearer not-the-secret" } })
    expect(wrong.status).toBe(401)
    expect((await fetch(`${eric.url}/health`)).status).toBe(200)
  })

  it("embeds an image exactly as a direct ONNX Runtime run on the same preprocessed input", async () => {
    const image = await png(230, 20, 30)
    const response = await embed({
      items: [{ id: "image-1", modality: "image", url: dataUrl("image/png", image) }],
      return: "inline"
    })
    expect(response.status).toBe(200)
    const [item] = ((await response.json()) as Answer).items
    const config = decodeImageProcessorConfig((await loadModelDirectory(vlmDir)).preprocessorConfig)
    const expected = await directVision(
      [normalizePixels(config, await decodeImage(image, resizeTarget(config)))],
      config.size.height
    )
    expect(item!.shape[0] * item!.shape[1]).toBe(expected.length)
    expectClose(item!.embedding!, expected)
  })

  it("embeds a tone exactly as a direct run of the audio encoder", async () => {
    const wav = wavTone(300, 22_050, 1)
    const response = await embed({
      items: [{ id: "tone-1", modality: "audio", url: dataUrl("audio/wav", wav) }],
      return: "inline"
    })
    expect(response.status).toBe(200)
    const [item] = ((await response.json()) as Answer).items
    const config = decodeAudioProcessorConfig((await loadModelDirectory(vlmDir)).preprocessorConfig)
    const values = inputValues(config, await decodeAudio(wav, "audio/wav", config.sampling_rate), config.sampling_rate)
    const output = await audioEncoder.run({ input_values: new ort.Tensor("float32", values, [1, values.length]) })
    expectClose(item!.embedding!, output.audio_features!.data as Float32Array)
  })

  it("embeds an animated image as a video of its frames", async () => {
    const frames = await Promise.all([png(255, 0, 0), png(0, 255, 0), png(0, 0, 255)])
    const gif = await sharp(frames, { join: { animated: true } })
      .gif()
      .toBuffer()
    const response = await embed({
      items: [{ id: "video-1", modality: "video", url: dataUrl("image/gif", gif) }],
      return: "inline"
    })
    expect(response.status).toBe(200)
    const [item] = ((await response.json()) as Answer).items
    const config = decodeImageProcessorConfig((await loadModelDirectory(vlmDir)).preprocessorConfig)
    const decoded = await decodeVideoFrames(gif, resizeTarget(config), 32)
    expect(decoded).toHaveLength(3)
    const expected = await directVision(
      decoded.map((frame) => normalizePixels(config, frame)),
      config.size.height
    )
    expectClose(item!.embedding!, expected)
  })

  it("sends each embedding through the sidecar under the item's id", async () => {
    const image = await png(10, 200, 40)
    const [inline] = (
      (await (
        await embed({
          items: [{ id: "inline-copy", modality: "image", url: dataUrl("image/png", image) }],
          return: "inline"
        })
      ).json()) as Answer
    ).items
    const response = await embed({
      items: [{ id: "through-sidecar", modality: "image", url: dataUrl("image/png", image) }],
      receivers: [sidecar.nodeId]
    })
    expect(response.status).toBe(200)
    const [item] = ((await response.json()) as Answer).items
    expect(item!.embedding).toBeUndefined()
    const client = await SidecarClient.connect(sidecar.socket)
    try {
      const received = await client.recv("through-sidecar", 0, { timeoutMs: 5_000 })
      expect(received).toBeInstanceOf(Tensor)
      expect((received as Tensor).shape).toEqual(item!.shape)
      expectClose((received as Tensor).data as Float32Array, inline!.embedding!)
      await client.markDone("through-sidecar")
    } finally {
      await client.close()
    }
  })

  it("fails a request with corrupt image bytes (400) while a request beside it succeeds", async () => {
    const good = embed({
      items: [{ id: "good", modality: "image", url: dataUrl("image/png", await png(0, 0, 0)) }],
      return: "inline"
    })
    const bad = embed({
      items: [{ id: "bad", modality: "image", url: dataUrl("image/png", Buffer.from("not a png, not at all")) }],
      return: "inline"
    })
    const [goodResponse, badResponse] = await Promise.all([good, bad])
    expect(goodResponse.status).toBe(200)
    expect(badResponse.status).toBe(400)
    expect(((await badResponse.json()) as { error: { message: string } }).error.message).toContain(
      "could not be decoded"
    )
  })

  it("refuses a URL to a private address, and a file outside the media root (400)", async () => {
    const privateUrl = await embed({
      items: [{ id: "p", modality: "image", url: "http://127.0.0.1:9/image.png" }],
      return: "inline"
    })
    expect(privateUrl.status).toBe(400)
    expect(((await privateUrl.json()) as { error: { message: string } }).error.message).toContain("private address")
    const outside = await embed({
      items: [{ id: "o", modality: "image", url: pathToFileURL("/etc/hostname").href }],
      return: "inline"
    })
    expect(outside.status).toBe(400)
    const inside = join(mediaRoot, "inside.png")
    await writeFile(inside, await png(255, 255, 0))
    const allowed = await embed({
      items: [{ id: "i", modality: "image", url: pathToFileURL(inside).href }],
      return: "inline"
    })
    expect(allowed.status).toBe(200)
  })

  it("refuses oversized media (413)", async () => {
    const noise = await sharp(randomBytes(400 * 400 * 3), { raw: { width: 400, height: 400, channels: 3 } })
      .png()
      .toBuffer()
    expect(noise.length).toBeGreaterThan(300_000)
    const response = await embed({
      items: [{ id: "huge", modality: "image", url: dataUrl("image/png", noise) }],
      return: "inline"
    })
    expect(response.status).toBe(413)
  })

  it("refuses more media items than its limit (400) before decoding any of them", async () => {
    const corrupt = dataUrl("image/png", Buffer.from("not a png, not at all"))
    const response = await embed({
      items: Array.from({ length: 50 }, (_, index) => ({ id: `many-${index}`, modality: "image", url: corrupt })),
      return: "inline"
    })
    expect(response.status).toBe(400)
    const { error } = (await response.json()) as { error: { code: string; message: string } }
    expect(error.code).toBe("MediaError")
    expect(error.message).toBe("the request has 50 media items; this executor takes at most 16 in one request")
  })

  it("refuses a WAV file at 0 Hz (400)", async () => {
    const response = await embed({
      items: [{ id: "zero-hertz", modality: "audio", url: dataUrl("audio/wav", wavFile([new Int16Array(1600)], 0)) }],
      return: "inline"
    })
    expect(response.status).toBe(400)
    expect(((await response.json()) as { error: { message: string } }).error.message).toContain(
      "sample rate of 0 Hz is outside 8000–192000 Hz"
    )
  })

  it("refuses a modality the model lacks (400), text included", async () => {
    const imagesOnly = join(root, "models", "images-only")
    await cp(vlmDir, imagesOnly, { recursive: true })
    await rm(join(imagesOnly, "onnx", "audio_encoder.onnx"))
    const executor = await startExecutor(["--kind", "eric", "--model", imagesOnly, "--devices", "cpu:0"], env)
    try {
      const response = await fetch(`${executor.url}/embeddings`, {
        method: "POST",
        headers: { ...authorized, "content-type": "application/json" },
        body: JSON.stringify({
          items: [{ id: "a", modality: "audio", url: dataUrl("audio/wav", wavTone(300, 16_000, 0.5)) }],
          return: "inline"
        })
      })
      expect(response.status).toBe(400)
      expect(((await response.json()) as { error: { code: string } }).error.code).toBe("UnsupportedModality")
      const text = await fetch(`${executor.url}/text-embeddings`, {
        method: "POST",
        headers: { ...authorized, "content-type": "application/json" },
        body: JSON.stringify({ inputs: ["hello"] })
      })
      expect(text.status).toBe(400)
      expect(((await text.json()) as { error: { message: string } }).error.message).toBe(
        `model ${imagesOnly} embeds image, video, not text: it has no onnx/model.onnx`
      )
    } finally {
      await executor.stop()
    }
  })

  it("is unhealthy (503) within a second of a worker being killed, and fails requests clearly", async () => {
    const worker = descendants(eric.process.pid!).find((entry) => entry.command.includes("executor-worker"))
    expect(worker).toBeDefined()
    process.kill(worker!.pid, "SIGKILL")
    const deadline = Date.now() + 1_000
    let status = 200
    while (status === 200 && Date.now() < deadline) {
      status = (await fetch(`${eric.url}/health`)).status
      if (status === 200) await new Promise((resolve) => setTimeout(resolve, 20))
    }
    expect(status).toBe(503)
    const body = (await (await fetch(`${eric.url}/health`)).json()) as { reason: string }
    expect(body.reason).toMatch(/worker \d \(cpu:\d\) exited on SIGKILL/)
    const response = await embed({
      items: [{ id: "late", modality: "image", url: dataUrl("image/png", await png(1, 2, 3)) }],
      return: "inline"
    })
    expect(response.status).toBe(503)
  })
})
