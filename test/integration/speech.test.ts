import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { type AutomaticSpeechRecognitionPipeline, pipeline } from "@huggingface/transformers"
import OpenAI, { toFile } from "openai"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { decodeAudio } from "../../src/executors/common/media/MediaDecoder.js"
import { wavFile } from "../../src/executors/geri/router.js"
import { Random } from "../../src/models/Random.js"
import { tinyWhisper } from "../../src/models/recipes/RandomWhisper.js"
import { writeModelFiles } from "../models/support/SmolVlmFixture.js"
import { offline } from "../models/support/TransformersJs.js"
import { invoke, type RunningPlatform, repoRoot, runCli, startPlatform } from "../support/platform.js"
import { ffmpegFile } from "../support/videos.js"

/**
 * Speech recognition through the real binary: examples/transcribe.ts (a SpeechRecognitionTask on
 * the built-in cornserve/tiny-whisper) answers OpenAI's `/v1/audio/transcriptions` (and
 * `/v1/audio/translations`) to the official
 * client, uploads as WAV and mp3, in every response_format, with the text and segments of
 * transformers.js's ASR pipeline on the same model and the same decoded samples, long clips cut in
 * 30 s windows; concurrent requests, batched together, answer as alone; bad uploads are refused,
 * clearly; and examples/ask_audio.ts transcribes a clip and has an LLM answer about it.
 */

/** Tones that change every second over noise, 16 kHz 16-bit. */
const clip = (seconds: number, seed: number): Int16Array => {
  const random = new Random(seed)
  const pitches = Array.from({ length: Math.ceil(seconds) + 1 }, () => 120 + random.below(600))
  return Int16Array.from(random.normals(Math.round(seconds * 16000), 0.05), (v, i) => {
    const t = i / 16000
    return Math.round(32767 * Math.max(-1, Math.min(1, v + 0.4 * Math.sin(2 * Math.PI * pitches[Math.floor(t)]! * t))))
  })
}

interface ReferenceTranscript {
  readonly text: string
  readonly chunks?: ReadonlyArray<{
    readonly timestamp: readonly [number | null, number | null]
    readonly text: string
  }>
}

