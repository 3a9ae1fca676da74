import { mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { AutoModelForAudioTextToText, AutoProcessor, type Tensor } from "@huggingface/transformers"
import OpenAI from "openai"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { decodeAudio } from "../../src/executors/common/media/MediaDecoder.js"
import { wavFile } from "../../src/executors/geri/router.js"
import { Random } from "../../src/models/Random.js"
import { randomUltravoxFiles, ultravoxAudioPlaceholder } from "../../src/models/recipes/RandomUltravox.js"
import { writeModelFiles } from "../models/support/SmolVlmFixture.js"
import { offline } from "../models/support/TransformersJs.js"
import { type RunningPlatform, runCli, startPlatform } from "../support/platform.js"
import { mllmAppSource } from "../support/mllmApps.js"
import { ffmpegFile } from "../support/videos.js"

/**
 * An audio LLM in the community's layout (Ultravox: onnx/audio_encoder.onnx taking Whisper
 * features, a Llama in the split layout), served end to end by the real binary as an MLLMTask with
 * modalities ["audio"]: its audio encoder on Eric with the features sent through the sidecar
 * (encoder fission), or run by the LLM executor itself. Both answer what transformers.js's
 * UltravoxModel answers for the same clip and question, for clips of several lengths, sent as WAV
 * and as mp3.
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

describe("Ultravox end to end", () => {
  let root: string
  let model: string
  let platform: RunningPlatform
  const clips = new Map<string, Buffer>()

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-ultravox-"))
    model = join(root, "ultravox-tiny")
    await writeModelFiles(model, randomUltravoxFiles({ seed: 6 }).files)
    clips.set("short.wav", wavFile([clip(1.2, 1)], 16000))
    clips.set("long.wav", wavFile([clip(6.5, 2)], 16000))
    clips.set(
      "long.mp3",
      await ffmpegFile(
        ["-f", "wav", "-i", "pipe:0", "-c:a", "libmp3lame", "-b:a", "128k"],
        "mp3",
        clips.get("long.wav")!
      )
    )
    platform = await startPlatform({ args: ["--devices", "cpu:0,cpu:1,cpu:2", "--model-root", root] })
    for (const fission of [true, false]) {
      const file = join(root, `ultravox_${fission ? "fission" : "local"}.ts`)
      await writeFile(file, mllmAppSource(model, ["audio"], fission))
      const registered = await runCli(["app", "register", file], { CORNSERVE_GATEWAY_URL: platform.url })
      expect(registered.code, registered.stderr).toBe(0)
    }
  })

  afterAll(async () => {
    await platform?.stop()
    await rm(root, { recursive: true, force: true })
  })

  /** transformers.js's greedy answer for the clip's samples (decoded as the platform decodes them). */
  const reference = async (name: string): Promise<string> => {
    const id = offline(model)
    const processor = await AutoProcessor.from_pretrained(id)
    const llm = await AutoModelForAudioTextToText.from_pretrained(id, { dtype: "fp32" })
    try {
      const samples = await decodeAudio(clips.get(name)!, undefined, 16000)
      const prompt = processor.apply_chat_template(
        [{ role: "user", content: `${ultravoxAudioPlaceholder}${question}` }],
        { add_generation_prompt: true }
      ) as string
      const inputs = await processor(prompt, samples)
      const output = (await llm.generate({ ...inputs, max_new_tokens: maxTokens, do_sample: false })) as Tensor
      const length = (inputs.input_ids as Tensor).dims[1]!
      const generated = Array.from(output.data as BigInt64Array, Number).slice(length)
      return processor.tokenizer!.decode(generated, { skip_special_tokens: true })
    } finally {
      await llm.dispose()
    }
  }

  const ask = async (app: string, name: string) => {
    const client = new OpenAI({ baseURL: `${platform.url}/app/${app}/v1`, apiKey: "unused", maxRetries: 0 })
    const completion = await client.chat.completions.create({
      model,
      messages: [
        {
          role: "user",
          content: [
            {
              type: "input_audio",
              input_audio: { data: clips.get(name)!.toString("base64"), format: name.endsWith(".mp3") ? "mp3" : "wav" }
            },
            { type: "text", text: question }
          ]
        }
      ],
      max_tokens: maxTokens,
      temperature: 0
    })
    return completion.choices[0]!.message.content!
  }

  it("answers clips of several lengths, as WAV and mp3, as transformers.js does, with encoder fission and without", async () => {
    const answers = new Map<string, string>()
    for (const name of clips.keys()) {
      const expected = await reference(name)
      expect(expected.length, name).toBeGreaterThan(0)
      answers.set(name, expected)
      for (const app of ["ultravox_local", "ultravox_fission"])
        expect(await ask(app, name), `${app}, ${name}`).toBe(expected)
    }
    expect(answers.get("short.wav")).not.toBe(answers.get("long.wav"))
  })

  it("refuses a clip longer than the model's 30 s window, clearly, with and without encoder fission", async () => {
    const long = wavFile([clip(31, 3)], 16000)
    for (const app of ["ultravox_local", "ultravox_fission"]) {
      const client = new OpenAI({ baseURL: `${platform.url}/app/${app}/v1`, apiKey: "unused", maxRetries: 0 })
      const refused = await client.chat.completions
        .create({
          model,
          messages: [
            {
              role: "user",
              content: [{ type: "input_audio", input_audio: { data: long.toString("base64"), format: "wav" } }]
            }
          ],
          max_tokens: 2
        })
        .catch((error: { status?: number; message?: string }) => error)
      expect((refused as { status?: number }).status, app).toBe(400)
      expect((refused as { message?: string }).message).toMatch(/at most 30 s a clip/)
    }
  })
})
