import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { AutoModelForAudioTextToText, AutoProcessor, type Tensor } from "@huggingface/transformers"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { randomUltravoxFiles, ultravoxAudioPlaceholder } from "../../src/models/recipes/RandomUltravox.js"
import { Random } from "../../src/models/Random.js"
import { whisperFeatureExtractor, whisperFeatures } from "../../src/models/WhisperFeatures.js"
import { session } from "./support/Ort.js"
import { writeModelFiles } from "./support/SmolVlmFixture.js"
import { offline } from "./support/TransformersJs.js"

/**
 * The random Ultravox the audio LLM tests serve: transformers.js's UltravoxModel loads it and
 * generates on it; its processor's audio_values are the platform's Whisper features (not padded to
 * 30 s), and the audio encoder gives the rows the processor repeats <|audio|> for.
 */

let root: string
let modelDir: string
const fixture = randomUltravoxFiles({ seed: 4 })

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "ultravox-"))
  modelDir = join(root, "ultravox-tiny")
  await writeModelFiles(modelDir, fixture.files)
})

afterAll(async () => {
  await rm(root, { recursive: true, force: true })
})

const speechLike = (seconds: number, seed: number): Float32Array => {
  const random = new Random(seed)
  return random
    .normals(Math.round(seconds * 16000), 0.05)
    .map((v, i) => v + 0.3 * Math.sin((2 * Math.PI * (180 + seed * 40) * i) / 16000))
}

describe("a random Ultravox in the community's layout", () => {
  it("has the names transformers.js feeds and reads", async () => {
    const audio = await session(join(modelDir, "onnx", "audio_encoder.onnx"))
    expect(audio.inputNames).toEqual(["audio_values"])
    expect(audio.outputNames).toEqual(["audio_features"])
    await audio.release()
  })

  it.each([
    [1.3, 1],
    [2.57, 2],
    [7.01, 3]
  ])(
    "a %f s clip: the processor's audio_values are the platform's features, and generate runs",
    async (seconds, seed) => {
      const name = offline(modelDir)
      const processor = await AutoProcessor.from_pretrained(name)
      const model = await AutoModelForAudioTextToText.from_pretrained(name, { dtype: "fp32" })
      try {
        const clip = speechLike(seconds, seed)
        const prompt = processor.apply_chat_template(
          [{ role: "user", content: `${ultravoxAudioPlaceholder}What is said in this clip` }],
          { add_generation_prompt: true }
        ) as string
        const inputs = await processor(prompt, clip)
        const values = inputs.audio_values as Tensor
        const extractor = whisperFeatureExtractor(
          JSON.parse(new TextDecoder().decode(fixture.files.get("preprocessor_config.json")!))
        )
        const ours = whisperFeatures(extractor, clip, { pad: false })
        expect(values.dims).toEqual([1, 80, ours.frames])
        let worst = 0
        ours.data.forEach((v, i) => (worst = Math.max(worst, Math.abs(v - (values.data as Float32Array)[i]!))))
        expect(worst).toBeLessThan(1e-4)

        const rows = (inputs.audio_token_len as Array<number>)[0]!
        expect(rows).toBe(1 + Math.ceil(Math.round(clip.length / 320 + 1e-4) / fixture.stackFactor))
        const ids = Array.from((inputs.input_ids as Tensor).data as BigInt64Array, Number)
        expect(ids.filter((id) => id === fixture.tokenId(ultravoxAudioPlaceholder))).toHaveLength(rows)

        const output = (await model.generate({ ...inputs, max_new_tokens: 5, do_sample: false })) as Tensor
        expect(output.dims).toEqual([1, ids.length + 5])
      } finally {
        await model.dispose()
      }
    }
  )
})
