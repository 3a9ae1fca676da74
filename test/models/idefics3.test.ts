import { AutoProcessor, env, type Message, RawImage, type Tensor } from "@huggingface/transformers"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { basename, dirname, join } from "node:path"
import * as ort from "onnxruntime-node"
import sharp from "sharp"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  expandIdefics3Prompt,
  type Idefics3PixelInputs,
  idefics3PixelInputs,
  ImagePlaceholderMismatch,
  InvalidProcessorConfig,
  idefics3Processor,
  loadIdefics3Processor
} from "../../src/models/Idefics3Processor.js"
import type { RgbImage } from "../../src/models/ImageProcessor.js"
import { loadModelDirectory } from "../../src/models/ModelDirectory.js"
import { type ChatMessage, ChatTokenizer } from "../../src/models/Tokenizer.js"
import {
  type SmolVlmFixtureOptions,
  smolVlm256mGeometry,
  smolVlmFixture,
  writeModelFiles
} from "./support/SmolVlmFixture.js"

env.allowRemoteModels = false

/** An RGB test image: gradients, stripes and a seeded speckle, so that every resize shows. */
const testImage = (width: number, height: number, seed: number): RgbImage => {
  const data = new Uint8Array(width * height * 3)
  let state = seed
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      state = (state * 1103515245 + 12345) >>> 0
      const i = (y * width + x) * 3
      data[i] = Math.round((255 * x) / Math.max(1, width - 1))
      data[i + 1] = (x + y) % 7 < 3 ? 230 : 20
      data[i + 2] = (state >>> 24) & 0xff
    }
  }
  return { data, width, height }
}

const png = async (image: RgbImage): Promise<Uint8Array> =>
  new Uint8Array(
    await sharp(image.data, { raw: { width: image.width, height: image.height, channels: 3 } })
      .png()
      .toBuffer()
  )

/** The same image as transformers.js reads it: raw RGB as a RawImage, encoded bytes through its own decoder. */
const rawImage = (image: RgbImage | Uint8Array): Promise<RawImage> =>
  image instanceof Uint8Array
    ? RawImage.fromBlob(new Blob([image]))
    : Promise.resolve(new RawImage(new Uint8ClampedArray(image.data), image.width, image.height, 3))

let root: string
let directories = 0

const modelDirectory = async (options: SmolVlmFixtureOptions = {}) => {
  const fixture = smolVlmFixture(options)
  const dir = join(root, `smolvlm-${directories++}`)
  await writeModelFiles(dir, fixture.files)
  return { dir, fixture }
}

/** transformers.js's processor for a directory under the temporary root, offline. */
const referenceProcessor = async (dir: string) => {
  env.localModelPath = dirname(dir)
  const processor = await AutoProcessor.from_pretrained(basename(dir))
  const imageProcessor = processor.image_processor
  if (imageProcessor === undefined) throw new Error("transformers.js loaded no image processor")
  return { processor, imageProcessor }
}

const expectTensorClose = (actual: ArrayLike<number>, expected: Tensor, dims: ReadonlyArray<number>) => {
  expect(expected.dims).toEqual(dims)
  const reference = expected.data as ArrayLike<number>
  expect(actual.length).toBe(reference.length)
  let worst = 0
  for (let i = 0; i < reference.length; i++) worst = Math.max(worst, Math.abs(actual[i]! - Number(reference[i])))
  expect(worst).toBeLessThanOrEqual(1e-5)
}

const expectSamePixels = (ours: Idefics3PixelInputs, reference: Record<string, Tensor>) => {
  const { batch, frames, tile } = ours
  expectTensorClose(ours.pixelValues, reference.pixel_values!, [batch, frames, 3, tile, tile])
  expectTensorClose(ours.pixelAttentionMask, reference.pixel_attention_mask!, [batch, frames, tile, tile])
}

const ids = (tensor: Tensor | undefined): Array<number> => Array.from(tensor!.data as BigInt64Array, Number)

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "idefics3-"))
})

afterAll(async () => {
  await rm(root, { recursive: true, force: true })
})

