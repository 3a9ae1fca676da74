import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { decodeAudioProcessorConfig, inputValues } from "../../../src/models/AudioProcessor.js"
import { decodeImageProcessorConfig, pixelValues } from "../../../src/models/ImageProcessor.js"
import { onnxPath } from "../../../src/models/ModelDirectory.js"
import { buildModel } from "../../../src/models/ModelStore.js"
import { Random } from "../../../src/models/Random.js"
import { answerWords, colorWordVariants } from "../../../src/models/recipes/ChatVocabulary.js"
import { colors } from "../../../src/models/recipes/ColorChannels.js"
import {
  colorDecoderWeights,
  colorVisionWeights,
  imageSize,
  pitchAudioWeights,
  samplingRate
} from "../../../src/models/recipes/TinyColorVlm.js"
import { colorVisionForward, embedTokensForward, pitchAudioForward } from "../../../src/models/reference/ColorVlm.js"
import { ColorVlmRunner } from "../support/ColorVlmRunner.js"
import { expectDecoderMatchesReference } from "../support/DecoderCheck.js"
import { expectClose, floatTensor, int64Tensor, session } from "../support/Ort.js"
import { colorImage, type ImageStyle, tone } from "../support/Synthetic.js"

let root: string
let runner: ColorVlmRunner

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "cornserve-vlm-"))
  runner = await ColorVlmRunner.open(await buildModel("cornserve/tiny-color-vlm", root))
})

afterAll(async () => {
  await rm(root, { recursive: true, force: true })
})

const maxNewTokens = 8

describe("tiny-color-vlm matches its float64 reference", () => {
  const random = new Random(20_240_601)
  const uniform = (count: number, low: number, high: number) =>
    Float32Array.from({ length: count }, () => low + (high - low) * random.uniform())

  it("vision_encoder", async () => {
    const pixels = uniform(2 * 3 * imageSize * imageSize, -1, 1)
    const outputs = await (await session(onnxPath(runner.model, "vision_encoder"))).run({
      pixel_values: floatTensor(pixels, [2, 3, imageSize, imageSize])
    })
    expectClose(outputs.image_features, colorVisionForward(colorVisionWeights(), pixels, 2), "image_features")
  })

  it("audio_encoder", async () => {
    const weights = pitchAudioWeights()
    const samples = uniform(2 * weights.clipSamples, -0.5, 0.5)
    const outputs = await (await session(onnxPath(runner.model, "audio_encoder"))).run({
      input_values: floatTensor(samples, [2, weights.clipSamples])
    })
    expectClose(outputs.audio_features, pitchAudioForward(weights, samples, 2), "audio_features")
  })

  it("embed_tokens", async () => {
    const weights = colorDecoderWeights()
    const ids = Array.from({ length: 12 }, () => random.below(weights.embedTokens.rows))
    const outputs = await (await session(onnxPath(runner.model, "embed_tokens"))).run({
      input_ids: int64Tensor(ids, [2, 6])
    })
    expectClose(outputs.inputs_embeds, embedTokensForward(weights, ids), "inputs_embeds")
  })

  it("decoder_model_merged, with a cache and a padded sequence", async () => {
    const decoder = await session(onnxPath(runner.model, "decoder_model_merged"))
    await expectDecoderMatchesReference(decoder, colorDecoderWeights(), random)
  })
})

