import { createHash } from "node:crypto"
import { createServer, type Server } from "node:http"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { TaskInvocationWire } from "../../../src/app-runtime/tasks/TaskGraph.js"
import { EmbeddingCache } from "../../../src/control/executor-calls/EmbeddingCache.js"
import {
  type CallContext,
  type EmbeddingCaching,
  embedFromCache,
  executorCalls
} from "../../../src/control/executor-calls/ExecutorCalls.js"
import type { EmbeddingsRequest } from "../../../src/executors/eric/api.js"
import { decodeAudio, decodeImage, decodeVideoFrames } from "../../../src/executors/common/media/MediaDecoder.js"
import { readMedia } from "../../../src/executors/common/media/MediaSource.js"
import { wavFile } from "../../../src/executors/common/media/Wav.js"
import type { Payload } from "../../../src/sidecar/SidecarClient.js"
import { tone } from "../../models/support/Synthetic.js"

/**
 * A stand-in encoder that reads each item as Eric does (the same URL reader, the real decoders) and
 * answers a digest of what it read: the samples of a clip at 16 kHz, the pixels of an image or of a
 * video's frames, with the processor settings that Qwen2-VL's resizing would read them with.
 */
const readingOf = async (item: EmbeddingsRequest["items"][number], processor: unknown): Promise<string> => {
  const media = await readMedia(item.url, {
    allowedRoot: undefined,
    allowPrivateHosts: false,
    maxBytes: 1 << 24,
    timeoutMs: 1000
  })
  const target = { width: 4, height: 4, kernel: "nearest" } as const
  const decoded =
    item.modality === "audio"
      ? [await decodeAudio(media.bytes, media.mimeType, 16_000)]
      : item.modality === "image"
        ? [(await decodeImage(media.bytes, target)).data]
        : (await decodeVideoFrames(media.bytes, target, 4)).map((frame) => frame.data)
  const hash = createHash("sha256").update(`${item.modality} ${JSON.stringify(processor ?? null)}`)
  for (const part of decoded) hash.update(new Uint8Array(part.buffer, part.byteOffset, part.byteLength))
  return hash.digest("hex")
}

/** What the stand-in encoder sent the control plane's node for the cache, by data id. */
const sent = new Map<string, string>()
let server: Server
let encoderUrl = ""