describe("Idefics3 image processor, against transformers.js", () => {
  const cases: ReadonlyArray<{ name: string; image: RgbImage; splitting?: boolean }> = [
    { name: "small (upscaled, split)", image: testImage(10, 7, 1) },
    { name: "large non-square", image: testImage(300, 200, 2) },
    { name: "wide", image: testImage(200, 20, 3) },
    { name: "tall", image: testImage(15, 90, 4) },
    { name: "1×1", image: testImage(1, 1, 5) },
    { name: "square", image: testImage(64, 64, 6) },
    { name: "without splitting", image: testImage(120, 50, 7), splitting: false },
    { name: "1×1 without splitting", image: testImage(1, 1, 8), splitting: false }
  ]

  for (const { name, image, splitting } of cases) {
    it(`gives transformers.js's pixel_values and pixel_attention_mask: ${name}`, async () => {
      const { dir } = await modelDirectory(splitting === undefined ? {} : { doImageSplitting: splitting })
      const processor = await loadIdefics3Processor(dir)
      const { imageProcessor: reference } = await referenceProcessor(dir)
      const ours = await idefics3PixelInputs(processor.image, [[image]])
      const theirs = await reference(await rawImage(image), { return_row_col_info: true })
      expectSamePixels(ours, theirs)
      expect(ours.rows).toEqual(theirs.rows)
      expect(ours.cols).toEqual(theirs.cols)
    })
  }

  it("reads encoded images (PNG with alpha, grayscale JPEG) as transformers.js does", async () => {
    const { dir } = await modelDirectory()
    const processor = await loadIdefics3Processor(dir)
    const { imageProcessor: reference } = await referenceProcessor(dir)
    const rgba = new Uint8Array(
      await sharp(testImage(40, 25, 9).data, { raw: { width: 40, height: 25, channels: 3 } })
        .ensureAlpha(0.5)
        .png()
        .toBuffer()
    )
    const gray = new Uint8Array(
      await sharp(testImage(33, 47, 10).data, { raw: { width: 33, height: 47, channels: 3 } })
        .grayscale()
        .jpeg()
        .toBuffer()
    )
    for (const bytes of [await png(testImage(70, 30, 11)), rgba, gray]) {
      const ours = await idefics3PixelInputs(processor.image, [[bytes]])
      expectSamePixels(ours, await reference(await rawImage(bytes)))
    }
  })

  it("refuses an encoded image over the pixel limit before decoding it", async () => {
    const { dir } = await modelDirectory()
    const processor = await loadIdefics3Processor(dir)
    const bytes = await png(testImage(50, 40, 18))
    await expect(idefics3PixelInputs(processor.image, [[bytes]], { limitInputPixels: 1999 })).rejects.toThrow(
      /pixel limit/
    )
    expect((await idefics3PixelInputs(processor.image, [[bytes]], { limitInputPixels: 2000 })).frames).toBe(17)
  })

  it("follows the resample kernel and an unresized image", async () => {
    for (const overrides of [{ resample: 2 }, { resample: 3 }, { resample: 0 }, { do_resize: false }]) {
      const { dir } = await modelDirectory({ preprocessorOverrides: overrides })
      const processor = await loadIdefics3Processor(dir)
      const { imageProcessor: reference } = await referenceProcessor(dir)
      for (const image of [testImage(45, 29, 12), testImage(32, 32, 13)]) {
        const ours = await idefics3PixelInputs(processor.image, [[image]])
        expectSamePixels(ours, await reference(await rawImage(image), { return_row_col_info: true }))
      }
    }
  })

  it("pads the prompts of a batch to the most frames, with masked zero frames", async () => {
    const { dir } = await modelDirectory()
    const processor = await loadIdefics3Processor(dir)
    const { imageProcessor: reference } = await referenceProcessor(dir)
    const prompts = [[testImage(30, 30, 14)], [testImage(100, 40, 15), testImage(8, 50, 16)]]
    const ours = await idefics3PixelInputs(processor.image, prompts)
    const theirs = await reference(await Promise.all(prompts.map((images) => Promise.all(images.map(rawImage)))))
    expect(ours.batch).toBe(2)
    expectSamePixels(ours, theirs)
    expect(ours.pixelAttentionMask.some((value) => value === 0)).toBe(true)
  })

  it("matches at SmolVLM-256M's own sizes (512-pixel tiles, 2048 longest edge)", async () => {
    const { dir } = await modelDirectory({ geometry: smolVlm256mGeometry })
    const processor = await loadIdefics3Processor(dir)
    expect(processor.imageSeqLen).toBe(64)
    const { imageProcessor: reference } = await referenceProcessor(dir)
    const image = await png(testImage(640, 480, 17))
    const ours = await idefics3PixelInputs(processor.image, [[image]])
    expect(ours.frames).toBe(13)
    expectSamePixels(ours, await reference(await rawImage(image)))
  })
})

