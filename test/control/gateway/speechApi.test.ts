import { spawnSync } from "node:child_process"
import { once } from "node:events"
import { readFileSync } from "node:fs"
import { createServer, type IncomingMessage, type ServerResponse } from "node:http"
import type { AddressInfo } from "node:net"
import { setTimeout as sleep } from "node:timers/promises"
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest"
import type { SpeechFormat } from "../../../src/app-runtime/schemas/Speech.js"
import { RequestTimeout } from "../../../src/control/errors.js"
import { errorCodes, type ReplyFormat } from "../../../src/control/gateway/ReplyFormat.js"
import { speechFormat, wavHeader } from "../../../src/control/gateway/SpeechApi.js"
import { videoTools } from "../../../src/executors/common/media/VideoContainer.js"
import { childPids, isAlive } from "../../support/platform.js"

/**
 * OpenAI's speech route's reply, written by a real ffmpeg to a real HTTP client: a test's server
 * plays the gateway, handing the reply format an app's stream of PCM16 chunks (a 440 Hz tone), and
 * `fetch` reads what a client of OpenAI's API would.
 */

const rate = 16_000
const tone = 440
const chunkSamples = 1_600
const chunkCount = 10

/** A 440 Hz sine at `sampleRate`, `count` samples from sample `from`. */
const sine = (count: number, from = 0, sampleRate = rate): Int16Array =>
  Int16Array.from({ length: count }, (_, index) =>
    Math.round(8_000 * Math.sin((2 * Math.PI * tone * (from + index)) / sampleRate))
  )

const bytesOf = (samples: Int16Array) => Buffer.from(samples.buffer, samples.byteOffset, samples.byteLength)
const samplesOf = (bytes: Buffer) => new Int16Array(Uint8Array.from(bytes).buffer)

/** The app's stream: one second of the tone in chunks of a tenth, as the app's JSON elements. */
const toneChunks = (sampleRate = rate) =>
  Array.from({ length: chunkCount }, (_, index) =>
    JSON.stringify({
      audio: bytesOf(sine(sampleRate / 10, (index * sampleRate) / 10, sampleRate)).toString("base64"),
      sampleRate
    })
  )
const sentSamples = sine(chunkSamples * chunkCount)

/** The tone's frequency in decoded audio: its zero crossings, away from the encoders' edges. */
const frequencyOf = (samples: Int16Array, sampleRate: number) => {
  const margin = Math.floor(sampleRate / 10)
  let crossings = 0
  for (let index = margin + 1; index < samples.length - margin; index++) {
    if (samples[index - 1]! < 0 !== samples[index]! < 0) crossings++
  }
  return crossings / 2 / ((samples.length - 2 * margin) / sampleRate)
}

/** An audio file decoded by ffmpeg to PCM16 mono at `sampleRate`. */
const decoded = (file: Buffer, sampleRate = rate): Int16Array => {
  const run = spawnSync(
    videoTools().ffmpeg,
    [
      "-hide_banner",
      "-loglevel",
      "error",
      "-i",
      "pipe:0",
      "-f",
      "s16le",
      "-ac",
      "1",
      "-ar",
      String(sampleRate),
      "pipe:1"
    ],
    { input: file, maxBuffer: 64 * 1024 * 1024 }
  )
  expect(run.stderr.toString()).toBe("")
  expect(run.status).toBe(0)
  return samplesOf(run.stdout)
}

type Handler = (response: ServerResponse) => Promise<void>
let handler: Handler = async () => undefined
const running = new Set<Promise<unknown>>()
const server = createServer((_: IncomingMessage, response: ServerResponse) => {
  const handled = handler(response).catch((error) => response.destroy(error))
  running.add(handled)
  void handled.finally(() => running.delete(handled))
})
let url = ""

