import { readFileSync } from "node:fs"
import { mkdtemp, rm } from "node:fs/promises"
import http from "node:http"
import { tmpdir } from "node:os"
import { join } from "node:path"
import OpenAI from "openai"
import { ffmpegFile } from "../../support/videos.js"
import * as ort from "onnxruntime-node"
import sharp from "sharp"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { batchBufferPrefix } from "../../../src/executors/common/BatchBuffer.js"
import type { LlmStats } from "../../../src/executors/llm/api.js"
import { wavFile } from "../../../src/executors/geri/router.js"
import { loadModelDirectory, type ModelDirectory, onnxPath } from "../../../src/models/ModelDirectory.js"
import { exposeHiddenStates, hiddenStatesOutput } from "../../../src/models/onnx/HiddenStatesOutput.js"
import { buildModel } from "../../../src/models/ModelStore.js"
import { Random } from "../../../src/models/Random.js"
import { colors, type NamedColor } from "../../../src/models/recipes/ColorChannels.js"
import { ChatTokenizer } from "../../../src/models/Tokenizer.js"
import { colorImage, tone } from "../../models/support/Synthetic.js"
import { descendants, startExecutor } from "../../support/executors.js"
import { authorized, secretEnv, testSecret } from "../executorSecret.js"

/**
 * The LLM executor as a user meets it: the real process group (router, engine, worker) serving
 * cornserve/tiny-color-vlm, driven over HTTP with the official openai client.
 */

const model = "cornserve/tiny-color-vlm"

let root: string
let vlm: ModelDirectory
let executor: Awaited<ReturnType<typeof startExecutor>>
let client: OpenAI

const pngDataUrl = async (color: NamedColor, seed: number): Promise<string> => {
  const { image } = colorImage(
    new Random(seed),
    color,
    colors[(colors.indexOf(color) + 3) % colors.length]!,
    "noisy-patch"
  )
  const png = await sharp(Buffer.from(image.data), { raw: { width: image.width, height: image.height, channels: 3 } })
    .png()
    .toBuffer()
  return `data:image/png;base64,${png.toString("base64")}`
}

const wavBase64 = (hertz: number) => {
  const samples = tone(hertz, 16_000, 1, 0.5)
  return wavFile([Int16Array.from(samples, (sample) => Math.round(sample * 32767))], 16_000).toString("base64")
}

/** Chat parameters with vLLM's ignore_eos, which the openai client passes through. */
const ignoringEos = (
  params: OpenAI.Chat.ChatCompletionCreateParamsNonStreaming
): OpenAI.Chat.ChatCompletionCreateParamsNonStreaming =>
  ({ ...params, ignore_eos: true }) as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming

const imageQuestion = (url: string): OpenAI.Chat.ChatCompletionMessageParam => ({
  role: "user",
  content: [
    { type: "image_url", image_url: { url } },
    { type: "text", text: "What colour is this image?" }
  ]
})

const post = (path: string, body: unknown) =>
  fetch(`${executor.url}${path}`, {
    method: "POST",
    headers: { ...authorized, "content-type": "application/json" },
    body: JSON.stringify(body)
  })

const stats = async (): Promise<LlmStats> =>
  (await (await fetch(`${executor.url}/v1/cornserve/stats`, { headers: authorized })).json()) as LlmStats