describe("Idefics3 prompts, against transformers.js", () => {
  const question = (text: string, images: number): Array<Message & ChatMessage> => [
    {
      role: "user",
      content: [...Array.from({ length: images }, () => ({ type: "image" })), { type: "text", text }]
    }
  ]

  const cases: ReadonlyArray<{ name: string; images: ReadonlyArray<RgbImage>; options?: SmolVlmFixtureOptions }> = [
    { name: "one split image", images: [testImage(90, 60, 20)] },
    { name: "one image, not split", images: [testImage(90, 60, 21)], options: { doImageSplitting: false } },
    {
      name: "an image of one tile, split but not cut (rows = cols = 0)",
      images: [testImage(32, 32, 22)],
      options: { preprocessorOverrides: { do_resize: false } }
    },
    { name: "two images in one prompt", images: [testImage(200, 30, 23), testImage(20, 70, 24)] }
  ]

  for (const { name, images, options } of cases) {
    it(`expands to transformers.js's input_ids: ${name}`, async () => {
      const { dir, fixture } = await modelDirectory(options)
      const model = await loadModelDirectory(dir)
      const tokenizer = new ChatTokenizer(model)
      const processor = await loadIdefics3Processor(dir)
      const messages = question(
        images.length === 1 ? " What is in this image?" : " Compare these two images",
        images.length
      )

      const { processor: reference } = await referenceProcessor(dir)
      const text = reference.apply_chat_template(messages, { add_generation_prompt: true }) as string
      const theirs = await reference(text, await Promise.all(images.map(rawImage)))

      const prompt = tokenizer.applyChatTemplate(messages, { addGenerationPrompt: true })
      expect(prompt).toBe(text)
      const pixels = await idefics3PixelInputs(processor.image, [images])
      const grids = pixels.rows[0]!.map((rows, i) => ({ rows, cols: pixels.cols[0]![i]! }))
      const inputIds = tokenizer.encode(expandIdefics3Prompt(prompt, grids, processor.imageSeqLen))
      expect(inputIds).toEqual(ids(theirs.input_ids))
      expectSamePixels(pixels, theirs)

      const imageTokens = inputIds.filter((id) => id === model.config.image_token_id).length
      expect(imageTokens).toBe(pixels.frames * fixture.imageSeqLen)
    })
  }

  it("refuses a prompt whose placeholders do not match its images", () => {
    expect(() => expandIdefics3Prompt("<image> and <image>", [{ rows: 0, cols: 0 }], 4)).toThrow(
      ImagePlaceholderMismatch
    )
  })
})

