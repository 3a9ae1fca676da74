import { AutoProcessor, RawImage, type Tensor } from "@huggingface/transformers"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import sharp from "sharp"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { loadModelDirectory, type ModelDirectory } from "../../src/models/ModelDirectory.js"
import {
  expandVisionPads,
  type GridThw,
  type Qwen2VLProcessor,
  qwen2VLImageInputs,
  qwen2VLProcessor
} from "../../src/models/Qwen2VLProcessor.js"
import { qwen2VLSpecialTokens } from "../../src/models/recipes/RandomQwen2VL.js"
import { qwen3VLPreprocessorConfig, randomQwen3VLFiles } from "../../src/models/recipes/RandomQwen3VL.js"
import { type ChatMessage, ChatTokenizer } from "../../src/models/Tokenizer.js"
import { visionProcessorOf } from "../../src/models/VisionProcessor.js"
import { writeModelFiles } from "./support/SmolVlmFixture.js"
import { offline } from "./support/TransformersJs.js"

/**
 * Qwen3-VL's images through the platform's Qwen2-VL processor (16-pixel patches, the area bounds
 * in size, mean and std 0.5) against transformers.js's Qwen3VLProcessor, run offline on the
 * recipe's model directory: the same pixel_values, image_grid_thw and expanded input_ids for
 * images wider than tall, under a patch, over the maximum area and of the factor's size exactly.
 */

let root: string
let model: ModelDirectory
let processor: Qwen2VLProcessor
let tokenizer: ChatTokenizer
let reference: Awaited<ReturnType<typeof AutoProcessor.from_pretrained>>
const fixture = randomQwen3VLFiles({ seed: 2 })

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "qwen3vl-processor-"))
  const dir = join(root, "qwen3-vl-tiny")
  await writeModelFiles(dir, fixture.files)
  model = await loadModelDirectory(dir)
  const vision = visionProcessorOf(model)
  if (vision.kind !== "qwen2vl") throw new Error(`a Qwen3-VL's images went to the ${vision.kind} processor`)
  processor = vision.processor
  tokenizer = new ChatTokenizer(model)
  reference = await AutoProcessor.from_pretrained(offline(dir))
})

afterAll(async () => {
  await rm(root, { recursive: true, force: true })
})

/** Seeded noise over a gradient, so that every patch and every resample tap differ. */
const png = async (width: number, height: number, seed: number): Promise<Uint8Array> => {
  const data = new Uint8Array(width * height * 3)
  let state = seed
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      state = (state * 1103515245 + 12345) >>> 0
      const at = (y * width + x) * 3
      data[at] = Math.round((255 * x) / Math.max(1, width - 1))
      data[at + 1] = Math.round((255 * y) / Math.max(1, height - 1))
      data[at + 2] = state >>> 24
    }
  }
  return new Uint8Array(
    await sharp(data, { raw: { width, height, channels: 3 } })
      .png()
      .toBuffer()
  )
}

const rawImage = (bytes: Uint8Array) => RawImage.fromBlob(new Blob([new Uint8Array(bytes)]))
const ids = (tensor: Tensor) => Array.from(tensor.data as BigInt64Array, Number)

/** The factor is 32 (patch 16 × merge 2); the bounds 4 to 24 merged tokens (4,096 to 24,576 pixels). */
const sizes = {
  wide: [150, 40],
  tall: [40, 130],
  "under a patch": [9, 5],
  "over the maximum area": [400, 300],
  "the factor exactly": [64, 96]
} as const

describe("Qwen3-VL's processor, against transformers.js's Qwen3VLProcessor", () => {
  it("reads the recipe's files as Qwen3-VL's: patch 16, the bounds of size, mean and std 0.5, videos refused", () => {
    expect(reference.constructor.name).toBe("Qwen3VLProcessor")
    expect(processor.config.patch_size).toBe(16)
    expect(processor.config.image_mean).toEqual([0.5, 0.5, 0.5])
    expect([processor.minPixels, processor.maxPixels]).toEqual([4096, 24576])
    expect(processor.videoRefusal).toMatch(/^Qwen3-VL models take images here, not videos/)
    // Qwen3-VL's own file names the bounds in size only; they are read from there too.
    const { min_pixels: _, max_pixels: __, ...sizeOnly } = qwen3VLPreprocessorConfig(4096, 24576)
    const fromSize = qwen2VLProcessor(sizeOnly)
    expect([fromSize.minPixels, fromSize.maxPixels]).toEqual([4096, 24576])
  })

  it("takes a Qwen3-VL's images to Qwen2-VL's processor by its model type when the config names no processor, and refuses its videos only", () => {
    const { image_processor_type: _, processor_class: __, ...untyped } = model.preprocessorConfig!
    const vision = visionProcessorOf({ ...model, preprocessorConfig: untyped })
    expect(vision.kind).toBe("qwen2vl")
    expect(vision.kind === "qwen2vl" && vision.processor.videoRefusal).toBe(processor.videoRefusal)
    const qwen25 = visionProcessorOf({ ...model, config: { ...model.config, model_type: "qwen2_5_vl" } })
    expect(qwen25.kind === "qwen2vl" && qwen25.processor.videoRefusal).toBeUndefined()
  })

  for (const [name, [width, height]] of Object.entries(sizes)) {
    it(`gives transformers.js's pixel_values, image_grid_thw and input_ids: ${name} (${width}×${height})`, async () => {
      const bytes = await png(width, height, width * 7 + height)
      const messages: ReadonlyArray<ChatMessage> = [
        { role: "user", content: [{ type: "image" }, { type: "text", text: "What is in this image" }] }
      ]
      const text = reference.apply_chat_template(messages as never, { add_generation_prompt: true }) as string
      const theirs = (await reference(text, await rawImage(bytes))) as Record<string, Tensor>

      const ours = await qwen2VLImageInputs(processor, bytes)
      const grid = ids(theirs.image_grid_thw!) as unknown as GridThw
      expect(ours.grid).toEqual(grid)
      const [, rows, columns] = grid
      expect(rows * 16 * columns * 16).toBeGreaterThanOrEqual(processor.minPixels)
      expect(rows * 16 * columns * 16).toBeLessThanOrEqual(processor.maxPixels)
      expect(theirs.pixel_values!.dims).toEqual([grid[0] * rows * columns, 3 * 2 * 16 * 16])
      const expected = theirs.pixel_values!.data as Float32Array
      expect(ours.pixelValues.length).toBe(expected.length)
      let worst = 0
      for (let i = 0; i < expected.length; i++) worst = Math.max(worst, Math.abs(ours.pixelValues[i]! - expected[i]!))
      expect(worst).toBeLessThanOrEqual(1e-5)

      const prompt = tokenizer.applyChatTemplate(messages, { addGenerationPrompt: true })
      expect(prompt).toBe(text)
      const pads = {
        imagePad: fixture.tokenId(qwen2VLSpecialTokens.imagePad),
        videoPad: fixture.tokenId(qwen2VLSpecialTokens.videoPad)
      }
      const expanded = expandVisionPads(tokenizer.encode(prompt), pads, { images: [ours.grid], videos: [] }, 2)
      expect(expanded).toEqual(ids(theirs.input_ids!))
      expect(expanded.filter((id) => id === pads.imagePad)).toHaveLength((rows * columns) / 4)
    })
  }
})
