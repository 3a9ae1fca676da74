import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { AutoProcessor, type Tensor } from "@huggingface/transformers"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { voxtralAudio } from "../../src/executors/common/media/preprocess.js"
import { wavFile } from "../../src/executors/common/media/Wav.js"
import { expandPlaceholders, templateMessages } from "../../src/executors/llm/Prompt.js"
import { loadModelDirectory } from "../../src/models/ModelDirectory.js"
import { Random } from "../../src/models/Random.js"
import { randomVoxtralFiles, voxtralAudioToken } from "../../src/models/recipes/RandomVoxtral.js"
import { ChatTokenizer } from "../../src/models/Tokenizer.js"
import { ultravoxAudioOf } from "../../src/models/UltravoxProcessor.js"
import type { VoxtralAudio } from "../../src/models/VoxtralProcessor.js"
import { floatTensor, session } from "./support/Ort.js"
import { writeModelFiles } from "./support/SmolVlmFixture.js"
import { offline } from "./support/TransformersJs.js"

/**
 * Voxtral's audio as the platform prepares it, against transformers.js's VoxtralProcessor on the
 * random fixture: a clip's audio_values (30 s chunks, each padded to 3000 frames) and the prompt's
 * ids ([BEGIN_AUDIO] and 375 [AUDIO] a chunk where the template wrote [AUDIO]) are the same, for
 * clips shorter than a chunk, of exactly one, and of two.
 */

let root: string
let modelDir: string
const fixture = randomVoxtralFiles({ seed: 3 })

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "voxtral-"))
  modelDir = join(root, "voxtral-tiny")
  await writeModelFiles(modelDir, fixture.files)
})

afterAll(async () => {
  await rm(root, { recursive: true, force: true })
})

/** A tone of its own and noise, as 16-bit samples at 16 kHz (what a WAV holds). */
const clip = (samples: number, seed: number): Int16Array => {
  const random = new Random(seed)
  return Int16Array.from(random.normals(samples, 0.05), (v, i) =>
    Math.round(32767 * Math.max(-1, Math.min(1, v + 0.3 * Math.sin((2 * Math.PI * (170 + seed * 60) * i) / 16000))))
  )
}

const question = "What is said in this clip"

describe("Voxtral's processor", () => {
  it("has an audio encoder with the names transformers.js feeds and reads, 375 rows a chunk", async () => {
    const encoder = await session(join(modelDir, "onnx", "audio_encoder.onnx"))
    try {
      expect(encoder.inputNames).toEqual(["audio_values"])
      expect(encoder.outputNames).toEqual(["audio_features"])
      const outputs = await encoder.run({ audio_values: floatTensor(new Float32Array(2 * 128 * 3000), [2, 128, 3000]) })
      expect(outputs.audio_features!.dims).toEqual([750, 32])
    } finally {
      await encoder.release()
    }
  })

  it.each([
    ["shorter than a chunk", 7.3 * 16000, 1],
    ["exactly one chunk", 30 * 16000, 1],
    ["two chunks", 41.5 * 16000, 2]
  ])("a clip %s: audio_values and the prompt's ids are transformers.js's", async (_, samples, chunks) => {
    const wav = wavFile([clip(samples, chunks)], 16000)
    const model = await loadModelDirectory(modelDir)
    const voxtral = ultravoxAudioOf(model) as VoxtralAudio
    expect(voxtral.kind).toBe("voxtral")
    const ours = await voxtralAudio({ bytes: wav, mimeType: undefined, preprocessorConfig: model.preprocessorConfig })
    expect(ours.rows).toBe(375 * chunks)

    const processor = await AutoProcessor.from_pretrained(offline(modelDir))
    const messages = [
      {
        role: "user" as const,
        content: [
          { type: "input_audio" as const, input_audio: { data: "", format: "wav" as const } },
          { type: "text" as const, text: question }
        ]
      }
    ]
    const text = processor.apply_chat_template(
      [{ role: "user", content: [{ type: "audio" }, { type: "text", text: question }] }],
      { tokenize: false }
    ) as string
    expect(text).toBe(`<s>[INST]${voxtralAudioToken}${question}[/INST]`)
    // The samples as the platform decoded them: the comparison is of the processors, not of WAV readers.
    const samplesOf = Float32Array.from(clip(samples, chunks), (v) => v / 32768)
    const theirs = await processor(text, samplesOf)
    const values = theirs.audio_values as Tensor
    expect(values.dims).toEqual([chunks, 128, 3000])
    expect(ours.inputs.audio_values!.shape).toEqual([chunks, 128, 3000])
    // transformers.js projects the power spectrum on the mel filters with ONNX Runtime's float32
    // MatMul, whose blocked sums a plain one matches to within an ulp, not bit for bit.
    const expected = values.data as Float32Array
    const features = ours.inputs.audio_values!.data as Float32Array
    let worst = 0
    let differing = 0
    features.forEach((v, i) => {
      const difference = Math.abs(v - expected[i]!)
      if (difference > 0) differing++
      worst = Math.max(worst, difference)
    })
    expect(worst).toBeLessThan(1e-6)
    expect(differing / features.length).toBeLessThan(1e-3)

    const tokenizer = new ChatTokenizer(model)
    const rendered = tokenizer.applyChatTemplate(templateMessages(messages), {})
    expect(rendered).toBe(text)
    const { inputIds, starts } = expandPlaceholders(
      tokenizer.encode(rendered),
      new Map([[fixture.tokenId(voxtralAudioToken), "audio" as const]]),
      [{ modality: "audio", rows: ours.rows! }],
      { audio: [voxtral.beginAudioId] }
    )
    const ids = Array.from((theirs.input_ids as Tensor).data as BigInt64Array, Number)
    expect(Array.from(inputIds)).toEqual(ids)
    expect(ids[starts[0]! - 1]).toBe(fixture.tokenId("[BEGIN_AUDIO]"))
  })

  it("refuses audio it cannot read, saying so", async () => {
    const model = await loadModelDirectory(modelDir)
    const preprocess = (bytes: Uint8Array) =>
      voxtralAudio({ bytes, mimeType: undefined, preprocessorConfig: model.preprocessorConfig })
    await expect(preprocess(new TextEncoder().encode("this is not audio at all"))).rejects.toMatchObject({
      _tag: "MediaError",
      message: expect.stringMatching(/not in a format/)
    })
    const wav = wavFile([clip(16000, 1)], 16000)
    await expect(preprocess(wav.subarray(0, 30))).rejects.toMatchObject({
      _tag: "MediaError",
      message: expect.stringMatching(/format chunk is cut short/)
    })
  })
})
