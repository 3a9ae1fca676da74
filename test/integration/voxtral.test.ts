import { mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { AutoModelForAudioTextToText, AutoProcessor, type Tensor } from "@huggingface/transformers"
import OpenAI from "openai"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { decodeAudio } from "../../src/executors/common/media/MediaDecoder.js"
import { wavFile } from "../../src/executors/common/media/Wav.js"
import { Random } from "../../src/models/Random.js"
import { randomVoxtralFiles } from "../../src/models/recipes/RandomVoxtral.js"
import { writeModelFiles } from "../models/support/SmolVlmFixture.js"
import { offline } from "../models/support/TransformersJs.js"
import { mllmAppSource } from "../support/mllmApps.js"
import { type RunningPlatform, runCli, startPlatform } from "../support/platform.js"

/**
 * Voxtral (audio and text chat) in the community's split layout (onnx/audio_encoder.onnx: Whisper's
 * encoder and Voxtral's projector on 30 s chunks; a Llama decoder), on a random-weight fixture of the
 * project's recipe, served end to end by the real binary as an MLLMTask with modalities ["audio"]:
 * its audio encoder on Eric with the rows sent through the sidecar (encoder fission), or run by the
 * LLM executor itself. The answers are transformers.js's VoxtralForConditionalGeneration's, for a
 * clip of one chunk and one of two, and for text alone, asked together.
 */

const maxTokens = 8
const question = "What is said in this clip"

/** A clip of a tone of its own and noise, at 16 kHz, as 16-bit samples. */
const clip = (seconds: number, seed: number): Int16Array => {
  const random = new Random(seed)
  const noise = random.normals(Math.round(seconds * 16000), 0.05)
  return Int16Array.from(noise, (v, i) =>
    Math.round(32767 * Math.max(-1, Math.min(1, v + 0.4 * Math.sin((2 * Math.PI * (150 + seed * 90) * i) / 16000))))
  )
}

type Content =
  | string
  | ReadonlyArray<
      | { readonly type: "text"; readonly text: string }
      | { readonly type: "input_audio"; readonly input_audio: { readonly data: string; readonly format: "wav" } }
    >

describe("Voxtral end to end", () => {
  let root: string
  let model: string
  let platform: RunningPlatform
  /** 3.2 s: one chunk, mostly padding; 37 s: two chunks, the second of 7 s. */
  const clips = new Map([
    ["short", wavFile([clip(3.2, 1)], 16000)],
    ["two chunks", wavFile([clip(37, 2)], 16000)]
  ])
  const texts = ["Hello", "Describe the sound in this clip, in a few words"]

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-voxtral-"))
    model = join(root, "voxtral-tiny")
    await writeModelFiles(model, randomVoxtralFiles({ seed: 6 }).files)
    platform = await startPlatform({ args: ["--devices", "cpu:0,cpu:1,cpu:2", "--model-root", root] })
    for (const fission of [true, false]) {
      const file = join(root, `voxtral_${fission ? "fission" : "local"}.ts`)
      await writeFile(file, mllmAppSource(model, ["audio"], fission))
      const registered = await runCli(["app", "register", file], { CORNSERVE_GATEWAY_URL: platform.url })
      expect(registered.code, registered.stderr).toBe(0)
    }
  }, 240_000)

  afterAll(async () => {
    await platform?.stop()
    if (root !== undefined) await rm(root, { recursive: true, force: true })
  })

  /** transformers.js's greedy answers: to the question about each clip, then to each text alone. */
  const references = async (): Promise<{ clips: Map<string, string>; texts: Array<string> }> => {
    const id = offline(model)
    const processor = await AutoProcessor.from_pretrained(id)
    const llm = await AutoModelForAudioTextToText.from_pretrained(id, { dtype: "fp32" })
    const answer = async (inputs: Record<string, unknown>) => {
      const output = (await llm.generate({ ...inputs, max_new_tokens: maxTokens, do_sample: false })) as Tensor
      const length = (inputs.input_ids as Tensor).dims[1]!
      return processor.tokenizer!.decode(Array.from(output.data as BigInt64Array, Number).slice(length), {
        skip_special_tokens: true
      })
    }
    try {
      const audioPrompt = processor.apply_chat_template(
        [{ role: "user", content: [{ type: "audio" }, { type: "text", text: question }] }],
        { tokenize: false }
      ) as string
      const answers = new Map<string, string>()
      for (const [name, wav] of clips)
        answers.set(name, await answer(await processor(audioPrompt, await decodeAudio(wav, undefined, 16000))))
      const textAnswers: Array<string> = []
      for (const text of texts) {
        const prompt = processor.apply_chat_template([{ role: "user", content: text }], { tokenize: false }) as string
        textAnswers.push(await answer(await processor(prompt)))
      }
      return { clips: answers, texts: textAnswers }
    } finally {
      await llm.dispose()
    }
  }

  const client = (app: string) =>
    new OpenAI({ baseURL: `${platform.url}/app/${app}/v1`, apiKey: "unused", maxRetries: 0 })

  const ask = async (app: string, content: Content) => {
    const completion = await client(app).chat.completions.create({
      model,
      messages: [{ role: "user", content: content as never }],
      max_tokens: maxTokens,
      temperature: 0
    })
    return completion.choices[0]!.message.content!
  }

  const audioQuestion = (wav: Buffer): Content => [
    { type: "input_audio", input_audio: { data: wav.toString("base64"), format: "wav" } },
    { type: "text", text: question }
  ]

  it("answers clips of one and two chunks and texts, asked together, as transformers.js does, with encoder fission and without", async () => {
    const expected = await references()
    // Something to compare: answers that say something, and differ by clip.
    for (const answer of [...expected.clips.values(), ...expected.texts]) expect(answer.length).toBeGreaterThan(0)
    expect(expected.clips.get("short")).not.toBe(expected.clips.get("two chunks"))
    for (const app of ["voxtral_local", "voxtral_fission"]) {
      const answers = await Promise.all([
        ...[...clips.values()].map((wav) => ask(app, audioQuestion(wav))),
        ...texts.map((text) => ask(app, text))
      ])
      expect(answers, app).toEqual([...expected.clips.values(), ...expected.texts])
    }
  })

  it("refuses a corrupt clip with a 400 that says why, with encoder fission and without", async () => {
    const cut = clips.get("short")!.subarray(0, 30)
    for (const app of ["voxtral_local", "voxtral_fission"]) {
      const refused = await ask(app, audioQuestion(cut)).catch((error: { status?: number; message?: string }) => error)
      expect((refused as { status?: number }).status, app).toBe(400)
      expect((refused as { message?: string }).message, app).toMatch(/WAV file's format chunk is cut short/)
    }
  })
})