beforeAll(async () => {
  // Longer than any pause between two of its tests: fetch reuses its idle connection, and on a busy
  // host a connection the server closes at its default 5 s may be the one a request was just sent on.
  server.keepAliveTimeout = 60_000
  server.listen(0, "127.0.0.1")
  await once(server, "listening")
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/`
})

afterAll(() => {
  server.close()
})

/** The ffmpeg processes this test process started that are still running. */
const runningEncoders = () =>
  childPids(process.pid).filter(
    (pid) => isAlive(pid) && readFileSync(`/proc/${pid}/comm`, "utf8").trim().startsWith("ffmpeg")
  )

afterEach(async () => {
  await Promise.all(running)
  for (let waited = 0; runningEncoders().length > 0 && waited < 3_000; waited += 50) await sleep(50)
  expect(runningEncoders()).toEqual([])
})

/** Serves the next request with `handle`; resolves, once its response is closed, with the error code it recorded. */
const serve = (handle: Handler): Promise<string | undefined> =>
  new Promise((resolve) => {
    handler = async (response) => {
      response.once("close", () => resolve(errorCodes.get(response)))
      await handle(response)
    }
  })

/** What the gateway does with an app's stream: starts it, hands each element (waiting for `drain` when told), ends it. */
const play = async (
  format: ReplyFormat,
  response: ServerResponse,
  chunks: ReadonlyArray<string>,
  before: (index: number) => Promise<void> = () => sleep(10)
) => {
  format.streamStart(response, "request-1")
  for (const [index, json] of chunks.entries()) {
    await before(index)
    if (!format.chunk(response, json)) await Promise.race([once(response, "drain"), once(response, "close")])
  }
  format.end(response)
}

const post = () => fetch(url, { method: "POST" })

/** A promise and what settles it: the test's signal to the app's side that the client holds bytes. */
const signal = () => {
  let resolve = () => {}
  const promise = new Promise<void>((settle) => {
    resolve = settle
  })
  return { promise, resolve }
}

/** A reply's whole body, and whether its first bytes came before the app's last chunk was handed over. */
const streamed = async (format: SpeechFormat) => {
  let lastChunkGiven = false
  const firstBytes = signal()
  const outcome = serve((response) =>
    play(speechFormat("speaker", format, "audio"), response, toneChunks(), async (index) => {
      await sleep(10)
      if (index < chunkCount - 1) return
      await Promise.race([firstBytes.promise, sleep(5_000)])
      lastChunkGiven = true
    })
  )
  const reply = await post()
  const reader = reply.body!.getReader()
  const pieces: Array<Uint8Array> = []
  let bytesBeforeEnd = false
  for (let read = await reader.read(); !read.done; read = await reader.read()) {
    if (pieces.length === 0) bytesBeforeEnd = !lastChunkGiven
    pieces.push(read.value)
    firstBytes.resolve()
  }
  expect(await outcome).toBeUndefined()
  return { reply, body: Buffer.concat(pieces), bytesBeforeEnd }
}

describe("wavHeader", () => {
  it("writes a PCM16 mono RIFF header, its sizes unknown while streaming or exact when given", () => {
    const header = wavHeader(22_050)
    expect(header.length).toBe(44)
    expect(header.toString("ascii", 0, 4)).toBe("RIFF")
    expect(header.toString("ascii", 8, 16)).toBe("WAVEfmt ")
    expect(header.readUInt32LE(4)).toBe(0xffff_ffff)
    expect(header.readUInt32LE(40)).toBe(0xffff_ffff)
    expect(header.readUInt32LE(28)).toBe(44_100)
    expect(wavHeader(22_050, 1_000).readUInt32LE(4)).toBe(1_036)
    expect(wavHeader(22_050, 1_000).readUInt32LE(40)).toBe(1_000)
  })
})

describe("speech as an audio file", () => {
  it("streams wav: the header at the model's rate, then the samples sent, before the app's stream ends", async () => {
    const { reply, body, bytesBeforeEnd } = await streamed("wav")
    expect(reply.status).toBe(200)
    expect(reply.headers.get("content-type")).toBe("audio/wav")
    expect(reply.headers.get("cache-control")).toBe("no-cache")
    expect(reply.headers.get("x-request-id")).toBe("request-1")
    expect(reply.headers.get("content-length")).toBeNull()
    expect(bytesBeforeEnd).toBe(true)
    expect(body.toString("ascii", 0, 4)).toBe("RIFF")
    expect(body.toString("ascii", 36, 40)).toBe("data")
    expect(body.readUInt16LE(20)).toBe(1)
    expect(body.readUInt16LE(22)).toBe(1)
    expect(body.readUInt32LE(24)).toBe(rate)
    expect(body.readUInt16LE(34)).toBe(16)
    expect(samplesOf(body.subarray(44))).toEqual(sentSamples)
    // ffmpeg, as a player would, reads the file of unknown length to its end.
    expect(decoded(body)).toEqual(sentSamples)
  })

  it("streams mp3 as ffmpeg encodes it, before the app's stream ends", async () => {
    const { reply, body, bytesBeforeEnd } = await streamed("mp3")
    expect(reply.status).toBe(200)
    expect(reply.headers.get("content-type")).toBe("audio/mpeg")
    expect(reply.headers.get("x-request-id")).toBe("request-1")
    expect(bytesBeforeEnd).toBe(true)
    const samples = decoded(body)
    expect(Math.abs(samples.length / rate - 1)).toBeLessThan(0.15)
    expect(frequencyOf(samples, rate)).toBeCloseTo(tone, -1)
  })

  it.each([
    ["opus", "audio/ogg", "OggS"],
    ["aac", "audio/aac", undefined],
    ["flac", "audio/flac", "fLaC"]
  ] as const)("encodes %s (%s) that decodes to the tone", async (format, contentType, magic) => {
    const { reply, body } = await streamed(format)
    expect(reply.headers.get("content-type")).toBe(contentType)
    if (magic !== undefined) expect(body.toString("latin1", 0, 4)).toBe(magic)
    // ADTS frames begin with 12 bits set.
    else expect([body[0], body[1]! & 0xf0]).toEqual([0xff, 0xf0])
    const samples = decoded(body)
    expect(Math.abs(samples.length / rate - 1)).toBeLessThan(0.15)
    expect(frequencyOf(samples, rate)).toBeCloseTo(tone, -1)
    if (format === "opus") expect(body.includes("OpusHead")).toBe(true)
    if (format === "flac") expect(samples).toEqual(sentSamples)
  })

  it("writes pcm at 24 kHz, resampled from the model's 16 kHz", async () => {
    const { reply, body } = await streamed("pcm")
    expect(reply.headers.get("content-type")).toBe("audio/pcm")
    const samples = samplesOf(body)
    expect(Math.abs(samples.length - 1.5 * sentSamples.length)).toBeLessThanOrEqual(4)
    expect(frequencyOf(samples, 24_000)).toBeCloseTo(tone, -1)
  })

  it("writes pcm from a 24 kHz model as it is", async () => {
    const outcome = serve((response) => play(speechFormat("speaker", "pcm", "audio"), response, toneChunks(24_000)))
    const body = Buffer.from(await (await post()).arrayBuffer())
    expect(await outcome).toBeUndefined()
    expect(samplesOf(body)).toEqual(sine(24_000, 0, 24_000))
  })

  it("answers an app stream of no audio with an empty file", async () => {
    const wav = serve((response) => play(speechFormat("speaker", "wav", "audio"), response, []))
    const empty = Buffer.from(await (await post()).arrayBuffer())
    await wav
    expect(empty.length).toBe(44)
    expect(empty.readUInt32LE(40)).toBe(0)
    expect(decoded(empty).length).toBe(0)

    const silent = JSON.stringify({ audio: "", sampleRate: rate })
    const flac = serve((response) => play(speechFormat("speaker", "flac", "audio"), response, [silent]))
    const reply = await post()
    const file = Buffer.from(await reply.arrayBuffer())
    expect(await flac).toBeUndefined()
    expect(reply.status).toBe(200)
    expect(decoded(file).length).toBe(0)
  })

  it("holds the app back while ffmpeg has not taken its chunks, then lets it go on", async () => {
    const long = sine(rate * 20)
    const chunks = Array.from({ length: 20 }, (_, second) =>
      JSON.stringify({
        audio: bytesOf(long.subarray(second * rate, (second + 1) * rate)).toString("base64"),
        sampleRate: rate
      })
    )
    let heldBack = 0
    const outcome = serve(async (response) => {
      const format = speechFormat("speaker", "flac", "audio")
      format.streamStart(response, "request-1")
      for (const json of chunks) {
        if (format.chunk(response, json)) continue
        heldBack++
        await once(response, "drain")
      }
      format.end(response)
    })
    const body = Buffer.from(await (await post()).arrayBuffer())
    expect(await outcome).toBeUndefined()
    expect(heldBack).toBeGreaterThan(0)
    expect(decoded(body)).toEqual(long)
  })

  it("stops ffmpeg when the client goes away midway", async () => {
    const closed = serve(async (response) => {
      const format = speechFormat("speaker", "mp3", "audio")
      format.streamStart(response, "request-1")
      for (const json of toneChunks().slice(0, 5)) format.chunk(response, json)
      // The app's stream goes on no further until the client has gone; ffmpeg waits for more input.
      await once(response, "close")
    })
    const abort = new AbortController()
    const reply = await fetch(url, { method: "POST", signal: abort.signal })
    const reader = reply.body!.getReader()
    expect((await reader.read()).done).toBe(false)
    expect(runningEncoders().length).toBe(1)
    abort.abort()
    await closed
  })
})

describe("speech as server-sent events", () => {
  /** The reply's events, parsed. */
  const events = async (
    format: SpeechFormat,
    handle: (reply: ReplyFormat, response: ServerResponse) => Promise<void>
  ) => {
    const outcome = serve((response) => handle(speechFormat("speaker", format, "sse"), response))
    const reply = await post()
    expect(reply.headers.get("content-type")).toBe("text/event-stream")
    const text = await reply.text()
    expect(text.endsWith("\n\n")).toBe(true)
    const parsed = text
      .slice(0, -2)
      .split("\n\n")
      .map((event) => {
        expect(event.startsWith("data: ")).toBe(true)
        return JSON.parse(event.slice("data: ".length)) as { type: string; audio?: string; error?: { code: string } }
      })
    return { parsed, code: await outcome }
  }
  const audioOf = (parsed: ReadonlyArray<{ type: string; audio?: string }>) =>
    Buffer.concat(
      parsed.filter((event) => event.type === "speech.audio.delta").map((event) => Buffer.from(event.audio!, "base64"))
    )

  it.each(["wav", "mp3"] as const)("sends %s as deltas of the file, then done", async (format) => {
    const { parsed } = await events(format, (reply, response) => play(reply, response, toneChunks()))
    expect(parsed.length).toBeGreaterThan(2)
    expect(parsed.slice(0, -1).every((event) => event.type === "speech.audio.delta")).toBe(true)
    expect(parsed.at(-1)).toEqual({
      type: "speech.audio.done",
      usage: { input_tokens: 0, output_tokens: 0, total_tokens: 0 }
    })
    const samples = decoded(audioOf(parsed))
    if (format === "wav") expect(samples).toEqual(sentSamples)
    expect(frequencyOf(samples, rate)).toBeCloseTo(tone, -1)
  })

  it("ends with an error event when the stream fails midway", async () => {
    const { parsed, code } = await events("wav", async (reply, response) => {
      reply.streamStart(response, "request-1")
      for (const json of toneChunks().slice(0, 3)) reply.chunk(response, json)
      await sleep(50)
      reply.streamError(response, new RequestTimeout({ timeoutMs: 1_000, streaming: true }))
      reply.end(response)
    })
    expect(parsed.filter((event) => event.type === "speech.audio.delta").length).toBe(3)
    expect(parsed.at(-1)).toMatchObject({ type: "error", error: { code: "RequestTimeout" } })
    expect(code).toBe("RequestTimeout")
  })
})

describe("failures", () => {
  const jsonError = async (reply: Response) => ({
    status: reply.status,
    contentType: reply.headers.get("content-type"),
    body: (await reply.json()) as { error: { code: string; message: string } }
  })

  it("answers a single value from the app as its failure", async () => {
    const outcome = serve(async (response) => speechFormat("speaker", "mp3", "audio").value(response, '{"text":"hi"}'))
    const { status, body } = await jsonError(await post())
    expect(status).toBe(500)
    expect(body.error.code).toBe("AppFailed")
    expect(body.error.message).toContain("something other than a stream of audio chunks")
    expect(await outcome).toBe("AppFailed")
  })

  it.each([
    ["not a chunk", JSON.stringify({ text: "hi" }), "something other than audio chunks"],
    ["no sample rate", JSON.stringify({ audio: "AAAA" }), "something other than audio chunks"],
    ["a fractional sample rate", JSON.stringify({ audio: "AAAA", sampleRate: 16_000.5 }), "other than audio"],
    ["not base64", JSON.stringify({ audio: "not base64!", sampleRate: rate }), "not base64"],
    ["half a sample", JSON.stringify({ audio: "AA==", sampleRate: rate }), "whole 16-bit samples"]
  ])("answers a first chunk that is %s with a JSON error, ffmpeg stopped", async (_, bad, message) => {
    const outcome = serve(async (response) => {
      const format = speechFormat("speaker", "mp3", "audio")
      format.streamStart(response, "request-1")
      // A chunk of no samples: ffmpeg runs, and nothing has been written yet.
      format.chunk(response, JSON.stringify({ audio: "", sampleRate: rate }))
      format.chunk(response, bad)
      format.end(response)
    })
    const { status, contentType, body } = await jsonError(await post())
    expect(status).toBe(500)
    expect(contentType).toBe("application/json")
    expect(body.error).toMatchObject({ code: "AppFailed" })
    expect(body.error.message).toContain(message)
    expect(await outcome).toBe("AppFailed")
  })

  /** Plays the tone's first half, waits for the client to hold some of it, then `fail`s; the client's read of the body. */
  const cutMidway = async (format: SpeechFormat, fail: (reply: ReplyFormat, response: ServerResponse) => void) => {
    const firstBytes = signal()
    const outcome = serve(async (response) => {
      const reply = speechFormat("speaker", format, "audio")
      reply.streamStart(response, "request-1")
      for (const json of toneChunks().slice(0, 5)) reply.chunk(response, json)
      await Promise.race([firstBytes.promise, sleep(5_000)])
      fail(reply, response)
      for (const json of toneChunks().slice(5)) reply.chunk(response, json)
      reply.end(response)
    })
    const reply = await post()
    expect(reply.status).toBe(200)
    const reader = reply.body!.getReader()
    expect((await reader.read()).done).toBe(false)
    firstBytes.resolve()
    const rest = (async () => {
      while (!(await reader.read()).done) {}
    })()
    await expect(rest).rejects.toThrow()
    return outcome
  }

  it("cuts the transfer when the sample rate changes midway", async () => {
    const changed = JSON.stringify({ audio: bytesOf(sine(2_400, 0, 24_000)).toString("base64"), sampleRate: 24_000 })
    expect(await cutMidway("mp3", (reply, response) => reply.chunk(response, changed))).toBe("AppFailed")
  })

  it("cuts the transfer when a chunk is malformed midway", async () => {
    expect(await cutMidway("wav", (reply, response) => reply.chunk(response, "[1, 2]"))).toBe("AppFailed")
  })

  it("cuts the transfer when the stream fails midway", async () => {
    const timedOut = new RequestTimeout({ timeoutMs: 1_000, streaming: true })
    expect(await cutMidway("opus", (reply, response) => reply.streamError(response, timedOut))).toBe("RequestTimeout")
  })

  it("answers a stream that fails before any audio with its error", async () => {
    const outcome = serve(async (response) => {
      const format = speechFormat("speaker", "flac", "audio")
      format.streamStart(response, "request-1")
      format.chunk(response, JSON.stringify({ audio: "", sampleRate: rate }))
      await sleep(50)
      format.streamError(response, new RequestTimeout({ timeoutMs: 1_000, streaming: true }))
    })
    const { status, body } = await jsonError(await post())
    expect(status).toBe(504)
    expect(body.error.code).toBe("RequestTimeout")
    expect(await outcome).toBe("RequestTimeout")
  })

  it.each([
    ["cannot be run", "/nonexistent/ffmpeg", "cannot run ffmpeg (ENOENT)"],
    ["fails", "false", "ffmpeg exited with code 1"]
  ])("answers 501 when ffmpeg %s, before any audio", async (_, binary, message) => {
    const previous = process.env.CORNSERVE_FFMPEG
    process.env.CORNSERVE_FFMPEG = binary
    vi.resetModules()
    try {
      // A fresh copy of the modules finds the ffmpeg the environment names now.
      const fresh = await import("../../../src/control/gateway/SpeechApi.js")
      const outcome = serve((response) => play(fresh.speechFormat("speaker", "aac", "audio"), response, toneChunks()))
      const { status, body } = await jsonError(await post())
      expect(status).toBe(501)
      expect(body.error.code).toBe("NotSupported")
      expect(body.error.message).toContain(message)
      await outcome
    } finally {
      if (previous === undefined) delete process.env.CORNSERVE_FFMPEG
      else process.env.CORNSERVE_FFMPEG = previous
      vi.resetModules()
    }
  })
})
