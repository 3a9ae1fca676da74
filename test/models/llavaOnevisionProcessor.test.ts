import { AutoProcessor, RawImage, type Tensor } from "@huggingface/transformers"
import { mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import sharp from "sharp"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { fixedSizePixelValues } from "../../src/models/FixedSizeImage.js"
import {
  type LlavaOnevisionProcessorConfig,
  llavaOnevisionProcessorConfig
} from "../../src/models/LlavaOnevisionProcessor.js"
import { loadModelDirectory } from "../../src/models/ModelDirectory.js"
import {
  llavaOnevisionPreprocessorConfig,
  randomLlavaOnevision
} from "../../src/models/recipes/RandomLlavaOnevision.js"
import { visionProcessorOf } from "../../src/models/VisionProcessor.js"
import { writeModelFiles } from "./support/SmolVlmFixture.js"
import { offline } from "./support/TransformersJs.js"

/**
 * LLaVA-OneVision's images against transformers.js's LlavaOnevisionImageProcessor (its base
 * ImageProcessor), run offline on the fixture's llava-hf preprocessor_config.json: each image resized
 * to the tower's size whatever its own, bicubic, pixel_values equal to the bit; and the settings read
 * from the model's files, refused where they do not fit.
 */

const fixture = randomLlavaOnevision({ seed: 3 })

/** A ramp with a little noise, so that the bicubic kernel has something to interpolate. */
const png = async (width: number, height: number, channels: 3 | 4, seed: number) => {
  const data = new Uint8Array(width * height * channels)
  let state = seed
  for (let i = 0; i < data.length; i++) {
    state = (state * 1103515245 + 12345) >>> 0
    const x = Math.floor(i / channels) % width
    data[i] = Math.min(255, Math.round((0.8 * 255 * x) / Math.max(1, width - 1) + 0.2 * (state >>> 24)))
  }
  return new Uint8Array(await sharp(data, { raw: { width, height, channels } }).png().toBuffer())
}

describe("LLaVA-OneVision's processor", () => {
  let root: string
  let dir: string
  let config: LlavaOnevisionProcessorConfig

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-llava-processor-"))
    dir = join(root, "llava")
    await writeModelFiles(dir, fixture.files)
    config = llavaOnevisionProcessorConfig(await loadModelDirectory(dir))
  })
  afterAll(() => rm(root, { recursive: true, force: true }))

  it("reads the tower's size, bicubic, its rows and its image token from the model's files", async () => {
    const model = await loadModelDirectory(dir)
    expect(visionProcessorOf(model).kind).toBe("llavaOnevision")
    expect(config).toMatchObject({
      size: { height: 56, width: 56 },
      resample: 3,
      do_normalize: true,
      imageTokens: 16,
      imageTokenId: fixture.tokenId("<image>")
    })
  })

  it("makes transformers.js's pixel_values, to the bit, for images of awkward sizes", async () => {
    const reference = await AutoProcessor.from_pretrained(offline(dir))
    for (const [width, height, channels, seed] of [
      [90, 40, 3, 1],
      [33, 101, 3, 2],
      [5, 9, 3, 3],
      [300, 220, 4, 4],
      [56, 56, 3, 5]
    ] as const) {
      const bytes = await png(width, height, channels, seed)
      const theirs = (
        (await reference(await RawImage.fromBlob(new Blob([bytes])))) as { readonly pixel_values: Tensor }
      ).pixel_values
      const ours = await fixedSizePixelValues(bytes, config)
      expect(ours.shape, `${width}×${height}`).toEqual(theirs.dims)
      const same = new Uint32Array(ours.data.buffer).every(
        (bits, i) => bits === new Uint32Array((theirs.data as Float32Array).buffer)[i]
      )
      expect(same, `${width}×${height}`).toBe(true)
    }
  })

  it("refuses a processor size that is not the tower's, a CLS-dropping strategy, and a missing image token", async () => {
    const raw = JSON.parse(new TextDecoder().decode(fixture.files.get("config.json")!)) as Record<string, unknown>
    const cases = {
      resized: {
        files: {
          "preprocessor_config.json": {
            ...llavaOnevisionPreprocessorConfig(fixture.config),
            size: { height: 112, width: 112 }
          }
        },
        message: /size is 112×112, but vision_config.image_size is 56/
      },
      strategy: {
        files: { "config.json": { ...raw, vision_feature_select_strategy: "default" } },
        message: /vision_feature_select_strategy is "default"/
      },
      token: {
        files: { "config.json": { ...raw, image_token_index: undefined } },
        message: /no image_token_index/
      }
    }
    for (const [name, { files, message }] of Object.entries(cases)) {
      const bad = join(root, name)
      await writeModelFiles(bad, fixture.files)
      for (const [file, content] of Object.entries(files)) await writeFile(join(bad, file), JSON.stringify(content))
      const model = await loadModelDirectory(bad)
      expect(() => llavaOnevisionProcessorConfig(model), name).toThrow(message)
    }
  })
})
