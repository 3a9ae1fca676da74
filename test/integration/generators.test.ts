import { mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import {
  AutoTokenizer,
  MimiDecoderModel,
  type PreTrainedTokenizer,
  SpeechT5ForTextToSpeech,
  SpeechT5HifiGan,
  Tensor
} from "@huggingface/transformers"
import OpenAI from "openai"
import sharp from "sharp"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { decodeAudio } from "../../src/executors/common/media/MediaDecoder.js"
import { tinyMimi } from "../../src/models/recipes/RandomMimi.js"
import { tinySpeechT5 } from "../../src/models/recipes/RandomSpeechT5.js"
import { writeModelFiles } from "../models/support/SmolVlmFixture.js"
import { offline } from "../models/support/TransformersJs.js"
import { adminHeaders, invoke, type RunningPlatform, repoRoot, runCli, startPlatform } from "../support/platform.js"

/**
 * Generators through the real binary and OpenAI's client. Text to speech: examples/speak.ts (a SpeechSynthesisTask on the built-in
 * cornserve/tiny-speecht5) answers OpenAI's `/v1/audio/speech` to the official client with the
 * samples of transformers.js's generate_speech on the same files, in every response_format and as
 * server-sent events, streamed in chunks; concurrent requests answer as alone; bad requests are
 * refused clearly and the platform goes on serving. Images: examples/paint.ts answers OpenAI's
 * `/v1/images/generations` with PNGs of the size asked for, the colour the prompt names, the same
 * seed the same picture. Codes to audio: examples/codec.ts (a CodecDecoderTask on the built-in
 * cornserve/tiny-mimi) streams the chunks of transformers.js's MimiDecoderModel output on the
 * same codes.
 */

const sampleRate = 16000

/** The PCM16 samples of a WAV file the platform wrote (44-byte header; streamed: sizes unknown). */
const wavSamples = (bytes: Buffer): Int16Array => {
  expect(bytes.subarray(0, 4).toString("latin1")).toBe("RIFF")
  expect(bytes.readUInt16LE(20)).toBe(1)
  expect(bytes.readUInt16LE(22)).toBe(1)
  expect(bytes.readUInt32LE(24)).toBe(sampleRate)
  expect(bytes.readUInt16LE(34)).toBe(16)
  const data = bytes.subarray(44)
  return new Int16Array(data.buffer.slice(data.byteOffset, data.byteOffset + data.length))
}

const pcmOf = (waveform: Float32Array) =>
  Int16Array.from(waveform, (sample) => Math.round(Math.max(-1, Math.min(1, sample)) * 32767))

/** The largest difference between two PCM16 signals of one length. */
const largestDifference = (a: Int16Array, b: Int16Array) => {
  expect(a.length).toBe(b.length)
  let most = 0
  for (let i = 0; i < a.length; i++) most = Math.max(most, Math.abs(a[i]! - b[i]!))
  return most
}

describe("generators end to end: speech and images", () => {
  let root: string
  let modelDir: string
  let platform: RunningPlatform
  let client: OpenAI
  let tokenizer: PreTrainedTokenizer
  let reference: SpeechT5ForTextToSpeech
  let vocoder: SpeechT5HifiGan
  let codecDir: string
  let codec: MimiDecoderModel

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-tts-"))
    // The built-in model's files, for transformers.js to read.
    modelDir = join(root, "tiny-speecht5")
    await writeModelFiles(modelDir, tinySpeechT5.build())
    tokenizer = await AutoTokenizer.from_pretrained(offline(modelDir))
    reference = (await SpeechT5ForTextToSpeech.from_pretrained(offline(modelDir), {
      dtype: "fp32"
    })) as SpeechT5ForTextToSpeech
    vocoder = (await SpeechT5HifiGan.from_pretrained(offline(join(modelDir, "vocoder")), {
      dtype: "fp32"
    })) as SpeechT5HifiGan
    platform = await startPlatform()
    codecDir = join(root, "tiny-mimi")
    await writeModelFiles(codecDir, tinyMimi.build())
    codec = (await MimiDecoderModel.from_pretrained(offline(codecDir), { dtype: "fp32" })) as MimiDecoderModel
    for (const app of ["speak", "paint", "codec"]) {
      const registered = await runCli(["app", "register", join(repoRoot, "examples", `${app}.ts`)], {
        CORNSERVE_GATEWAY_URL: platform.url
      })
      expect(registered.code, registered.stderr).toBe(0)
    }
    client = new OpenAI({ baseURL: `${platform.url}/app/speak/v1`, apiKey: "unused", maxRetries: 0 })
  }, 240_000)

  afterAll(async () => {
    await platform?.stop()
    await reference?.dispose()
    await vocoder?.dispose()
    await codec?.dispose()
    await rm(root, { recursive: true, force: true })
  })

  /** transformers.js's waveform of `text` in the voice in voices/NAME.bin (or the embedding given). */
  const referenceSpeech = async (text: string, speaker: Float32Array): Promise<Int16Array> => {
    const { input_ids } = tokenizer(text)
    const out = (await reference.generate_speech(input_ids, new Tensor("float32", speaker, [1, speaker.length]), {
      vocoder
    })) as { waveform: Tensor }
    return pcmOf(out.waveform.data as Float32Array)
  }

  const voice = async (name: string) => {
    const { readFile } = await import("node:fs/promises")
    const bytes = await readFile(join(modelDir, "voices", `${name}.bin`))
    return new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length))
  }

  const speak = async (body: Record<string, unknown>) =>
    Buffer.from(
      await (
        await client.audio.speech.create({ model: "cornserve/tiny-speecht5", voice: "alloy", ...body } as never)
      ).arrayBuffer()
    )

  it("speaks as transformers.js's generate_speech, to the sample (WAV)", async () => {
    const lengths = new Set<number>()
    for (const [text, name] of [
      ["Hello from Cornserve.", "alloy"],
      ["Streaming speech, chunk by chunk, while the decoder is still writing.", "echo"],
      ["Hi.", "nova"]
    ] as const) {
      const expected = await referenceSpeech(text, await voice(name))
      const got = wavSamples(await speak({ input: text, voice: name, response_format: "wav" }))
      // One unit of PCM16: the platform vocodes in windows, equal to the whole within float rounding.
      expect(largestDifference(got, expected), text).toBeLessThanOrEqual(1)
      lengths.add(got.length)
    }
    expect(lengths.size).toBe(3)
  })

  it("writes mp3, opus, aac, flac and 24 kHz pcm of the same audio", async () => {
    const text = "The same sentence in every format."
    const wav = wavSamples(await speak({ input: text, response_format: "wav" }))
    const seconds = wav.length / sampleRate
    const flac = await speak({ input: text, response_format: "flac" })
    expect(flac.subarray(0, 4).toString("latin1")).toBe("fLaC")
    const flacSamples = await decodeAudio(flac, "audio/flac", sampleRate)
    expect(largestDifference(pcmOf(flacSamples), wav)).toBeLessThanOrEqual(1)
    for (const [format, signature, mime] of [
      ["mp3", undefined, "audio/mpeg"],
      ["opus", "OggS", "audio/ogg"],
      ["aac", undefined, "audio/aac"]
    ] as const) {
      const bytes = await speak({ input: text, response_format: format })
      if (signature !== undefined) expect(bytes.subarray(0, 4).toString("latin1"), format).toBe(signature)
      const decoded = await decodeAudio(bytes, mime, sampleRate)
      // Encoders pad: a frame or two at most.
      expect(Math.abs(decoded.length / sampleRate - seconds), format).toBeLessThan(0.15)
    }
    // OpenAI's pcm: 24 kHz PCM16, no header.
    const pcm = await speak({ input: text, response_format: "pcm" })
    expect(Math.abs(pcm.length / 2 - wav.length * 1.5)).toBeLessThan(16)
    // mp3 is the default.
    const fallback = await speak({ input: text })
    expect(fallback[0] === 0xff || fallback.subarray(0, 3).toString("latin1") === "ID3").toBe(true)
  })

  it("streams the audio in chunks as it is spoken, on the native route and as server-sent events", async () => {
    const text = "A longer sentence, so that the audio comes in several chunks of growing size."
    const expected = await referenceSpeech(text, await voice("alloy"))
    const response = await invoke(platform.url, "speak", JSON.stringify({ input: text }))
    expect(response.status).toBe(200)
    const lines = (await response.text())
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line) as { audio: string; sampleRate: number })
    // 16 frames of 256 samples first, then 128, doubling.
    expect(lines.length).toBeGreaterThanOrEqual(3)
    const sizes = lines.map((line) => Buffer.from(line.audio, "base64").length / 2)
    expect(sizes.slice(0, 2)).toEqual([4096, 32768])
    const joined = Buffer.concat(lines.map((line) => Buffer.from(line.audio, "base64")))
    expect(
      largestDifference(new Int16Array(joined.buffer, joined.byteOffset, joined.length / 2), expected)
    ).toBeLessThanOrEqual(1)

    const events = await fetch(`${platform.url}/app/speak/v1/audio/speech`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ input: text, response_format: "wav", stream_format: "sse" })
    })
    expect(events.headers.get("content-type")).toMatch(/^text\/event-stream/)
    const parsed = (await events.text())
      .split("\n\n")
      .filter((event) => event.startsWith("data: "))
      .map((event) => JSON.parse(event.slice("data: ".length)) as { type: string; audio?: string })
    expect(parsed.at(-1)!.type).toBe("speech.audio.done")
    const deltas = parsed.filter((event) => event.type === "speech.audio.delta")
    expect(deltas.length).toBeGreaterThanOrEqual(3)
    const file = Buffer.concat(deltas.map((event) => Buffer.from(event.audio!, "base64")))
    expect(largestDifference(wavSamples(file), expected)).toBeLessThanOrEqual(1)
  })

  it("speaks with a speaker embedding given by URL, and answers concurrent requests as alone", async () => {
    const speaker = Float32Array.from({ length: 512 }, (_, i) => Math.sin(i * 0.37) * 0.05)
    const dataUrl = `data:application/octet-stream;base64,${Buffer.from(speaker.buffer).toString("base64")}`
    const text = "A voice of my own."
    const expected = await referenceSpeech(text, speaker)
    const got = wavSamples(
      await speak({ input: text, voice: undefined, speaker_embedding: dataUrl, response_format: "wav" })
    )
    expect(largestDifference(got, expected)).toBeLessThanOrEqual(1)

    const requests = ["One.", "Two words.", "Three short words.", "Four words in all."].map((input, index) => ({
      input,
      voice: ["alloy", "echo", "nova", "alloy"][index]!,
      response_format: "wav"
    }))
    const alone: Array<Int16Array> = []
    for (const request of requests) alone.push(wavSamples(await speak(request)))
    const together = await Promise.all(requests.map(async (request) => wavSamples(await speak(request))))
    together.forEach((samples, index) => expect(Array.from(samples)).toEqual(Array.from(alone[index]!)))
  })

  it("starts a request that arrives mid-utterance at once, not after the utterance", async () => {
    const events: Array<string> = []
    const stream = async (label: string, input: string, onFirst?: () => void) => {
      const response = await invoke(platform.url, "speak", JSON.stringify({ input }))
      const reader = response.body!.getReader()
      let first = true
      for (;;) {
        const { done } = await reader.read()
        if (done) break
        if (first) {
          events.push(`${label} first`)
          onFirst?.()
          first = false
        }
      }
      events.push(`${label} end`)
    }
    let later: Promise<void> | undefined
    // Ten seconds of speech and more: the short one is asked for once the long one is speaking.
    await stream("long", "A long passage, spoken while another request comes in. ".repeat(9), () => {
      later = stream("short", "Hello there.")
    })
    await later
    expect(events.indexOf("short first")).toBeGreaterThan(events.indexOf("long first"))
    expect(events.indexOf("short first")).toBeLessThan(events.indexOf("long end"))
  })

  it("refuses what it cannot do, clearly, and goes on serving", async () => {
    const post = (body: unknown) =>
      fetch(`${platform.url}/app/speak/v1/audio/speech`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(body)
      })
    const unknownVoice = await post({ input: "Hello", voice: "bob" })
    expect(unknownVoice.status).toBe(400)
    expect(await unknownVoice.text()).toContain("its voices are alloy, echo, nova")
    const speed = await post({ input: "Hello", speed: 1.5 })
    expect(speed.status).toBe(400)
    expect(await speed.text()).toContain("speed")
    const instructions = await post({ input: "Hello", instructions: "Speak calmly." })
    expect(instructions.status).toBe(400)
    expect(((await instructions.json()) as { error: { param: string } }).error.param).toBe("instructions")
    const tooLong = await post({ input: "word ".repeat(200) })
    expect(tooLong.status).toBe(400)
    expect(await tooLong.text()).toContain("at most 600")
    const wrongSize = await post({
      input: "Hello",
      voice: null,
      speaker_embedding: `data:application/octet-stream;base64,${Buffer.alloc(12).toString("base64")}`
    })
    expect(wrongSize.status).toBe(400)
    expect(await wrongSize.text()).toContain("512 float32 values")
    const both = await post({ input: "Hello", voice: "alloy", speaker_embedding: "data:," })
    expect(both.status).toBe(400)
    const empty = await post({ input: "" })
    expect(empty.status).toBe(422)
    const model = await post({ input: "Hello", model: "tts-1" })
    expect(model.status).toBe(404)
    await expect(client.audio.speech.create({ model: "tts-1", voice: "alloy", input: "Hi" })).rejects.toMatchObject({
      status: 404
    })
    // Still serving.
    expect(wavSamples(await speak({ input: "Still here.", response_format: "wav" })).length).toBeGreaterThan(0)
  })

  it("describes the speech route in the app's OpenAPI document", async () => {
    const document = (await (await fetch(`${platform.url}/app/speak/openapi.json`)).json()) as {
      paths: Record<string, { post?: { requestBody?: unknown } }>
    }
    expect(document.paths["/app/speak/v1/audio/speech"]?.post?.requestBody).toBeDefined()
  })

  it("paints from the LLM's final hidden states when the embedding task asks for them, of its answer too, and says their shape", async () => {
    // paint's tasks, the prompt's hidden states instead of its embed_tokens rows: the same deployments.
    const file = join(root, "paint_states.ts")
    await writeFile(
      file,
      `import { CompositeTask, defineApp, ImageGeneratorTask, LLMEmbeddingTask, type LLMEmbeddingOutput } from "cornserve/app"
import { Schema } from "effect"
interface Ask { prompt: string; source: "embed_tokens" | "hidden_states"; generate: boolean }
class PaintStates extends CompositeTask<Ask, { image: string } & Omit<LLMEmbeddingOutput, "embeddings">> {
  readonly name = "paint_states"
  private readonly embed = this.use(new LLMEmbeddingTask({ model: "cornserve/tiny-color-vlm", receiveEmbeddings: true, source: "hidden_states" }))
  private readonly painter = this.use(new ImageGeneratorTask({ model: "cornserve/tiny-color-painter" }))
  compose({ prompt, source, generate }: Ask) {
    const { embeddings, ...about } = this.embed.compose({ messages: [{ role: "user", content: prompt }], embeddingSource: source, embeddingGenerate: generate, max_tokens: 4 })
    const { image } = this.painter.compose({ embeddings, width: 16, height: 16 })
    return { image, ...about }
  }
}
const paintStates = new PaintStates()
export default defineApp({
  tasks: { paintStates },
  request: Schema.Struct({ prompt: Schema.String, source: Schema.Literal("embed_tokens", "hidden_states"), generate: Schema.Boolean }),
  response: Schema.Struct({
    image: Schema.String,
    shape: Schema.Tuple(Schema.Number, Schema.Number),
    dtype: Schema.String,
    completion: Schema.optional(Schema.Struct({ text: Schema.String, tokenIds: Schema.Array(Schema.Number), finishReason: Schema.String }))
  }),
  serve: async (request) => {
    const { image, shape, dtype, completion } = await paintStates.invoke(request)
    return { image, shape: shape!, dtype: dtype!, ...(completion === undefined ? {} : { completion }) }
  }
})
`
    )
    const registered = await runCli(["app", "register", file], { CORNSERVE_GATEWAY_URL: platform.url })
    expect(registered.code, registered.stderr).toBe(0)
    const answers = []
    for (const [source, generate] of [
      ["hidden_states", false],
      ["embed_tokens", false],
      ["hidden_states", true]
    ]) {
      const response = await invoke(
        platform.url,
        "paint_states",
        JSON.stringify({ prompt: "Paint me something blue.", source, generate })
      )
      const text = await response.text()
      expect(response.status, text).toBe(200)
      answers.push(
        JSON.parse(text) as {
          image: string
          shape: [number, number]
          dtype: string
          completion?: { text: string; tokenIds: Array<number>; finishReason: string }
        }
      )
    }
    const [states, rows, generated] = answers
    expect(states!.dtype).toBe("float32")
    expect(states!.shape).toEqual(rows!.shape)
    expect(states!.shape[0]).toBeGreaterThan(1)
    expect(states!.completion).toBeUndefined()
    // The prompt with the generation prompt, then the tokens it generated, one row each.
    const { tokenIds, finishReason } = generated!.completion!
    expect(tokenIds.length).toBeGreaterThan(0)
    expect(tokenIds.length).toBeLessThanOrEqual(4)
    expect(["stop", "length"]).toContain(finishReason)
    expect(generated!.shape[0] - tokenIds.length).toBeGreaterThanOrEqual(states!.shape[0])
    for (const { image } of answers) expect((await sharp(Buffer.from(image, "base64")).metadata()).width).toBe(16)
  })

  it("reads one image's embedding in two tasks on one node, and leaves nothing in the sidecar", async () => {
    // The encoder's output goes to the LLM that paints from it and to the LLM that names the colour.
    const file = join(root, "name_and_paint.ts")
    await writeFile(
      file,
      `import { ChatCompletionRequest, CompositeTask, defineApp, EncoderTask, ImageGeneratorTask, LLMEmbeddingTask, LLMTask } from "cornserve/app"
const model = "cornserve/tiny-color-vlm"
class NameAndPaint extends CompositeTask<{ url: string }, any> {
  readonly name = "name_and_paint"
  private readonly encoder = this.use(new EncoderTask({ model, modality: "image" }))
  private readonly embed = this.use(new LLMEmbeddingTask({ model, receiveEmbeddings: true }))
  private readonly painter = this.use(new ImageGeneratorTask({ model: "cornserve/tiny-color-painter" }))
  private readonly llm = this.use(new LLMTask({ model, receiveEmbeddings: true, maxBatchSize: 4 }))
  compose({ url }: { url: string }) {
    const { embeddings: [image] } = this.encoder.compose({ urls: [url] })
    const messages = [{ role: "user" as const, content: [{ type: "image_url" as const, image_url: { url } }, { type: "text" as const, text: "What colour is this image?" }] }]
    const { embeddings } = this.embed.compose({ messages, cornserveEmbeddings: [image!] })
    const { image: painted } = this.painter.compose({ embeddings, width: 16, height: 16 })
    const answer = this.llm.compose({ messages, cornserveEmbeddings: [image!], max_tokens: 4 })
    return { painted, answer }
  }
}
const nameAndPaint = new NameAndPaint()
export default defineApp({
  tasks: { nameAndPaint },
  request: ChatCompletionRequest,
  async *serve(request) {
    const part = (request.messages[0]!.content as ReadonlyArray<{ type: string; image_url?: { url: string } }>).find((p) => p.type === "image_url")!
    const { painted, answer } = await nameAndPaint.invoke({ url: part.image_url!.url })
    let text = ""
    for await (const chunk of answer) text += chunk.choices[0]?.delta.content ?? ""
    yield { text, painted: painted.length }
  }
})
`
    )
    const registered = await runCli(["app", "register", file], { CORNSERVE_GATEWAY_URL: platform.url })
    expect(registered.code, registered.stderr).toBe(0)
    const red =
      "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
    const response = await invoke(
      platform.url,
      "name_and_paint",
      JSON.stringify({ messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: red } }] }] })
    )
    const text = await response.text()
    expect(response.status, text).toBe(200)
    const answer = JSON.parse(text.trim().split("\n")[0]!) as { text: string; painted: number }
    expect(answer.text.toLowerCase()).toContain("red")
    expect(answer.painted).toBeGreaterThan(0)
    // Nothing is left in the node's sidecar once both have read it.
    const metrics = await (await fetch(`${platform.url}/metrics`, { headers: adminHeaders() })).text()
    expect(metrics).toMatch(/^cornserve_sidecar_bytes_in_use\{node="[^"]+"\} 0$/m)
  })

  it("paints images for OpenAI's image generations: the size asked for, the colour named, seeded", async () => {
    const images = new OpenAI({ baseURL: `${platform.url}/app/paint/v1`, apiKey: "unused", maxRetries: 0 })
    const answer = await images.images.generate({
      prompt: "a red square",
      size: "48x32" as never,
      n: 2,
      seed: 7
    } as never)
    expect(answer.data).toHaveLength(2)
    const decoded = await Promise.all(
      answer.data!.map((image) =>
        sharp(Buffer.from(image.b64_json!, "base64")).raw().toBuffer({ resolveWithObject: true })
      )
    )
    for (const { info, data } of decoded) {
      expect([info.width, info.height]).toEqual([48, 32])
      const mean = [0, 1, 2].map((channel) => {
        let sum = 0
        for (let i = channel; i < data.length; i += info.channels) sum += data[i]!
        return sum / (data.length / info.channels)
      })
      expect(mean[0]!, "red").toBeGreaterThan(mean[1]! + 50)
      expect(mean[0]!, "red").toBeGreaterThan(mean[2]! + 50)
    }
    const again = await images.images.generate({
      prompt: "a red square",
      size: "48x32" as never,
      n: 1,
      seed: 7
    } as never)
    expect(again.data![0]!.b64_json).toBe(answer.data![0]!.b64_json)
    const blue = await images.images.generate({ prompt: "deep blue", size: "48x32" as never, seed: 7 } as never)
    expect(blue.data![0]!.b64_json).not.toBe(answer.data![0]!.b64_json)

    const post = (body: unknown) =>
      fetch(`${platform.url}/app/paint/v1/images/generations`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(body)
      })
    const url = await post({ prompt: "red", response_format: "url" })
    expect(url.status).toBe(400)
    expect(((await url.json()) as { error: { param: string } }).error.param).toBe("response_format")
    expect((await post({ prompt: "red", stream: true })).status).toBe(400)
    expect((await post({ prompt: "red", size: "3x5000" })).status).toBe(422)
    expect((await post({ prompt: "red", n: 11 })).status).toBe(422)
    const document = (await (await fetch(`${platform.url}/app/paint/openapi.json`)).json()) as {
      paths: Record<string, unknown>
    }
    expect(document.paths["/app/paint/v1/images/generations"]).toBeDefined()
  })

  it("decodes Mimi codes to the audio of transformers.js's MimiDecoderModel, streamed in chunks", async () => {
    const frames = 120
    const codes = Array.from({ length: 8 }, (_, q) => Array.from({ length: frames }, (_, t) => (t * 13 + q * 29) % 64))
    const whole = (await codec({
      audio_codes: new Tensor("int64", BigInt64Array.from(codes.flat(), BigInt), [1, 8, frames])
    })) as { audio_values: Tensor }
    const expected = pcmOf(whole.audio_values.data as Float32Array)
    const response = await invoke(platform.url, "codec", JSON.stringify({ codes }))
    expect(response.status).toBe(200)
    const lines = (await response.text())
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line) as { audio: string; sampleRate: number })
    expect(lines.every((line) => line.sampleRate === 24000)).toBe(true)
    // 5 frames of 1920 samples first, then 40, then the 75 left (a chunk of 80 cut short).
    expect(lines.map((line) => Buffer.from(line.audio, "base64").length / 2)).toEqual([5 * 1920, 40 * 1920, 75 * 1920])
    const joined = Buffer.concat(lines.map((line) => Buffer.from(line.audio, "base64")))
    // Each chunk decoded with the decoder's whole reach before it: equal to the whole within float rounding.
    expect(
      largestDifference(new Int16Array(joined.buffer, joined.byteOffset, joined.length / 2), expected)
    ).toBeLessThanOrEqual(1)
  })

  it("refuses codes the codec cannot decode, clearly, and goes on decoding", async () => {
    const rows = (count: number, frames: number, code = 1) =>
      Array.from({ length: count }, () => Array.from({ length: frames }, () => code))
    for (const [body, message] of [
      [{ codes: rows(3, 10) }, "this model decodes 8"],
      [{ codes: rows(8, 10, 64) }, "codes are 0 to 63"],
      [{ codes: [...rows(7, 10), [1, 2]] }, "every codebook has a code per frame"],
      [{ codes: rows(8, 7501) }, "at most 7500"],
      [{ codes: rows(8, 10, -1) }, "codes are 0 to 63"]
    ] as const) {
      const refused = await invoke(platform.url, "codec", JSON.stringify(body))
      expect(refused.status, message).toBe(400)
      expect(await refused.text()).toContain(message)
    }
    // The app takes any rows; the task refuses none at all.
    const empty = await invoke(platform.url, "codec", JSON.stringify({ codes: [] }))
    expect(empty.status).toBe(400)
    expect(await empty.text()).toContain("codes")
    const still = await invoke(platform.url, "codec", JSON.stringify({ codes: rows(8, 3) }))
    expect(still.status).toBe(200)
    expect(Buffer.from(((await still.json()) as { audio: string }).audio, "base64").length).toBe(3 * 1920 * 2)
  })

  it("records a codec task's profile from synthetic codes of the model's codebooks", async () => {
    const { tasks } = (await (await fetch(`${platform.url}/tasks/list`)).json()) as {
      tasks: Array<{ readonly id: string; readonly name: string }>
    }
    const codecTask = tasks.find((task) => task.name.startsWith("codec-decoder"))!
    const recorded = await runCli(
      ["tasks", "profile", codecTask.id, "--record", "--levels", "1", "--seconds-per-level", "1", "--json"],
      { CORNSERVE_GATEWAY_URL: platform.url }
    )
    expect(recorded.code, recorded.stderr).toBe(0)
    const answer = JSON.parse(recorded.stdout) as {
      readonly curves: ReadonlyArray<{ readonly points: ReadonlyArray<{ readonly calls: number }> }>
    }
    expect(answer.curves[0]!.points[0]!.calls).toBeGreaterThan(0)
  })
})