/** Polls the executor's stats until `done` holds (the test's timeout bounds it). */
const statsWhen = async (done: (stats: LlmStats) => boolean): Promise<LlmStats> => {
  for (;;) {
    const current = await stats()
    if (done(current)) return current
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
}

/**
 * A client on its own connection that sends a request, and can hang up (closing the connection,
 * as a client that goes away does). Answers the status and the first piece of the body.
 */
const openRequest = (body: unknown) => {
  const request = http.request(`${executor.url}/v1/chat/completions`, {
    method: "POST",
    agent: false,
    headers: { ...authorized, "content-type": "application/json" }
  })
  const response = new Promise<{ readonly status: number; readonly first: string }>((resolve, reject) => {
    request.once("response", (incoming) =>
      incoming.once("data", (chunk: Buffer) => resolve({ status: incoming.statusCode!, first: chunk.toString() }))
    )
    request.once("error", reject)
  })
  response.catch(() => undefined)
  request.end(JSON.stringify(body))
  return { response, hangUp: () => request.destroy() }
}

/** A request that runs long: it ignores end-of-sequence up to max_tokens. */
const longRequest = (stream: boolean) =>
  openRequest({
    model,
    messages: [{ role: "user", content: "Tell me everything." }],
    stream,
    ignore_eos: true,
    max_tokens: 1000
  })

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "cornserve-llm-"))
  vlm = await loadModelDirectory(await buildModel(model, root))
  executor = await startExecutor(
    ["--kind", "llm", "--model", model, "--devices", "cpu:0", "--max-batch-size", "8", "--max-queue", "8"],
    { CORNSERVE_MODEL_DIR: root, ...secretEnv }
  )
  client = new OpenAI({ baseURL: `${executor.url}/v1`, apiKey: testSecret, maxRetries: 0 })
})

afterAll(async () => {
  await executor?.stop()
  await rm(root, { recursive: true, force: true })
})