describe("the fixture's vision encoder", () => {
  const run = async (
    session: ort.InferenceSession,
    values: ArrayLike<number>,
    mask: ArrayLike<number>,
    dims: ReadonlyArray<number>
  ) => {
    const [batch, frames, , height, width] = dims as [number, number, number, number, number]
    const output = await session.run({
      pixel_values: new ort.Tensor("float32", Float32Array.from(values), dims),
      pixel_attention_mask: new ort.Tensor("bool", Uint8Array.from(mask), [batch, frames, height, width])
    })
    return output.image_features!
  }

  it("takes the community I/O and gives the same image_features for our inputs as for transformers.js's", async () => {
    const { dir, fixture } = await modelDirectory()
    const processor = await loadIdefics3Processor(dir)
    const { imageProcessor: reference } = await referenceProcessor(dir)
    const session = await ort.InferenceSession.create(join(dir, "onnx/vision_encoder.onnx"))
    expect(session.inputNames).toEqual(["pixel_values", "pixel_attention_mask"])
    expect(session.outputNames).toEqual(["image_features"])

    const prompts = [[testImage(60, 40, 30)], [testImage(20, 90, 31), testImage(33, 33, 32)]]
    const ours = await idefics3PixelInputs(processor.image, prompts)
    const theirs = await reference(await Promise.all(prompts.map((images) => Promise.all(images.map(rawImage)))))
    const dims = [ours.batch, ours.frames, 3, ours.tile, ours.tile]
    const fromOurs = await run(session, ours.pixelValues, ours.pixelAttentionMask, dims)
    const fromTheirs = await run(
      session,
      theirs.pixel_values!.data as Float32Array,
      theirs.pixel_attention_mask!.data as Uint8Array,
      theirs.pixel_values!.dims
    )

    // Padding frames are dropped: one row of features per tile and global image.
    const realFrames = ours.rows.flatMap((rows, p) => rows.map((r, i) => r * ours.cols[p]![i]! + 1))
    expect(realFrames.reduce((a, b) => a + b)).toBeLessThan(ours.batch * ours.frames)
    expect(fromOurs.dims).toEqual([realFrames.reduce((a, b) => a + b), fixture.imageSeqLen, fixture.textHidden])
    const a = fromOurs.data as Float32Array
    const b = fromTheirs.data as Float32Array
    expect(b.length).toBe(a.length)
    expect(Math.max(...a.map((value, i) => Math.abs(value - b[i]!)))).toBeLessThanOrEqual(1e-4)

    // Different images give different features.
    const frameSize = fixture.imageSeqLen * fixture.textHidden
    const first = a.subarray(0, frameSize)
    const last = a.subarray(a.length - frameSize)
    expect(Math.max(...first.map((value, i) => Math.abs(value - last[i]!)))).toBeGreaterThan(0.1)
  })
})

describe("Idefics3 processor configs", () => {
  const valid = {
    do_image_splitting: true,
    do_normalize: true,
    image_mean: [0.5, 0.5, 0.5],
    image_std: [0.5, 0.5, 0.5],
    max_image_size: { longest_edge: 512 },
    resample: 1,
    size: { longest_edge: 2048 }
  }
  const refusal = (preprocessorConfig: unknown): InvalidProcessorConfig => {
    try {
      idefics3Processor({ preprocessorConfig, processorConfig: { image_seq_len: 64 } })
    } catch (error) {
      expect(error).toBeInstanceOf(InvalidProcessorConfig)
      return error as InvalidProcessorConfig
    }
    throw new Error("the config was accepted")
  }

  it("accepts SmolVLM-256M-Instruct's config", () => {
    const processor = idefics3Processor({
      preprocessorConfig: valid,
      processorConfig: { image_seq_len: 64 },
      modelConfig: { scale_factor: 4, vision_config: { image_size: 512, patch_size: 16 } }
    })
    expect(processor.imageSeqLen).toBe(64)
    expect(processor.image.size.longest_edge).toBe(2048)
  })

  it("names the file and the field that is missing or of the wrong type", () => {
    const missing = refusal({ ...valid, size: {} })
    expect(missing.field).toBe("size.longest_edge")
    expect(missing.message).toMatch(/^preprocessor_config\.json: size\.longest_edge is missing/)

    const wrongType = refusal({ ...valid, do_image_splitting: "yes" })
    expect(wrongType.field).toBe("do_image_splitting")
    expect(wrongType.message).toContain("preprocessor_config.json")

    const unsupported = refusal({ ...valid, do_center_crop: true })
    expect(unsupported.message).toBe("preprocessor_config.json: do_center_crop is not supported by this processor")

    expect(refusal({ ...valid, image_std: undefined }).field).toBe("image_std")
    expect(refusal({ ...valid, max_image_size: { longest_edge: 512, shortest_edge: 256 } }).message).toBe(
      'preprocessor_config.json: max_image_size.shortest_edge is unexpected, expected: "longest_edge"'
    )
  })

  it("refuses an image_seq_len that config.json's vision geometry contradicts", () => {
    expect(() =>
      idefics3Processor({
        preprocessorConfig: valid,
        processorConfig: { image_seq_len: 81 },
        modelConfig: { scale_factor: 4, vision_config: { image_size: 512, patch_size: 16 } }
      })
    ).toThrow(/processor_config\.json: image_seq_len is 81/)
  })
})
