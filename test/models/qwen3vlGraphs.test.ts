import { AutoModelForImageTextToText, AutoProcessor, RawImage, type Tensor } from "@huggingface/transformers"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import type * as ort from "onnxruntime-node"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { interleavedMropeAxes } from "../../src/models/architectures/Qwen3VL.js"
import { mropePositions } from "../../src/models/MRope.js"
import type { GridThw } from "../../src/models/Qwen2VLProcessor.js"
import { qwen2VLSpecialTokens } from "../../src/models/recipes/RandomQwen2VL.js"
import { randomQwen3VLFiles, randomQwen3VLWeights } from "../../src/models/recipes/RandomQwen3VL.js"
import { gradientPng } from "../support/mllmApps.js"
import { expectClose, floatTensor, int64Tensor, numbers, session } from "./support/Ort.js"
import {
  referenceQwen3VLGreedy,
  referenceQwen3VLLogits,
  referenceQwen3VLVisionFeatures
} from "./support/Qwen3VLModelReference.js"
import { writeModelFiles } from "./support/SmolVlmFixture.js"
import { offline } from "./support/TransformersJs.js"

const seed = 1
let root: string
let modelDir: string
const fixture = randomQwen3VLFiles({ seed })
const weights = randomQwen3VLWeights(fixture.config, seed)

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "qwen3vl-graphs-"))
  modelDir = join(root, "qwen3-vl-tiny")
  await writeModelFiles(modelDir, fixture.files)
})

afterAll(async () => {
  await rm(root, { recursive: true, force: true })
})

const ids = (tensor: unknown): Array<number> => Array.from((tensor as Tensor).data as BigInt64Array, Number)
const imagePad = () => fixture.tokenId(qwen2VLSpecialTokens.imagePad)
const pads = () => ({ imagePad: imagePad(), videoPad: fixture.tokenId(qwen2VLSpecialTokens.videoPad) })
const stems = ["vision_encoder", "embed_tokens", "decoder_model_merged"] as const
const sessions = () => Promise.all(stems.map((stem) => session(join(modelDir, "onnx", `${stem}.onnx`))))
/** Greedy tokens as generate() gives them: up to the first end-of-sequence token (generation_config's), which it keeps. */
const untilEos = (tokens: ReadonlyArray<number>): Array<number> => {
  const eos = [qwen2VLSpecialTokens.imEnd, qwen2VLSpecialTokens.endOfText].map(fixture.tokenId)
  const end = tokens.findIndex((token) => eos.includes(token))
  return end === -1 ? [...tokens] : tokens.slice(0, end + 1)
}
const image = async (width: number, height: number) => RawImage.fromBlob(new Blob([await gradientPng(width, height)]))

