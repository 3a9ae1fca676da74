import type * as ort from "onnxruntime-node"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { decodeAudioProcessorConfig, inputValues } from "../../../src/models/AudioProcessor.js"
import { loadModelDirectory, type ModelDirectory, onnxPath } from "../../../src/models/ModelDirectory.js"
import { buildModel } from "../../../src/models/ModelStore.js"
import { Random } from "../../../src/models/Random.js"
import { colorBits, colors, hiddenSize } from "../../../src/models/recipes/ColorChannels.js"
import { painterWeights } from "../../../src/models/recipes/TinyColorPainter.js"
import { toneFrequency, tonesWeights } from "../../../src/models/recipes/TinyColorTones.js"
import { painterForward, tonesForward } from "../../../src/models/reference/ColorGenerators.js"
import { ChatTokenizer } from "../../../src/models/Tokenizer.js"
import { ColorVlmRunner } from "../support/ColorVlmRunner.js"
import { expectClose, floatTensor, int64Tensor, numbers, session } from "../support/Ort.js"
import { peakFrequency } from "../support/Spectrum.js"

let root: string
let painter: ModelDirectory
let tones: ModelDirectory
let vlmDir: string
let tokenizer: ChatTokenizer
let embedTokens: ort.InferenceSession

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "cornserve-generators-"))
  vlmDir = await buildModel("cornserve/tiny-color-vlm", root)
  painter = await loadModelDirectory(await buildModel("cornserve/tiny-color-painter", root))
  tones = await loadModelDirectory(await buildModel("cornserve/tiny-color-tones", root))
  const vlm = await loadModelDirectory(vlmDir)
  tokenizer = new ChatTokenizer(vlm)
  embedTokens = await session(onnxPath(vlm, "embed_tokens"))
})

afterAll(async () => {
  await rm(root, { recursive: true, force: true })
})

/** Prompts as a generator receives them: tiny-color-vlm's embed_tokens output, right-padded, with a mask. */
const embedPrompts = async (texts: ReadonlyArray<string>) => {
  const ids = texts.map((text) => tokenizer.encode(text))
  const sequence = Math.max(...ids.map((prompt) => prompt.length))
  const padded = ids.flatMap((prompt) => [...prompt, ...new Array<number>(sequence - prompt.length).fill(0)])
  const mask = ids.flatMap((prompt) => [...prompt.map(() => 1), ...new Array<number>(sequence - prompt.length).fill(0)])
  const embeds = (await embedTokens.run({ input_ids: int64Tensor(padded, [texts.length, sequence]) })).inputs_embeds!
  return { inputs_embeds: embeds, attention_mask: int64Tensor(mask, [texts.length, sequence]) }
}

/** Random embeddings; every prompt after the first is right-padded by two positions. */
const randomPrompts = (random: Random, batch: number, sequence: number) => {
  const inputsEmbeds = Float32Array.from({ length: batch * sequence * hiddenSize }, () => random.normal())
  const attentionMask = Array.from({ length: batch * sequence }, (_, i) => {
    const padding = i < sequence ? 0 : 2
    return i % sequence < sequence - padding ? 1 : 0
  })
  return {
    reference: { batch, sequence, inputsEmbeds, attentionMask },
    feeds: {
      inputs_embeds: floatTensor(inputsEmbeds, [batch, sequence, hiddenSize]),
      attention_mask: int64Tensor(attentionMask, [batch, sequence])
    }
  }
}

const nearestColor = (rgb: ReadonlyArray<number>) =>
  colors.reduce((best, color) => {
    const distance = (c: typeof color) => c.rgb.reduce((sum, on, i) => sum + (on - rgb[i]!) ** 2, 0)
    return distance(color) < distance(best) ? color : best
  })