describe("speech recognition end to end", () => {
  let root: string
  let platform: RunningPlatform
  let asr: AutomaticSpeechRecognitionPipeline
  let client: OpenAI
  const clips = new Map<string, Buffer>()

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-speech-"))
    // The built-in model's files, for transformers.js to read.
    const modelDir = join(root, "tiny-whisper")
    await writeModelFiles(modelDir, tinyWhisper.build())
    asr = (await pipeline("automatic-speech-recognition", offline(modelDir), {
      dtype: "fp32"
    })) as AutomaticSpeechRecognitionPipeline
    // transformers.js fails on decoding a segment with no text; the platform reads it as "".
    const decode = asr.tokenizer.decode.bind(asr.tokenizer)
    asr.tokenizer.decode = ((ids: Array<number>, args?: object) => (ids.length === 0 ? "" : decode(ids, args))) as never
    clips.set("short.wav", wavFile([clip(4.5, 1)], 16000))
    clips.set("other.wav", wavFile([clip(7.2, 2)], 16000))
    clips.set("long.wav", wavFile([clip(47, 3)], 16000))
    clips.set(
      "short.mp3",
      await ffmpegFile(
        ["-f", "wav", "-i", "pipe:0", "-c:a", "libmp3lame", "-b:a", "128k"],
        "mp3",
        clips.get("short.wav")!
      )
    )
    platform = await startPlatform({ args: ["--devices", "cpu:0,cpu:1"] })
    for (const app of ["transcribe", "ask_audio"]) {
      const registered = await runCli(["app", "register", join(repoRoot, "examples", `${app}.ts`)], {
        CORNSERVE_GATEWAY_URL: platform.url
      })
      expect(registered.code, registered.stderr).toBe(0)
    }
    client = new OpenAI({ baseURL: `${platform.url}/app/transcribe/v1`, apiKey: "unused", maxRetries: 0 })
  }, 240_000)

  afterAll(async () => {
    await platform?.stop()
    await asr?.dispose()
    await rm(root, { recursive: true, force: true })
  })

  /** transformers.js's transcript of a clip's samples, decoded as the platform decodes them. */
  const reference = async (name: string, options: object = {}): Promise<ReferenceTranscript> => {
    const samples = await decodeAudio(clips.get(name)!, undefined, 16000)
    return (await asr(samples, { language: "en", ...options } as never)) as ReferenceTranscript
  }

  const upload = (name: string) =>
    toFile(clips.get(name)!, name, { type: name.endsWith(".mp3") ? "audio/mpeg" : "audio/wav" })

  it("transcribes uploads as WAV and mp3 as transformers.js's pipeline does", async () => {
    const texts = new Set<string>()
    for (const name of ["short.wav", "other.wav", "short.mp3"]) {
      const expected = await reference(name)
      const answer = await client.audio.transcriptions.create({
        file: await upload(name),
        model: "cornserve/tiny-whisper"
      })
      expect(answer.text, name).toBe(expected.text)
      expect(answer.text.length, name).toBeGreaterThan(0)
      texts.add(answer.text)
    }
    expect(texts.size).toBeGreaterThan(1)
  })

  it("gives segments with timestamps (verbose_json), text, srt and vtt", async () => {
    const expected = await reference("other.wav", { return_timestamps: true })
    expect(expected.chunks!.length).toBeGreaterThan(1)
    const verbose = await client.audio.transcriptions.create({
      file: await upload("other.wav"),
      model: "cornserve/tiny-whisper",
      response_format: "verbose_json",
      timestamp_granularities: ["segment"]
    })
    expect(verbose.text).toBe(expected.text)
    expect(verbose.duration).toBeCloseTo(7.2, 5)
    expect(verbose.language).toBe("en")
    expect(verbose.segments!.map((segment) => [segment.start, segment.end, segment.text])).toEqual(
      expected.chunks!.map((chunk) => [chunk.timestamp[0] ?? 0, chunk.timestamp[1], chunk.text])
    )
    const text = await client.audio.transcriptions.create({
      file: await upload("short.wav"),
      model: "cornserve/tiny-whisper",
      response_format: "text"
    })
    expect(text).toBe((await reference("short.wav")).text)
    const srt = (await client.audio.transcriptions.create({
      file: await upload("other.wav"),
      model: "cornserve/tiny-whisper",
      response_format: "srt"
    })) as unknown as string
    expect(srt).toMatch(/^1\n\d\d:\d\d:\d\d,\d\d\d --> \d\d:\d\d:\d\d,\d\d\d\n/)
    expect(srt.split("\n\n").filter((cue) => cue.trim() !== "")).toHaveLength(expected.chunks!.length)
    const vtt = (await client.audio.transcriptions.create({
      file: await upload("other.wav"),
      model: "cornserve/tiny-whisper",
      response_format: "vtt"
    })) as unknown as string
    expect(vtt.startsWith("WEBVTT\n\n00:00:")).toBe(true)
  })

  it("translates on OpenAI's translations route: the transcription with the translate task", async () => {
    const expected = await reference("other.wav", { task: "translate" })
    const translation = await client.audio.translations.create({
      file: await upload("other.wav"),
      model: "cornserve/tiny-whisper"
    })
    expect(translation.text).toBe(expected.text)
    expect(translation.text).not.toBe((await reference("other.wav")).text)
    const verbose = await client.audio.translations.create({
      file: await upload("other.wav"),
      model: "cornserve/tiny-whisper",
      response_format: "verbose_json"
    })
    expect((verbose as unknown as { task: string }).task).toBe("translate")
  })

  it("cuts a 47 s clip in 30 s windows and stitches them as the pipeline does", async () => {
    const expected = await reference("long.wav", { chunk_length_s: 30 })
    const answer = await client.audio.transcriptions.create({
      file: await upload("long.wav"),
      model: "cornserve/tiny-whisper"
    })
    expect(answer.text).toBe(expected.text)
    // Without windows only the first 30 s would be read.
    expect(answer.text).not.toBe((await reference("long.wav")).text)
  })

  it("answers concurrent requests, batched together, as each alone", async () => {
    const names = ["short.wav", "other.wav", "short.mp3", "other.wav", "short.wav", "long.wav"]
    const alone = new Map<string, string>()
    for (const name of new Set(names)) {
      alone.set(
        name,
        (await client.audio.transcriptions.create({ file: await upload(name), model: "cornserve/tiny-whisper" })).text
      )
    }
    const together = await Promise.all(
      names.map(
        async (name) =>
          (await client.audio.transcriptions.create({ file: await upload(name), model: "cornserve/tiny-whisper" })).text
      )
    )
    expect(together).toEqual(names.map((name) => alone.get(name)))
  })

  it("takes the JSON request with the audio as a data: URL on the app's own route", async () => {
    const response = await invoke(
      platform.url,
      "transcribe",
      JSON.stringify({ file: `data:audio/wav;base64,${clips.get("short.wav")!.toString("base64")}` })
    )
    expect(response.status).toBe(200)
    const answer = (await response.json()) as { text: string; duration: number }
    expect(answer.text).toBe((await reference("short.wav")).text)
    expect(answer.duration).toBeCloseTo(4.5, 5)
  })

  it("refuses bad uploads clearly, and goes on serving", async () => {
    const post = (body: FormData | string, headers: Record<string, string> = {}) =>
      fetch(`${platform.url}/app/transcribe/v1/audio/transcriptions`, { method: "POST", body, headers })
    const form = (fields: Record<string, string | Blob>) => {
      const data = new FormData()
      for (const [name, value] of Object.entries(fields)) {
        if (typeof value === "string") data.append(name, value)
        else data.append(name, value, "clip.wav")
      }
      return data
    }
    const wav = new Blob([clips.get("short.wav")!], { type: "audio/wav" })
    const corrupt = await post(form({ file: new Blob([Buffer.from("RIFF....WAVEnot really a wav file")]) }))
    expect(corrupt.status).toBe(400)
    expect(await corrupt.text()).toMatch(/wav|audio/i)
    const noFile = await post(form({ model: "cornserve/tiny-whisper" }))
    expect(noFile.status).toBe(400)
    expect(await noFile.text()).toMatch(/no `file`/)
    const prompt = await post(form({ file: wav, prompt: "earlier text" }))
    expect(prompt.status).toBe(400)
    expect(((await prompt.json()) as { error: { code: string } }).error.code).toBe("unsupported_parameter")
    const warm = await post(form({ file: wav, temperature: "0.7" }))
    expect(warm.status).toBe(400)
    expect(await warm.text()).toMatch(/greedy/)
    const words = await post(form({ file: wav, "timestamp_granularities[]": "word" }))
    expect(words.status).toBe(400)
    const language = await post(form({ file: wav, language: "klingon" }))
    expect(language.status).toBe(400)
    expect(await language.text()).toMatch(/klingon/)
    const unknownModel = await post(form({ file: wav, model: "whisper-1" }))
    expect(unknownModel.status).toBe(404)
    const broken = await post("--x\r\nnot a form", { "content-type": "multipart/form-data; boundary=x" })
    expect(broken.status).toBe(400)
    expect(await broken.text()).toMatch(/not a valid form/)
    // A form a page of another site posts is refused before its body is read.
    const crossSite = await post(form({ file: wav }), { origin: "https://elsewhere.example" })
    expect(crossSite.status).toBe(403)
    const plain = await post("file=abc", { "content-type": "application/x-www-form-urlencoded" })
    expect(plain.status).toBe(415)
    const still = await client.audio.transcriptions.create({
      file: await upload("short.wav"),
      model: "cornserve/tiny-whisper"
    })
    expect(still.text).toBe((await reference("short.wav")).text)
  })

  it("ask_audio transcribes a clip and answers a question about it", async () => {
    const response = await invoke(
      platform.url,
      "ask_audio",
      JSON.stringify({
        audio: `data:audio/wav;base64,${clips.get("other.wav")!.toString("base64")}`,
        question: "What is said?"
      })
    )
    expect(response.status).toBe(200)
    const answer = (await response.json()) as { transcript: string; answer: string }
    expect(answer.transcript).toBe((await reference("other.wav")).text.trim())
    expect(answer.answer.length).toBeGreaterThan(0)
  })

  it("describes the transcriptions and translations routes in the app's OpenAPI document", async () => {
    const document = (await (await fetch(`${platform.url}/app/transcribe/openapi.json`)).json()) as {
      paths: Record<string, { post?: { requestBody?: { content?: Record<string, unknown> } } }>
    }
    for (const path of ["transcriptions", "translations"]) {
      const route = document.paths[`/app/transcribe/v1/audio/${path}`]
      expect(Object.keys(route?.post?.requestBody?.content ?? {})).toEqual(["multipart/form-data", "application/json"])
    }
  })
})