describe("the LLM executor, through the openai client", () => {
  it("lists its model", async () => {
    const models = await client.models.list()
    expect(models.data.map((entry) => entry.id)).toEqual([model])
  })

  it("names an image's colour, whole and streamed, with usage", async () => {
    const url = await pngDataUrl(colors[5]!, 1)
    const completion = await client.chat.completions.create({ model, messages: [imageQuestion(url)], temperature: 0 })
    expect(completion.choices[0]!.message.content).toBe(colors[5]!.name)
    expect(completion.choices[0]!.finish_reason).toBe("stop")
    // The image's placeholder counts as its rows.
    expect(completion.usage!.prompt_tokens).toBeGreaterThan(vlm.config.image_seq_length!)
    expect(completion.usage).toMatchObject({ completion_tokens: 2, total_tokens: completion.usage!.prompt_tokens + 2 })

    const stream = await client.chat.completions.create({
      model,
      messages: [imageQuestion(url)],
      temperature: 0,
      stream: true,
      stream_options: { include_usage: true }
    })
    const chunks: Array<OpenAI.Chat.ChatCompletionChunk> = []
    for await (const chunk of stream) chunks.push(chunk)
    expect(chunks.flatMap((chunk) => chunk.choices.map((choice) => choice.delta.content ?? "")).join("")).toBe(
      colors[5]!.name
    )
    expect(chunks[0]!.choices[0]!.delta.role).toBe("assistant")
    expect(
      chunks.flatMap((chunk) => chunk.choices.map((choice) => choice.finish_reason)).filter((reason) => reason !== null)
    ).toEqual(["stop"])
    expect(chunks.at(-1)!.choices).toEqual([])
    expect(chunks.at(-1)!.usage).toEqual(completion.usage)
  })

  it("ends the SSE stream with data: [DONE]", async () => {
    const response = await post("/v1/chat/completions", {
      model,
      messages: [{ role: "user", content: "Hello" }],
      stream: true
    })
    expect(response.headers.get("content-type")).toMatch(/^text\/event-stream/)
    const events = (await response.text()).split("\n\n").filter((event) => event.length > 0)
    expect(events.at(-1)).toBe("data: [DONE]")
    expect(events.slice(0, -1).every((event) => event.startsWith("data: {"))).toBe(true)
  })

  it("hears whether a tone is low or high", async () => {
    for (const [hertz, expected] of [
      [220, "low"],
      [3000, "high"]
    ] as const) {
      const completion = await client.chat.completions.create({
        model,
        messages: [
          {
            role: "user",
            content: [
              { type: "input_audio", input_audio: { data: wavBase64(hertz), format: "wav" } },
              { type: "text", text: "Low or high?" }
            ]
          }
        ],
        temperature: 0
      })
      expect(completion.choices[0]!.message.content).toBe(expected)
    }
  })

  it("hears a tone sent as mp3 (input_audio) and as ogg Opus and flac (audio_url), decoded with ffmpeg", async () => {
    for (const [hertz, expected] of [
      [220, "low"],
      [3000, "high"]
    ] as const) {
      const wav = Buffer.from(wavBase64(hertz), "base64")
      const encode = (args: ReadonlyArray<string>, format: string) =>
        ffmpegFile(["-f", "wav", "-i", "pipe:0", ...args], format, wav)
      const mp3 = await encode(["-c:a", "libmp3lame", "-b:a", "128k"], "mp3")
      const opus = await encode(["-c:a", "libopus", "-b:a", "96k"], "ogg")
      const flac = await encode(["-c:a", "flac"], "flac")
      const parts: ReadonlyArray<OpenAI.Chat.ChatCompletionContentPart> = [
        { type: "input_audio", input_audio: { data: mp3.toString("base64"), format: "mp3" } },
        { type: "audio_url", audio_url: { url: `data:audio/ogg;base64,${opus.toString("base64")}` } } as never,
        { type: "audio_url", audio_url: { url: `data:audio/flac;base64,${flac.toString("base64")}` } } as never
      ]
      for (const part of parts) {
        const completion = await client.chat.completions.create({
          model,
          messages: [{ role: "user", content: [part, { type: "text", text: "Low or high?" }] }],
          temperature: 0
        })
        expect(completion.choices[0]!.message.content, `${hertz} Hz as ${part.type}`).toBe(expected)
      }
    }
  })

  it("keeps to max_tokens and max_completion_tokens, and cuts at a stop string", async () => {
    const messages: Array<OpenAI.Chat.ChatCompletionMessageParam> = [{ role: "user", content: "Say something." }]
    for (const limit of [{ max_tokens: 5 }, { max_completion_tokens: 7 }]) {
      const completion = await client.chat.completions.create(ignoringEos({ model, messages, ...limit }))
      expect(completion.choices[0]!.finish_reason).toBe("length")
      expect(completion.usage!.completion_tokens).toBe(Object.values(limit)[0])
    }
    const stopped = await client.chat.completions.create({ model, messages, stop: ["thing"] })
    expect(stopped.choices[0]!.message.content).toBe("no")
    expect(stopped.choices[0]!.finish_reason).toBe("stop")
  })

  it("samples with temperature and top_p, the same tokens for the same seed", async () => {
    const ask = (seed: number) =>
      client.chat.completions.create(
        ignoringEos({
          model,
          messages: [{ role: "user", content: "Anything?" }],
          temperature: 1.5,
          top_p: 0.95,
          seed,
          max_tokens: 12
        })
      )
    const [first, again] = await Promise.all([ask(7), ask(7)])
    expect(first.choices[0]!.message.content).toBe(again.choices[0]!.message.content)
    expect(first.usage!.completion_tokens).toBe(12)
  })

  it("gives the same greedy answers alone as batched with the others of 8 sent at once", async () => {
    const conversations: Array<Array<OpenAI.Chat.ChatCompletionMessageParam>> = [
      ...(await Promise.all(
        [0, 2, 4, 6, 7].map(async (color, i) => [imageQuestion(await pngDataUrl(colors[color]!, 10 + i))])
      )),
      [{ role: "user", content: [{ type: "input_audio", input_audio: { data: wavBase64(5000), format: "wav" } }] }],
      [
        { role: "system", content: "Be brief." },
        { role: "user", content: "Tell me about a zebra in Zürich 🦓" }
      ],
      [{ role: "user", content: "hi" }]
    ]
    // Long enough that the last of the 8 (media take longer to read) joins before the first is done.
    const requests = conversations.map((messages) => ignoringEos({ model, messages, temperature: 0, max_tokens: 96 }))
    const alone: Array<string> = []
    for (const request of requests)
      alone.push((await client.chat.completions.create(request)).choices[0]!.message.content!)
    const before = await stats()
    const cachedBefore = before.prefixCache!
    const batched = await Promise.all(
      requests.map(async (request) => (await client.chat.completions.create(request)).choices[0]!.message.content!)
    )
    expect(batched).toEqual(alone)
    // Each says its answer first; ignoring end-of-sequence, it then goes on to max_tokens.
    ;[...[0, 2, 4, 6, 7].map((color) => colors[color]!.name), "high"].forEach((answer, i) =>
      expect(alone[i]!.startsWith(answer), alone[i]).toBe(true)
    )
    // Batched they were: how many shared a step depends on when each arrived (the media take
    // longer to read), which a loaded machine changes; the answers may not.
    expect((await stats()).largestBatch).toBeGreaterThan(1)
    // The same prompts again: prefilled from the blocks the first round left in the prefix cache.
    const cached = (await stats()).prefixCache!
    expect(cached.hits).toBeGreaterThan(cachedBefore.hits)
    expect(cached.bytes).toBeGreaterThan(0)
    expect(cached.bytes).toBeLessThanOrEqual(cached.maxBytes)
    // The decoder ran on the shared cache (its attention rewritten to read the executor's buffers),
    // which holds nothing once no request runs.
    const after = await stats()
    expect(after.kvCache).toMatchObject({ mode: "shared", bytes: 0 })
    // Where the workers' time went: the round's steps, and of their time, the decoder's runs.
    const [stepsBefore, stepsAfter] = [before.steps!, after.steps!]
    expect(stepsAfter.count).toBeGreaterThan(stepsBefore.count)
    expect(stepsAfter.decoderRuns).toBeGreaterThan(stepsBefore.decoderRuns)
    const decoderSeconds = stepsAfter.decoderSeconds - stepsBefore.decoderSeconds
    expect(decoderSeconds).toBeGreaterThan(0)
    expect(decoderSeconds).toBeLessThanOrEqual(stepsAfter.seconds - stepsBefore.seconds)
  })
})