describe("tiny-color-vlm answers", () => {
  it("names the dominant colour of at least 98% of 200 generated images, then ends its turn", async () => {
    const random = new Random(98)
    const preprocessor = decodeImageProcessorConfig(runner.model.preprocessorConfig)
    const styles: ReadonlyArray<ImageStyle> = ["solid", "noisy", "patch", "noisy-patch"]
    const cases = await Promise.all(
      Array.from({ length: 200 }, async (_, i) => {
        const dominant = colors[i % colors.length]!
        const minority = colors[(i + 1 + random.below(colors.length - 1)) % colors.length]!
        const generated = colorImage(random, dominant, minority, styles[i % styles.length]!)
        return { dominant, pixels: await pixelValues(preprocessor, generated.image) }
      })
    )
    expect(new Set(cases.map((c) => c.dominant.name)).size).toBe(8)

    const answers = await runner.answer(
      cases.map((c) => ({ text: "What colour is this image?", images: [c.pixels] })),
      maxNewTokens
    )
    const colorIds = new Map(colors.map((color) => [color.name, runner.tokenizer.tokenId(color.name)]))
    const correct = answers.filter(
      (answer, i) =>
        answer.text === cases[i]!.dominant.name &&
        answer.ids.length === 2 &&
        answer.ids[0] === colorIds.get(cases[i]!.dominant.name) &&
        answer.ids[1] === runner.eosTokenId
    )
    expect(correct.length).toBeGreaterThanOrEqual(196)
    for (const answer of answers) expect(answer.ids.length).toBeLessThanOrEqual(maxNewTokens)
  })

  it("says whether a tone is low or high", async () => {
    const preprocessor = decodeAudioProcessorConfig(runner.model.preprocessorConfig)
    const tones = [
      { hertz: 110, seconds: 1, expected: "low" },
      { hertz: 200, seconds: 0.4, expected: "low" },
      { hertz: 330, seconds: 2, expected: "low" },
      { hertz: 420, seconds: 0.8, expected: "low" },
      { hertz: 700, seconds: 1, expected: "high" },
      { hertz: 1200, seconds: 0.5, expected: "high" },
      { hertz: 2500, seconds: 1.5, expected: "high" },
      { hertz: 6000, seconds: 1, expected: "high" }
    ]
    // A clip recorded at 44.1 kHz is resampled by the preprocessor.
    const recordedAt = [samplingRate, 44_100]
    const requests = tones.flatMap((t, i) =>
      recordedAt.map((rate) => ({
        text: "Is this tone low or high?",
        audio: [inputValues(preprocessor, tone(t.hertz, rate, t.seconds, 0.1 + 0.1 * i), rate)]
      }))
    )
    const answers = await runner.answer(requests, maxNewTokens)
    expect(answers.map((answer) => answer.text)).toEqual(tones.flatMap((t) => recordedAt.map(() => t.expected)))
    expect(answers.every((answer) => answer.finished && answer.ids.length === 2)).toBe(true)
  })

  it("answers about the sound when a prompt has both an image and a sound, and says nothing without either", async () => {
    const imagePreprocessor = decodeImageProcessorConfig(runner.model.preprocessorConfig)
    const audioPreprocessor = decodeAudioProcessorConfig(runner.model.preprocessorConfig)
    const red = await pixelValues(imagePreprocessor, colorImage(new Random(1), colors[0]!, colors[1]!, "solid").image)
    const answers = await runner.answer(
      [
        {
          text: "What is this?",
          images: [red],
          audio: [inputValues(audioPreprocessor, tone(3000, samplingRate, 1, 0.5), samplingRate)]
        },
        { text: "Tell me about a zebra in Zürich 🦓" },
        { text: "What colour is this image?", images: [red] }
      ],
      maxNewTokens
    )
    expect(answers.map((answer) => answer.text)).toEqual(["high", "nothing", "red"])
  })
})

describe("tiny-color-vlm's tokenizer", () => {
  it("encodes and decodes any text, unknown words included", () => {
    const random = new Random(5)
    const alphabet = [..."abcXYZ 019,.!?\n\t'\"-_/", "é", "ß", "Ж", "中", "文", "🦓", "🎨", "\u0000", "\u00a0", "عربى"]
    const texts = [
      "",
      "flibbertigibbet quux",
      "What colour is this image? Paint it ultraviolet!",
      ...Array.from({ length: 50 }, () =>
        Array.from({ length: 1 + random.below(40) }, () => alphabet[random.below(alphabet.length)]!).join("")
      )
    ]
    for (const text of texts) {
      const ids = runner.tokenizer.encode(text)
      expect(runner.tokenizer.decode(ids)).toBe(text)
    }
    expect(runner.tokenizer.encode("flibbertigibbet").length).toBeGreaterThan(1)
  })

  it("has one token for every answer and colour word", () => {
    for (const word of [...answerWords, ...colors.flatMap((color) => colorWordVariants(color.name))]) {
      expect(runner.tokenizer.encode(word), word).toHaveLength(1)
    }
  })

  it("renders its chat template with media placeholders", () => {
    const text = runner.tokenizer.applyChatTemplate([
      { role: "system", content: "Be brief." },
      { role: "user", content: [{ type: "image_url" }, { type: "input_audio" }, { type: "text", text: "Hi" }] }
    ])
    expect(text).toBe(
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n<image><audio>Hi<|im_end|>\n<|im_start|>assistant\n"
    )
    const ids = runner.tokenizer.encode(text)
    expect(ids.filter((id) => id === runner.model.config.image_token_id)).toHaveLength(1)
    expect(ids.filter((id) => id === runner.model.config.audio_token_id)).toHaveLength(1)
  })
})