describe("a random Qwen3-VL in the community's split layout", () => {
  it("has the input and output names transformers.js feeds and reads", async () => {
    const [vision, embed, decoder] = await sessions()
    try {
      expect(vision!.inputNames).toEqual(["pixel_values", "image_grid_thw"])
      expect(vision!.outputNames).toEqual(["image_features"])
      expect(embed!.inputNames).toEqual(["input_ids"])
      expect(embed!.outputNames).toEqual(["inputs_embeds"])
      const cache = (prefix: string) =>
        Array.from({ length: fixture.config.text.layers }, (_, i) => [
          `${prefix}.${i}.key`,
          `${prefix}.${i}.value`
        ]).flat()
      expect(decoder!.inputNames).toEqual([
        "inputs_embeds",
        "attention_mask",
        "position_ids",
        ...cache("past_key_values")
      ])
      expect(decoder!.outputNames).toEqual(["logits", ...cache("present")])
    } finally {
      await Promise.all([vision, embed, decoder].map((s) => s!.release()))
    }
  })

  it("interleaves t, h and w over the rotary frequencies as apply_interleaved_mrope does", () => {
    // Qwen3-VL-2B: head_dim 128, mrope_section [24, 20, 20].
    const axes = interleavedMropeAxes({ ...fixture.config.text, headDim: 128, mropeSection: [24, 20, 20] })
    expect(axes.slice(0, 7)).toEqual([0, 1, 2, 0, 1, 2, 0])
    expect(axes.slice(57)).toEqual([0, 1, 2, 0, 0, 0, 0])
    expect([0, 1, 2].map((axis) => axes.filter((a) => a === axis).length)).toEqual([24, 20, 20])
  })

  it("encodes images as Qwen3VLVisionModel does: interpolated learned positions, rotary positions, attention within each frame", async () => {
    const [vision] = await sessions()
    try {
      const { inChannels, temporalPatchSize, patchSize } = fixture.config.vision
      const width = inChannels * temporalPatchSize * patchSize ** 2
      // Three images in one call: a wide one, one of two frames, and one of a single merge block
      // (a grid of 2 × 2, whose positions take the learned grid's corners).
      const grids: ReadonlyArray<GridThw> = [
        [1, 4, 10],
        [2, 4, 2],
        [1, 2, 2]
      ]
      const patches = grids.reduce((n, [t, h, w]) => n + t * h * w, 0)
      const pixels = Float32Array.from({ length: patches * width }, (_, i) => Math.sin(i * 0.37) * 1.5)
      const { image_features: features } = await vision!.run({
        pixel_values: floatTensor(pixels, [patches, width]),
        image_grid_thw: int64Tensor(grids.flat(), [grids.length, 3])
      })
      const hidden = fixture.config.text.hiddenSize
      expect(features!.dims).toEqual([patches / 4, hidden])
      expectClose(features, referenceQwen3VLVisionFeatures(weights.vision, pixels, grids), "image_features")

      // The second image alone gives the rows it gave beside the others.
      const alone = await vision!.run({
        pixel_values: floatTensor(pixels.subarray(40 * width, 56 * width), [16, width]),
        image_grid_thw: int64Tensor([2, 4, 2], [1, 3])
      })
      expectClose(alone.image_features, numbers(features).subarray(10 * hidden, 14 * hidden), "second image alone")
    } finally {
      await vision!.release()
    }
  })

  it("decodes with interleaved M-RoPE and q/k norms as the reference does, and the same with the cache as without", async () => {
    const processor = await AutoProcessor.from_pretrained(offline(modelDir))
    const prompt = processor.apply_chat_template(
      [{ role: "user", content: [{ type: "image" }, { type: "text", text: "What is in this image" }] }],
      { add_generation_prompt: true }
    ) as string
    const inputs = await processor(prompt, await image(150, 70))
    const promptIds = ids(inputs.input_ids)
    const grid = ids(inputs.image_grid_thw) as unknown as GridThw
    const pixelValues = (inputs.pixel_values as Tensor).data as Float32Array
    const { hiddenSize: hidden, vocabSize, layers, kvHeads, headDim } = fixture.config.text

    const [vision, embed, decoder] = await sessions()
    try {
      const { image_features: features } = await vision!.run({
        pixel_values: floatTensor(pixelValues, (inputs.pixel_values as Tensor).dims),
        image_grid_thw: int64Tensor(grid, [1, 3])
      })
      expectClose(
        features,
        referenceQwen3VLVisionFeatures(weights.vision, pixelValues, [grid]),
        "the processor's patches"
      )

      const { inputs_embeds: textEmbeds } = await embed!.run({
        input_ids: int64Tensor(promptIds, [1, promptIds.length])
      })
      const embeds = Float32Array.from(numbers(textEmbeds))
      const featureData = numbers(features)
      let row = 0
      promptIds.forEach((id, i) => {
        if (id === imagePad()) embeds.set(featureData.subarray(row++ * hidden, row * hidden), i * hidden)
      })
      expect(row).toBe((grid[0] * grid[1] * grid[2]) / 4)

      const { positions } = mropePositions(promptIds, pads(), { images: [grid], videos: [] }, 2)
      const length = promptIds.length
      const emptyCache = Object.fromEntries(
        Array.from({ length: layers }, (_, i) =>
          ["key", "value"].map((kind) => [
            `past_key_values.${i}.${kind}`,
            floatTensor(new Float32Array(0), [1, kvHeads, 0, headDim])
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
      expectClose(whole.logits, referenceQwen3VLLogits(weights.text, Float64Array.from(embeds), axes), "logits")

      // The prompt less its last three tokens, then those one at a time through the cache.
      const present = (outputs: ort.InferenceSession.OnnxValueMapType) =>
        Object.fromEntries(
          Object.entries(outputs)
            .filter(([name]) => name.startsWith("present."))
            .map(([name, value]) => [name.replace("present.", "past_key_values."), value as ort.Tensor])
        )
      let outputs = await run(0, length - 3, emptyCache)
      for (let at = length - 3; at < length; at++) outputs = await run(at, at + 1, present(outputs))
      expectClose(
        outputs.logits,
        numbers(whole.logits).subarray((length - 1) * vocabSize),
        "last logits through the cache"
      )
    } finally {
      await Promise.all([vision, embed, decoder].map((s) => s!.release()))
    }
  })

  it("transformers.js's Qwen3VLForConditionalGeneration generates on it the tokens the reference computation gives", async () => {
    const name = offline(modelDir)
    const processor = await AutoProcessor.from_pretrained(name)
    const model = await AutoModelForImageTextToText.from_pretrained(name, { dtype: "fp32" })
    expect(model.constructor.name).toBe("Qwen3VLForConditionalGeneration")
    const steps = 6
    try {
      const imagePrompt = processor.apply_chat_template(
        [{ role: "user", content: [{ type: "image" }, { type: "text", text: "What is in this image" }] }],
        { add_generation_prompt: true }
      ) as string
      expect(imagePrompt).toBe(
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is in this image<|im_end|>\n<|im_start|>assistant\n"
      )
      for (const [width, height] of [
        [150, 70],
        [40, 100]
      ] as const) {
        const inputs = await processor(imagePrompt, await image(width, height))
        const grid = ids(inputs.image_grid_thw) as unknown as GridThw
        const prompt = ids(inputs.input_ids)
        const output = (await model.generate({
          ...inputs,
          max_new_tokens: steps,
          do_sample: false
        })) as Tensor
        const generated = ids(output).slice(prompt.length)
        const features = referenceQwen3VLVisionFeatures(
          weights.vision,
          (inputs.pixel_values as Tensor).data as Float32Array,
          [grid]
        )
        const rope = mropePositions(prompt, pads(), { images: [grid], videos: [] }, 2)
        expect(generated, `${width}×${height}`).toEqual(
          untilEos(
            referenceQwen3VLGreedy(weights.text, prompt, imagePad(), features, rope.positions, rope.delta, steps)
          )
        )
        expect(new Set(generated).size).toBeGreaterThan(1)
      }

      // Text only: transformers.js 4.3.1 gives decoded tokens the delta max + 1 + length where
      // transformers (Python) gives 0 (see qwen2vlGraphs.test.ts). Its tokens are the reference's
      // at its delta; its first token, at the prompt's own positions, is the reference's at either.
      const textPrompt = processor.apply_chat_template([{ role: "user", content: [{ type: "text", text: "Hello" }] }], {
        add_generation_prompt: true
      }) as string
      const textInputs = await processor(textPrompt)
      const textIds = ids(textInputs.input_ids)
      const textOutput = (await model.generate({
        ...textInputs,
        max_new_tokens: steps,
        do_sample: false
      })) as Tensor
      const textGenerated = ids(textOutput).slice(textIds.length)
      const { positions, delta } = mropePositions(textIds, pads(), { images: [], videos: [] }, 2)
      expect(delta).toBe(0)
      const none = new Float64Array(0)
      expect(textGenerated).toEqual(
        untilEos(referenceQwen3VLGreedy(weights.text, textIds, imagePad(), none, positions, 2 * textIds.length, steps))
      )
      expect(textGenerated[0]).toBe(referenceQwen3VLGreedy(weights.text, textIds, imagePad(), none, positions, 0, 1)[0])
    } finally {
      await model.dispose()
    }
  })
})