describe("tiny-color-painter", () => {
  it("matches its float64 reference on random inputs", async () => {
    const { reference, feeds } = randomPrompts(new Random(31), 3, 7)
    const outputs = await (await session(onnxPath(painter, "generator"))).run(feeds)
    expectClose(outputs.images, painterForward(painterWeights(), reference), "images")
  })

  it("paints the colour a prompt names, and grey when it names none", async () => {
    expect(painter.config.generator).toEqual({ modality: "image", height: 128, width: 128 })
    const prompts = [
      ...colors.map((color, i) =>
        i % 2 === 0
          ? `Paint a ${color.name} picture`
          : `${color.name[0]!.toUpperCase()}${color.name.slice(1)} sky, please`
      ),
      "Paint a picture of the sea"
    ]
    const outputs = await (await session(onnxPath(painter, "generator"))).run(await embedPrompts(prompts))
    const images = numbers(outputs.images)
    expect(outputs.images!.dims).toEqual([prompts.length, 3, 128, 128])
    const plane = 128 * 128
    const means = prompts.map((_, b) =>
      [0, 1, 2].map(
        (c) => images.subarray((b * 3 + c) * plane, (b * 3 + c + 1) * plane).reduce((a, v) => a + v, 0) / plane
      )
    )
    expect(means.slice(0, colors.length).map((mean) => nearestColor(mean).name)).toEqual(
      colors.map((color) => color.name)
    )
    for (const channel of means[colors.length]!) expect(channel).toBeCloseTo(0.5, 5)
  })
})

const audioGenerator = () => {
  const generator = tones.config.generator
  if (generator?.modality !== "audio") throw new Error("the tones model should declare an audio generator")
  return { sampleRate: generator.sample_rate, chunkSize: generator.chunk_size, chunks: generator.default_num_chunks }
}

/** Runs the tones generator chunk by chunk, as a streaming generator would, and joins the chunks. */
const streamTones = async (prompts: ReadonlyArray<string>): Promise<Array<Int16Array>> => {
  const { chunkSize, chunks } = audioGenerator()
  const model = await session(onnxPath(tones, "generator"))
  const feeds = await embedPrompts(prompts)
  const streams = prompts.map(() => new Int16Array(chunks * chunkSize))
  for (let chunk = 0; chunk < chunks; chunk++) {
    const outputs = await model.run({
      ...feeds,
      chunk_index: int64Tensor(
        prompts.map(() => chunk),
        [prompts.length]
      )
    })
    expect(outputs.pcm!.dims).toEqual([prompts.length, chunkSize])
    const pcm = outputs.pcm!.data as Int16Array
    streams.forEach((stream, b) => stream.set(pcm.subarray(b * chunkSize, (b + 1) * chunkSize), chunk * chunkSize))
  }
  return streams
}

describe("tiny-color-tones", () => {
  it("matches its float64 reference on random inputs", async () => {
    const random = new Random(47)
    const { reference, feeds } = randomPrompts(random, 3, 6)
    const chunkIndex = [0, 1 + random.below(50), 1000 + random.below(1000)]
    const outputs = await (await session(onnxPath(tones, "generator"))).run({
      ...feeds,
      chunk_index: int64Tensor(chunkIndex, [3])
    })
    expect(outputs.pcm!.type).toBe("int16")
    expectClose(outputs.pcm, tonesForward(tonesWeights(), reference, chunkIndex), "pcm")
  })

  it("streams a tone at the pitch of the colour named, in chunks that join seamlessly", async () => {
    const { sampleRate } = audioGenerator()
    const streams = await streamTones(colors.map((color) => `Play a ${color.name} tone`))
    colors.forEach((color, b) => {
      const hertz = toneFrequency(colorBits(color))
      expect(Math.abs(peakFrequency(streams[b]!, sampleRate) - hertz), color.name).toBeLessThan(1)
      const amplitude = Math.max(...streams[b]!)
      let worst = 0
      streams[b]!.forEach((sample, n) => {
        worst = Math.max(worst, Math.abs(sample - amplitude * Math.sin((2 * Math.PI * hertz * n) / sampleRate)))
      })
      expect(worst, color.name).toBeLessThanOrEqual(1)
    })
  })

  it("plays tones tiny-color-vlm hears as low (black, blue) and high (yellow, white)", async () => {
    const runner = await ColorVlmRunner.open(vlmDir)
    const { sampleRate } = audioGenerator()
    const streams = await streamTones(["black", "blue", "yellow", "white"].map((name) => `Play a ${name} tone`))
    const audio = decodeAudioProcessorConfig(runner.model.preprocessorConfig)
    const clips = streams.map((stream) =>
      inputValues(
        audio,
        Float32Array.from(stream, (sample) => sample / 32768),
        sampleRate
      )
    )
    const answers = await runner.answer(
      clips.map((clip) => ({ text: "Is this tone low or high?", audio: [clip] })),
      4
    )
    expect(answers.map((answer) => answer.text)).toEqual(["low", "low", "high", "high"])
  })
})
