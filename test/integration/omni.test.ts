import { mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { MimiDecoderModel, Tensor } from "@huggingface/transformers"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { tinyMimi } from "../../src/models/recipes/RandomMimi.js"
import { tinyColorVlm } from "../../src/models/recipes/TinyColorVlm.js"
import { talkerFiles } from "../../src/models/recipes/TinyTalker.js"
import { writeModelFiles } from "../models/support/SmolVlmFixture.js"
import { offline } from "../models/support/TransformersJs.js"
import { type RunningPlatform, repoRoot, runCli, startPlatform } from "../support/platform.js"
import { talkerReference, thinkerReference } from "../support/talkerReference.js"

/**
 * examples/omni.ts, the speaking pipeline, through the real binary: the thinker (tiny-color-vlm)
 * answers and streams its hidden states through the sidecar (the prompt's, then each token's as
 * its step runs) with its text, the talker (tiny-talker, on an LLM executor) writes Mimi frames
 * from them as they come, adding the answer's rows a frame at a time, streamed to the app with the
 * text, and the codec (tiny-mimi on Geri) decodes them piece by piece. The answer, streamed or
 * whole as OpenAI gives audio, is the thinker's greedy text and the audio of the three run in
 * sequence in-process (the thinker's and the talker's graphs with ONNX Runtime, the codec with
 * transformers.js's MimiDecoderModel over the whole sequence), within 1 LSB.
 */

const pcmOf = (waveform: Float32Array) =>
  Int16Array.from(waveform, (sample) => Math.round(Math.max(-1, Math.min(1, sample)) * 32767))

const samplesOf = (bytes: Buffer) => new Int16Array(bytes.buffer, bytes.byteOffset, bytes.length / 2)

const largestDifference = (a: Int16Array, b: Int16Array) => {
  expect(a.length).toBe(b.length)
  let most = 0
  for (let i = 0; i < a.length; i++) most = Math.max(most, Math.abs(a[i]! - b[i]!))
  return most
}

interface Chunk {
  readonly choices: ReadonlyArray<{
    readonly delta: { readonly content?: string; readonly audio?: { id?: string; transcript?: string; data?: string } }
    readonly finish_reason: string | null
  }>
}

/** The chunks of a Server-Sent Events answer. */
const eventChunks = (text: string): Array<Chunk> =>
  text
    .split("\n\n")
    .map((event) => event.trim())
    .filter((event) => event.startsWith("data:") && event !== "data: [DONE]")
    .map((event) => JSON.parse(event.slice("data:".length)) as Chunk)

const messages = [{ role: "user" as const, content: "Name a colour." }]
const maxTokens = 4
/** tiny-talker speaks until its 40-frame limit; a frame is 1,920 samples of tiny-mimi's 24 kHz audio. */
const frames = 40
const hop = 1920

describe("examples/omni.ts: text and speech from thinker, talker and codec", () => {
  let root: string
  let platform: RunningPlatform
  let codec: MimiDecoderModel
  let expected: { text: string; pcm: Int16Array }
  let thought: Awaited<ReturnType<typeof thinkerReference>>

  const chat = (body: Record<string, unknown>) =>
    fetch(`${platform.url}/app/omni/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body)
    })

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-omni-"))
    const thinkerDir = join(root, "tiny-color-vlm")
    const codecDir = join(root, "tiny-mimi")
    await writeModelFiles(thinkerDir, tinyColorVlm.build())
    await writeModelFiles(codecDir, tinyMimi.build())
    codec = (await MimiDecoderModel.from_pretrained(offline(codecDir), { dtype: "fp32" })) as MimiDecoderModel
    // In-process: the thinker's answer and hidden states, the talker's frames, the codec over them all.
    thought = await thinkerReference(thinkerDir, messages, maxTokens)
    // Streamed, the thinker's last token has no row: no step reads it.
    const rows = thought.promptIds.length + thought.generated.length - 1
    const spoken = await talkerReference(
      talkerFiles(),
      thought.hiddenStates.subarray(0, rows * thought.hiddenSize),
      thought.hiddenSize,
      frames,
      thought.promptIds.length
    )
    expect(spoken).toHaveLength(frames)
    const codes = Array.from({ length: 8 }, (_, q) => spoken.map((frame) => frame[q]!))
    const whole = (await codec({
      audio_codes: new Tensor("int64", BigInt64Array.from(codes.flat(), BigInt), [1, 8, frames])
    })) as { audio_values: Tensor }
    expected = { text: thought.text, pcm: pcmOf(whole.audio_values.data as Float32Array) }
    // Something to compare: a word said, frames that differ, audio that is not silence.
    expect(thought.text.trim()).not.toBe("")
    expect(new Set(spoken.map((frame) => frame.join())).size).toBeGreaterThan(frames / 4)
    expect(expected.pcm.some((sample) => Math.abs(sample) > 100)).toBe(true)

    platform = await startPlatform()
    const registered = await runCli(["app", "register", join(repoRoot, "examples", "omni.ts")], {
      CORNSERVE_GATEWAY_URL: platform.url
    })
    expect(registered.code, registered.stderr).toBe(0)
  }, 300_000)

  afterAll(async () => {
    await platform?.stop()
    await codec?.dispose()
    if (root !== undefined) await rm(root, { recursive: true, force: true })
  })

  it("streams the thinker's text and audio in pieces as the talker writes, equal to the graphs in sequence", async () => {
    const response = await chat({
      messages,
      max_tokens: maxTokens,
      modalities: ["text", "audio"],
      audio: { voice: "alloy", format: "pcm16" },
      stream: true,
      stream_options: { include_usage: true }
    })
    expect(response.status).toBe(200)
    const chunks = eventChunks(await response.text())
    const deltas = chunks.flatMap((chunk) => chunk.choices.map((choice) => choice.delta))
    // The text as the audio's transcript, in pieces as the thinker says them (OpenAI's spoken answers carry no content).
    expect(deltas[0]!.audio?.id).toMatch(/^audio-/)
    const said = deltas.flatMap((delta) => (delta.audio?.transcript ? [delta.audio.transcript] : []))
    expect(said.join("")).toBe(expected.text)
    // The talker passes the text on before its own end, so it comes before the last piece of audio.
    const textAt = deltas.findIndex((delta) => delta.audio?.transcript)
    expect(textAt).toBeLessThan(deltas.findLastIndex((delta) => delta.audio?.data !== undefined))
    expect(deltas.some((delta) => delta.content !== undefined)).toBe(false)
    const pieces = deltas.flatMap((delta) =>
      delta.audio?.data === undefined ? [] : [Buffer.from(delta.audio.data, "base64")]
    )
    // Pieces of 5, 10, 20 frames, then the 5 left: decoded while the talker was still writing.
    expect(pieces.map((piece) => piece.length / 2 / hop)).toEqual([5, 10, 20, 5])
    expect(largestDifference(samplesOf(Buffer.concat(pieces)), expected.pcm)).toBeLessThanOrEqual(1)
    const finished = chunks.filter((chunk) => chunk.choices[0]?.finish_reason != null)
    expect(finished.map((chunk) => chunk.choices[0]!.finish_reason)).toEqual([
      thought.generated.length >= maxTokens ? "length" : "stop"
    ])
    expect((chunks.at(-1) as unknown as { usage: Record<string, number> }).usage).toEqual({
      prompt_tokens: thought.promptIds.length,
      completion_tokens: thought.generated.length,
      total_tokens: thought.promptIds.length + thought.generated.length
    })
  })

  it("answers a whole chat's audio as a WAV file with its transcript, and pcm16 as it is", async () => {
    for (const format of ["wav", "pcm16"] as const) {
      const response = await chat({
        messages,
        max_tokens: maxTokens,
        modalities: ["text", "audio"],
        audio: { voice: "alloy", format }
      })
      const body = (await response.json()) as {
        choices: Array<{ message: { content: string | null; audio: { data: string; transcript: string; id: string } } }>
        usage: { completion_tokens: number }
      }
      expect(response.status, JSON.stringify(body)).toBe(200)
      const { message } = body.choices[0]!
      expect(message.content).toBeNull()
      expect(message.audio.transcript).toBe(expected.text)
      const file = Buffer.from(message.audio.data, "base64")
      if (format === "wav") {
        expect(file.subarray(0, 4).toString("ascii")).toBe("RIFF")
        expect(file.readUInt32LE(24)).toBe(24_000)
        expect(file.readUInt32LE(40)).toBe(frames * hop * 2)
      }
      const pcm = samplesOf(format === "wav" ? file.subarray(44) : file)
      expect(largestDifference(pcm, expected.pcm)).toBeLessThanOrEqual(1)
      expect(body.usage.completion_tokens).toBeGreaterThan(0)
    }
  })

  it("answers text alone as a chat when audio is not asked for, and speaks of an image", async () => {
    const text = (await (await chat({ messages, max_tokens: maxTokens })).json()) as {
      choices: Array<{ message: { content: string; audio?: unknown } }>
    }
    expect(text.choices[0]!.message.content).toBe(expected.text)
    expect(text.choices[0]!.message.audio).toBeUndefined()
    const red =
      "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
    const response = await chat({
      messages: [
        {
          role: "user",
          content: [
            { type: "text", text: "What colour is this image?" },
            { type: "image_url", image_url: { url: red } }
          ]
        }
      ],
      max_tokens: 8,
      modalities: ["text", "audio"],
      audio: { voice: "alloy", format: "wav" }
    })
    const body = (await response.json()) as {
      choices: Array<{ message: { audio: { data: string; transcript: string } } }>
    }
    expect(response.status, JSON.stringify(body)).toBe(200)
    expect(body.choices[0]!.message.audio.transcript.toLowerCase()).toContain("red")
    expect(Buffer.from(body.choices[0]!.message.audio.data, "base64").length).toBe(44 + frames * hop * 2)
  })

  it("refuses what it cannot answer, clearly", async () => {
    const mp3 = await chat({ messages, modalities: ["text", "audio"], audio: { voice: "alloy", format: "mp3" } })
    expect(mp3.status).toBe(422)
    expect(await mp3.text()).toMatch(/format/)
    // An LLM task alone answers text: asked to speak, its executor says where speech comes from.
    const file = join(root, "text_only.ts")
    await writeFile(
      file,
      `import { ChatCompletionRequest, defineApp, LLMTask } from "cornserve/app"
const llm = new LLMTask({ model: "cornserve/tiny-color-vlm" })
export default defineApp({ tasks: { llm }, request: ChatCompletionRequest, serve: (request) => llm.invoke(request) })
`
    )
    const registered = await runCli(["app", "register", file], { CORNSERVE_GATEWAY_URL: platform.url })
    expect(registered.code, registered.stderr).toBe(0)
    const plain = await fetch(`${platform.url}/app/text_only/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ messages, modalities: ["text", "audio"], audio: { voice: "alloy", format: "wav" } })
    })
    const refusal = await plain.text()
    expect(plain.status, refusal).toBe(400)
    expect(refusal).toMatch(/TalkerTask/)
  })
})