describe("the LLM executor going on with another executor's completion", () => {
  /** The chunks of a streamed completion, with their token ids. */
  const streamed = async (body: unknown) => {
    const response = await post("/v1/chat/completions", body)
    expect(response.status).toBe(200)
    return (await response.text())
      .split("\n\n")
      .filter((event) => event.startsWith("data: {"))
      .map(
        (event) =>
          JSON.parse(event.slice("data: ".length)) as {
            choices: Array<{ delta: { role?: string; content?: string } }>
            usage?: { prompt_tokens: number; completion_tokens: number } | null
            cornserve_token_ids?: Array<number>
          }
      )
  }
  const request = {
    model,
    messages: [{ role: "user", content: "Tell me about a zebra in Zürich 🦓" }],
    temperature: 0,
    max_tokens: 24,
    ignore_eos: true,
    stream: true,
    stream_options: { include_usage: true },
    cornserve_token_ids: true
  }

  it("says the tokens of each chunk, and from any of them goes on with exactly the rest", async () => {
    const whole = await streamed(request)
    const tokens = whole.flatMap((chunk) => chunk.cornserve_token_ids ?? [])
    expect(tokens).toHaveLength(24)
    const text = whole.map((chunk) => chunk.choices[0]?.delta.content ?? "").join("")
    // Cut after the 5th chunk that says something, as a failover would.
    const saying = whole.filter((chunk) => (chunk.cornserve_token_ids ?? []).length > 0)
    const given = saying.slice(0, 5)
    const givenTokens = given.flatMap((chunk) => chunk.cornserve_token_ids!)
    const givenText = given.map((chunk) => chunk.choices[0]!.delta.content ?? "").join("")
    const rest = await streamed({ ...request, cornserve_continuation: { token_ids: givenTokens } })
    // No role chunk again: the client has it.
    expect(rest.some((chunk) => chunk.choices[0]?.delta.role !== undefined)).toBe(false)
    expect(givenText + rest.map((chunk) => chunk.choices[0]?.delta.content ?? "").join("")).toBe(text)
    expect([...givenTokens, ...rest.flatMap((chunk) => chunk.cornserve_token_ids ?? [])]).toEqual(tokens)
    // Usage counts the continued tokens as generated, as the uninterrupted run does.
    expect(rest.at(-1)!.usage).toEqual(whole.at(-1)!.usage)
  })

  it("400 for a continuation with a token outside the vocabulary, or as long as the whole budget", async () => {
    for (const token_ids of [[1, 10_000_000], Array.from({ length: 24 }, () => 1)]) {
      const response = await post("/v1/chat/completions", { ...request, cornserve_continuation: { token_ids } })
      expect(response.status).toBe(400)
    }
  })
})