beforeAll(async () => {
  server = createServer((request, response) => {
    const chunks: Array<Buffer> = []
    request.on("data", (chunk: Buffer) => chunks.push(chunk))
    request.on("end", async () => {
      const body = JSON.parse(Buffer.concat(chunks).toString("utf8")) as EmbeddingsRequest
      try {
        for (const item of body.items) sent.set(item.id, await readingOf(item, body.processor))
        response.setHeader("content-type", "application/json")
        response.end(
          JSON.stringify({
            items: body.items.map((item) => ({ id: item.id, modality: item.modality, dtype: "float32", shape: [1, 1] }))
          })
        )
      } catch (error) {
        response.statusCode = 400
        response.end(JSON.stringify({ error: { code: "MediaError", message: String(error) } }))
      }
    })
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  encoderUrl = `http://127.0.0.1:${(server.address() as { port: number }).port}`
})

afterAll(() => new Promise((resolve) => server.close(resolve)))

/** One way of sending an item: its URL, the modality the call says, the processor settings. */
interface Reading {
  readonly name: string
  readonly modality: "image" | "video" | "audio"
  readonly url: string
  readonly processor?: Record<string, number>
}

let calls = 0
const invocationOf = (reading: Reading): TaskInvocationWire => ({
  taskId: "encoder-test",
  kind: "encoder",
  operation: "embed",
  config: { model: "m", modality: reading.modality, maxBatchSize: 1 },
  input: { urls: [reading.url], ...(reading.processor === undefined ? {} : { processor: reading.processor }) },
  output: { embeddings: [{ $dataForward: `out${++calls}`, dataType: "Tensor" }] },
  streams: false
})

/** A platform's cache of encoder outputs, and what each call forwarded to the LLM. */
const platform = () => {
  const forwarded = new Map<string, ReadonlyArray<Payload>>()
  const caching: EmbeddingCaching = {
    cache: new EmbeddingCache(1 << 20),
    node: "control",
    take: async (id) => [sent.get(id)!],
    forward: async (id, chunks) => void forwarded.set(id, chunks),
    discard: () => undefined,
    observe: () => undefined
  }
  const context: CallContext = {
    receivers: ["llm-node"],
    modalities: new Map(),
    signal: new AbortController().signal,
    embeddings: caching
  }
  /** What the LLM is given for `reading`: from the cache before any lease, as the dispatcher asks it, else by a call. */
  const answer = async (reading: Reading): Promise<ReadonlyArray<Payload>> => {
    const invocation = invocationOf(reading)
    const served = embedFromCache(invocation, caching)
    await (served === undefined ? executorCalls.embed!(encoderUrl, invocation, context) : served(context))
    const id = (invocation.output as { embeddings: Array<{ $dataForward: string }> }).embeddings[0]!.$dataForward
    return forwarded.get(id)!
  }
  return { answer, caching }
}

const dataUrl = (mediaType: string, bytes: Buffer) => `data:${mediaType};base64,${bytes.toString("base64")}`

/** A high tone recorded at 48 kHz: read as a WAV file it is high; its bytes as raw 16 kHz samples are a lower, longer one. */
const wav = wavFile([Int16Array.from(tone(1000, 48_000, 0.1, 0.5), (sample) => Math.round(sample * 32767))], 48_000)

/** A one-pixel red PNG. */
const png = Buffer.from(
  "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC",
  "base64"
)

describe("the cache of encoder outputs, between two readings of the same bytes", () => {
  const pairs: ReadonlyArray<readonly [Reading, Reading]> = [
    [
      { name: "a WAV file", modality: "audio", url: dataUrl("audio/wav", wav) },
      { name: "its bytes as pcm16", modality: "audio", url: dataUrl("audio/pcm16", wav) }
    ],
    [
      { name: "a WAV file without a media type", modality: "audio", url: dataUrl("", wav) },
      { name: "its bytes as L16", modality: "audio", url: dataUrl("audio/l16", wav) }
    ],
    [
      { name: "an image", modality: "image", url: dataUrl("image/png", png) },
      { name: "the same bytes as a video", modality: "video", url: dataUrl("image/png", png) }
    ],
    [
      { name: "an image", modality: "image", url: dataUrl("image/png", png) },
      {
        name: "the same image with max_pixels",
        modality: "image",
        url: dataUrl("image/png", png),
        processor: { max_pixels: 3136 }
      }
    ],
    [
      { name: "a video at 1 fps", modality: "video", url: dataUrl("image/png", png), processor: { fps: 1 } },
      { name: "the same video at 2 fps", modality: "video", url: dataUrl("image/png", png), processor: { fps: 2 } }
    ]
  ]

  it("reads a WAV file's bytes as pcm16 otherwise than as the file", async () => {
    const [asFile, asSamples] = pairs[0]!
    expect(await platform().answer(asSamples)).not.toEqual(await platform().answer(asFile))
  })

  it.each(
    pairs.flatMap(([a, b]) => [
      { first: a, second: b },
      { first: b, second: a }
    ])
  )("answers $first.name, then $second.name, as a cold cache answers the second", async ({ first, second }) => {
    const cold = await platform().answer(second)
    const warm = platform()
    await warm.answer(first)
    expect(await warm.answer(second)).toEqual(cold)
    // Sent again, the second is the cache's, and still its own.
    expect(await warm.answer(second)).toEqual(cold)
  })

  it("keeps one entry for one reading, however its data: URL spells the bytes", async () => {
    const { answer, caching } = platform()
    const samples = Buffer.from([1, 0, 2, 0, 3, 0, 4, 0])
    const first = await answer({ name: "", modality: "audio", url: dataUrl("audio/pcm16", samples) })
    const percent = `data:audio/pcm16,${[...samples].map((byte) => `%${byte.toString(16).padStart(2, "0")}`).join("")}`
    expect(await answer({ name: "", modality: "audio", url: percent })).toEqual(first)
    expect(caching.cache.stats.entries).toBe(1)
  })
})