describe("the LLM executor's processes", () => {
  it("map no batch buffer: the steps carry what they need in their messages", () => {
    // The router, which runs the engine, and its worker.
    const workers = descendants(executor.process.pid!).filter((entry) => entry.command.includes("executor-worker"))
    expect(workers).toHaveLength(1)
    for (const { pid, command } of [{ pid: executor.process.pid!, command: "router" }, ...workers]) {
      expect(readFileSync(`/proc/${pid}/maps`, "utf8"), command).not.toContain(batchBufferPrefix)
    }
  })
})

describe("the LLM executor's answers to bad input", () => {
  it("404 for an unknown model", async () => {
    await expect(
      client.chat.completions.create({ model: "gpt-17", messages: [{ role: "user", content: "hi" }] })
    ).rejects.toMatchObject({ status: 404 })
  })

  it("400 for malformed messages", async () => {
    for (const messages of [
      [],
      "hello",
      [{ role: "user" }],
      [{ role: "robot", content: "hi" }],
      [{ role: "user", content: [{ type: "hologram" }] }]
    ]) {
      const response = await post("/v1/chat/completions", { model, messages })
      expect(response.status, JSON.stringify(messages)).toBe(400)
      expect(((await response.json()) as { error: { code: string } }).error.code).toBe("BadRequest")
    }
    expect(
      (await fetch(`${executor.url}/v1/chat/completions`, { method: "POST", headers: authorized, body: "{ not json" }))
        .status
    ).toBe(400)
  })

  it("400 for a modality the model cannot take", async () => {
    const response = await post("/v1/chat/completions", {
      model,
      messages: [
        {
          role: "user",
          content: [
            { type: "video_url", video_url: { url: "data:video/mp4;base64,AAAA" } },
            { type: "text", text: "What happens?" }
          ]
        }
      ]
    })
    expect(response.status).toBe(400)
    expect(((await response.json()) as { error: { message: string } }).error.message).toMatch(/cannot take video/)
  })

  it("400 for more media parts than its limit, or more image rows than the context holds, before decoding any", async () => {
    const corruptImages = (count: number) => ({
      model,
      messages: [
        {
          role: "user",
          content: [
            ...Array.from({ length: count }, () => ({
              type: "image_url",
              image_url: { url: `data:image/png;base64,${Buffer.from("not a png").toString("base64")}` }
            })),
            { type: "text", text: "What colours?" }
          ]
        }
      ]
    })
    const many = await post("/v1/chat/completions", corruptImages(50))
    expect(many.status).toBe(400)
    expect(((await many.json()) as { error: { message: string } }).error.message).toBe(
      "the request has 50 media items; this executor takes at most 16 in one request"
    )
    const context = vlm.decoder!.maxPositions!
    const fitting = Math.floor((context - 1) / vlm.config.image_seq_length!)
    const tooLong = await post("/v1/chat/completions", corruptImages(fitting + 1))
    expect(tooLong.status).toBe(400)
    expect(((await tooLong.json()) as { error: { code: string; message: string } }).error).toEqual({
      code: "ContextLengthExceeded",
      message: `this model's maximum context length is ${context} tokens; the ${fitting + 1} media parts alone take ${(fitting + 1) * vlm.config.image_seq_length!}`
    })
  })

  it("400 for a WAV file at 0 Hz", async () => {
    const zeroHertz = wavFile([new Int16Array(1600)], 0).toString("base64")
    const response = await post("/v1/chat/completions", {
      model,
      messages: [{ role: "user", content: [{ type: "input_audio", input_audio: { data: zeroHertz, format: "wav" } }] }]
    })
    expect(response.status).toBe(400)
    expect(((await response.json()) as { error: { message: string } }).error.message).toContain(
      "sample rate of 0 Hz is outside 8000–192000 Hz"
    )
  })

  it("400 for a prompt over the context length, or a completion that would run past it", async () => {
    const context = vlm.decoder!.maxPositions!
    await expect(
      client.chat.completions.create({ model, messages: [{ role: "user", content: "word ".repeat(context) }] })
    ).rejects.toMatchObject({ status: 400 })
    await expect(
      client.chat.completions.create({ model, messages: [{ role: "user", content: "hi" }], max_tokens: context })
    ).rejects.toMatchObject({ status: 400 })
  })

  it("frees the KV cache of a client that disconnects, streaming or not", async () => {
    const before = await stats()
    const streaming = longRequest(true)
    expect((await streaming.response).first).toMatch(/^data: /)
    const running = await statsWhen((current) => current.running === 1)
    expect(running.kvCache.usedTokens).toBeGreaterThan(1000)
    streaming.hangUp()
    const afterStream = await statsWhen((current) => current.running === 0)
    expect(afterStream).toMatchObject({
      cancelled: before.cancelled + 1,
      finished: before.finished,
      kvCache: { usedTokens: 0 }
    })

    const whole = longRequest(false)
    await statsWhen((current) => current.running === 1)
    whole.hangUp()
    const afterWhole = await statsWhen((current) => current.running === 0)
    expect(afterWhole).toMatchObject({
      cancelled: before.cancelled + 2,
      finished: before.finished,
      kvCache: { usedTokens: 0 }
    })
  })

  it("503 with Retry-After when the queue is full", async () => {
    const clients = Array.from({ length: 8 }, () => longRequest(true))
    expect((await Promise.all(clients.map((client) => client.response))).map((response) => response.status)).toEqual(
      new Array(8).fill(200)
    )
    const refused = await post("/v1/chat/completions", { model, messages: [{ role: "user", content: "me too" }] })
    expect(refused.status).toBe(503)
    expect(refused.headers.get("retry-after")).toBe("1")
    expect(((await refused.json()) as { error: { message: string } }).error.message).toMatch(/queue is full/)
    for (const request of clients) request.hangUp()
    expect(await statsWhen((current) => current.running === 0 && current.waiting === 0)).toMatchObject({
      kvCache: { usedTokens: 0 }
    })
    const completion = await client.chat.completions.create({
      model,
      messages: [{ role: "user", content: "and now?" }]
    })
    expect(completion.choices[0]!.message.content).toBe("nothing")
  })
})

describe("prompt embeddings for a generator", () => {
  it("answers embed_tokens of the rendered prompt", async () => {
    const messages = [{ role: "user" as const, content: "paint the sky red" }]
    const response = await post("/v1/cornserve/prompt-embeddings", { model, messages, id: "sky", return: "inline" })
    expect(response.status).toBe(200)
    const answer = (await response.json()) as { shape: [number, number]; embedding: Array<number>; source: string }
    const tokenizer = new ChatTokenizer(vlm)
    const ids = tokenizer.encode(tokenizer.applyChatTemplate(messages, { addGenerationPrompt: false }))
    const session = await ort.InferenceSession.create(onnxPath(vlm, "embed_tokens"))
    const direct = (
      await session.run({ input_ids: new ort.Tensor("int64", BigInt64Array.from(ids, BigInt), [1, ids.length]) })
    ).inputs_embeds!
    expect(answer.source).toBe("embed_tokens")
    expect(answer.shape).toEqual([ids.length, vlm.decoder!.hiddenSize])
    expect(answer.embedding).toEqual(Array.from(direct.data as Float32Array))
    await session.release()
  })

  it("400 without a sidecar to send to", async () => {
    const messages = [{ role: "user", content: "paint it blue" }]
    expect((await post("/v1/cornserve/prompt-embeddings", { model, messages, id: "x" })).status).toBe(400)
  })

  /** The final hidden states of `ids` in-process: embed_tokens, then the export's decoder with its lm_head's input as an output. */
  const inProcessHiddenStates = async (ids: ReadonlyArray<number>): Promise<Float32Array> => {
    const length = ids.length
    const embedder = await ort.InferenceSession.create(onnxPath(vlm, "embed_tokens"))
    const embeds = (
      await embedder.run({ input_ids: new ort.Tensor("int64", BigInt64Array.from(ids, BigInt), [1, length]) })
    ).inputs_embeds!
    const rewritten = exposeHiddenStates(readFileSync(onnxPath(vlm, "decoder_model_merged")))
    if (rewritten.bytes === undefined) throw new Error(rewritten.reason)
    const decoder = await ort.InferenceSession.create(rewritten.bytes, { intraOpNumThreads: 1 })
    const spec = vlm.decoder!
    const feeds: Record<string, ort.Tensor> = {
      inputs_embeds: embeds,
      attention_mask: new ort.Tensor("int64", new BigInt64Array(length).fill(1n), [1, length])
    }
    if (decoder.inputNames.includes("position_ids"))
      feeds.position_ids = new ort.Tensor(
        "int64",
        BigInt64Array.from({ length }, (_, i) => BigInt(i)),
        [1, length]
      )
    for (const name of decoder.inputNames.filter((input) => input.startsWith("past")))
      feeds[name] = new ort.Tensor("float32", new Float32Array(0), [1, spec.keyValueHeads, 0, spec.headDim])
    const states = (await decoder.run(feeds, [hiddenStatesOutput]))[hiddenStatesOutput]!
    await Promise.all([embedder.release(), decoder.release()])
    return states.data as Float32Array
  }

  const expectWithin = (actual: ReadonlyArray<number>, expected: Float32Array, bound: number) => {
    expect(actual.length).toBe(expected.length)
    let worst = 0
    let scale = 0
    expected.forEach((value, i) => {
      worst = Math.max(worst, Math.abs(actual[i]! - value))
      scale = Math.max(scale, Math.abs(value))
    })
    expect(worst / scale).toBeLessThanOrEqual(bound)
  }

  /** The prompt's hidden states, inline, with what else `extra` asks. */
  const hiddenStates = async (messages: ReadonlyArray<{ role: "user"; content: string }>, extra: object = {}) => {
    const response = await post("/v1/cornserve/prompt-embeddings", {
      model,
      messages,
      id: "x",
      source: "hidden_states",
      return: "inline",
      ...extra
    })
    expect(response.status).toBe(200)
    return (await response.json()) as HiddenStatesAnswer
  }

  interface HiddenStatesAnswer {
    readonly shape: [number, number]
    readonly embedding: Array<number>
    readonly source: string
    readonly completion?: { readonly text: string; readonly token_ids: Array<number>; readonly finish_reason: string }
  }

  it("answers the decoder's final hidden states, which its export does not give, as the decoder run in-process computes them", async () => {
    const messages = [{ role: "user" as const, content: "paint the sea green" }]
    const answer = await hiddenStates(messages)
    expect(answer.source).toBe("hidden_states")
    const tokenizer = new ChatTokenizer(vlm)
    const ids = tokenizer.encode(tokenizer.applyChatTemplate(messages, { addGenerationPrompt: false }))
    expect(answer.shape).toEqual([ids.length, vlm.decoder!.hiddenSize])
    expectWithin(answer.embedding, await inProcessHiddenStates(ids), 1e-5)
  })

  it("with generate, answers the messages first, then the hidden states of the prompt and the tokens it generated", async () => {
    const messages = [{ role: "user" as const, content: "what colour is the sky?" }]
    const answer = await hiddenStates(messages, { generate: { max_tokens: 6 } })
    // What a greedy chat completion of the same messages says.
    const chat = await client.chat.completions.create({ model, messages, max_tokens: 6, temperature: 0 })
    expect(answer.completion!.text).toBe(chat.choices[0]!.message.content)
    expect(answer.completion!.finish_reason).toBe(chat.choices[0]!.finish_reason)
    const tokenizer = new ChatTokenizer(vlm)
    const prompt = tokenizer.encode(tokenizer.applyChatTemplate(messages, { addGenerationPrompt: true }))
    const ids = [...prompt, ...answer.completion!.token_ids]
    expect(answer.completion!.token_ids.length).toBe(chat.usage!.completion_tokens)
    expect(answer.shape).toEqual([ids.length, vlm.decoder!.hiddenSize])
    expectWithin(answer.embedding, await inProcessHiddenStates(ids), 1e-5)
    // Only hidden states are given for what it generates.
    const refused = await post("/v1/cornserve/prompt-embeddings", {
      model,
      messages,
      id: "x",
      return: "inline",
      generate: { max_tokens: 6 }
    })
    expect(refused.status).toBe(400)
  })
})
