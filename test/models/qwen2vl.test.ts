import { AutoProcessor, env, Qwen2VLImageProcessor, RawImage, type Tensor } from "@huggingface/transformers"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { basename, dirname, join } from "node:path"
import sharp from "sharp"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { InvalidProcessorConfig } from "../../src/models/Idefics3Processor.js"
import type { RgbImage } from "../../src/models/ImageProcessor.js"
import { mropePositions, VisionTokenMismatch } from "../../src/models/MRope.js"
import {
  ExtremeAspectRatio,
  expandVisionPads,
  type GridThw,
  qwen2VLImageInputs,
  qwen2VLProcessor,
  qwen2VLVideoInputs,
  sampleVideoFrames,
  smartResize,
  VisionPlaceholderMismatch,
  type Qwen2VLVisionInputs
} from "../../src/models/Qwen2VLProcessor.js"
import {
  qwen2VLPreprocessorConfig,
  qwen2VLPreprocessorConfigSpelledOut,
  qwen2VLTokens,
  referenceRopeIndex
} from "./support/Qwen2VLReference.js"
import { writeTokenizerModel } from "./support/tokenizerModels.js"

env.allowRemoteModels = false

/** Seeded 8-bit noise. */
const noise = (length: number, seed: number): Uint8Array => {
  const data = new Uint8Array(length)
  let state = seed
  for (let i = 0; i < length; i++) {
    state = (state * 1103515245 + 12345) >>> 0
    data[i] = state >>> 24
  }
  return data
}

const gradient = (width: number, height: number): RgbImage => {
  const data = new Uint8Array(width * height * 3)
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const i = (y * width + x) * 3
      data[i] = Math.round((255 * x) / (width - 1))
      data[i + 1] = Math.round((255 * y) / (height - 1))
      data[i + 2] = (x * 7 + y * 3) % 256
    }
  }
  return { data, width, height }
}

const encodePng = async (data: Uint8Array, width: number, height: number, channels: 1 | 3 | 4) =>
  new Uint8Array(await sharp(data, { raw: { width, height, channels } }).png().toBuffer())

let root: string

/** transformers.js's processor (Qwen2VLProcessor: the Qwen3 tokenizer, whose vision tokens have Qwen2-VL's ids), offline. */
const referenceProcessor = async () => {
  const dir = await writeTokenizerModel(root, "qwen2-vl", "qwen3", {
    files: { "preprocessor_config.json": JSON.stringify(qwen2VLPreprocessorConfigSpelledOut) }
  })
  env.localModelPath = dirname(dir)
  return AutoProcessor.from_pretrained(basename(dir))
}
let reference: Awaited<ReturnType<typeof referenceProcessor>>

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "qwen2vl-"))
  reference = await referenceProcessor()
})

afterAll(async () => {
  await rm(root, { recursive: true, force: true })
})

const processor = qwen2VLProcessor(qwen2VLPreprocessorConfig)

const expectSameInputs = (ours: Qwen2VLVisionInputs, theirs: Record<string, Tensor>) => {
  const grid = Array.from(theirs.image_grid_thw!.data as BigInt64Array, Number)
  expect(ours.grid).toEqual(grid)
  expect(theirs.pixel_values!.dims).toEqual([grid[0]! * grid[1]! * grid[2]!, ours.patchDim])
  const expected = theirs.pixel_values!.data as Float32Array
  expect(ours.pixelValues.length).toBe(expected.length)
  let worst = 0
  for (let i = 0; i < expected.length; i++) worst = Math.max(worst, Math.abs(ours.pixelValues[i]! - expected[i]!))
  expect(worst).toBeLessThanOrEqual(1e-5)
}

describe("smartResize, against transformers.js", () => {
  const theirs = (height: number, width: number, minPixels: number, maxPixels: number) => {
    const imageProcessor = new Qwen2VLImageProcessor({
      ...qwen2VLPreprocessorConfigSpelledOut,
      min_pixels: minPixels,
      max_pixels: maxPixels
    })
    try {
      const [w, h] = imageProcessor.get_resize_output_image_size({ height, width } as RawImage, {}) as [number, number]
      return { height: h, width: w }
    } catch (error) {
      expect((error as Error).message).toMatch(/^absolute aspect ratio must be smaller than 200/)
      return "refused"
    }
  }
  const ours = (height: number, width: number, minPixels: number, maxPixels: number) => {
    try {
      return smartResize(height, width, 28, minPixels, maxPixels)
    } catch (error) {
      expect(error).toBeInstanceOf(ExtremeAspectRatio)
      expect((error as Error).message).toContain("at most 200")
      return "refused"
    }
  }
  const { min_pixels: min, max_pixels: max } = qwen2VLPreprocessorConfig
  const table: ReadonlyArray<readonly [height: number, width: number, minPixels: number, maxPixels: number]> = [
    [1, 1, min, max],
    [7, 10, min, max],
    [27, 27, min, max],
    [28, 28, min, max],
    [140, 200, min, max],
    [91, 37, min, max],
    [70, 70, min, max],
    [42, 126, min, max],
    [3000, 4000, min, max],
    [10000, 10000, min, max],
    [3584, 3584, min, max],
    [28, 5600, min, max],
    [28, 5601, min, max],
    [5601, 28, min, max],
    [1, 150, min, max],
    [1, 300, min, max],
    [3, 1000, min, max],
    [140, 200, 256 * 28 * 28, 1280 * 28 * 28],
    [1080, 1920, 256 * 28 * 28, 1280 * 28 * 28],
    [1080, 1920, min, 28 * 28],
    [20, 4000, min, 28 * 28 * 4],
    [500, 400, 1000 * 28 * 28, 2000 * 28 * 28]
  ]

  it("gives transformers.js's size for tiny, huge and extreme images, and for per-request bounds", () => {
    for (const [height, width, minPixels, maxPixels] of table) {
      expect(ours(height, width, minPixels, maxPixels), `${height}×${width}`).toEqual(
        theirs(height, width, minPixels, maxPixels)
      )
    }
  })

  it("gives transformers.js's size over a sweep of random sizes and bounds", () => {
    const random = noise(4 * 600, 11)
    for (let i = 0; i < 600; i++) {
      const height = 1 + random[4 * i]! * 17 + random[4 * i + 1]!
      const width = 1 + random[4 * i + 2]! * 17 + random[4 * i + 1]!
      const minPixels = 28 * 28 * (1 + (random[4 * i + 3]! % 64))
      const maxPixels = minPixels + 28 * 28 * random[4 * i]! * 8
      expect(ours(height, width, minPixels, maxPixels), `${height}×${width}`).toEqual(
        theirs(height, width, minPixels, maxPixels)
      )
    }
  })

  it("keeps both edges multiples of the factor and the area within the bounds", () => {
    const size = smartResize(1080, 1920, 28, 256 * 28 * 28, 1280 * 28 * 28)
    expect(size.height % 28).toBe(0)
    expect(size.width % 28).toBe(0)
    expect(size.height * size.width).toBeLessThanOrEqual(1280 * 28 * 28)
    expect(size.height * size.width).toBeGreaterThanOrEqual(256 * 28 * 28)
  })
})

describe("Qwen2-VL image patches, against transformers.js", () => {
  const cases: ReadonlyArray<{ name: string; image: () => Promise<Uint8Array> | RgbImage }> = [
    { name: "a 200×140 gradient (PNG)", image: () => encodePng(gradient(200, 140).data, 200, 140, 3) },
    { name: "a 37×91 noise image (PNG)", image: () => encodePng(noise(37 * 91 * 3, 1), 37, 91, 3) },
    { name: "a 64×50 grayscale image (PNG)", image: () => encodePng(noise(64 * 50, 2), 64, 50, 1) },
    { name: "a 45×33 image with alpha (PNG)", image: () => encodePng(noise(45 * 33 * 4, 3), 45, 33, 4) },
    { name: "a 10×7 image, scaled up (PNG)", image: () => encodePng(noise(10 * 7 * 3, 4), 10, 7, 3) },
    {
      name: "a 56×84 image at its size (raw RGB)",
      image: () => ({ data: noise(56 * 84 * 3, 5), width: 56, height: 84 })
    },
    { name: "a 123×77 image (raw RGB)", image: () => ({ data: noise(123 * 77 * 3, 6), width: 123, height: 77 }) }
  ]

  for (const { name, image } of cases) {
    it(`gives transformers.js's pixel_values and image_grid_thw: ${name}`, async () => {
      const input = await image()
      const raw =
        input instanceof Uint8Array
          ? await RawImage.fromBlob(new Blob([input]))
          : new RawImage(new Uint8ClampedArray(input.data), input.width, input.height, 3)
      const theirs = (await reference.image_processor!(raw)) as Record<string, Tensor>
      expectSameInputs(await qwen2VLImageInputs(processor, input), theirs)
    })
  }

  it("follows per-request min_pixels and max_pixels as transformers.js's processor with those bounds", async () => {
    const image = gradient(200, 140)
    const bounds = { minPixels: 28 * 28, maxPixels: 28 * 28 * 6 }
    const theirs = (await new Qwen2VLImageProcessor({
      ...qwen2VLPreprocessorConfigSpelledOut,
      min_pixels: bounds.minPixels,
      max_pixels: bounds.maxPixels
    })(new RawImage(new Uint8ClampedArray(image.data), 200, 140, 3))) as Record<string, Tensor>
    const ours = await qwen2VLImageInputs(processor, image, bounds)
    expect(ours.grid).toEqual([1, 4, 4])
    expectSameInputs(ours, theirs)
  })

  for (const resample of [0, 1, 2] as const) {
    it(`resizes with the resample kernel the config names as transformers.js does (${resample})`, async () => {
      const config = { ...qwen2VLPreprocessorConfigSpelledOut, resample }
      const image = { data: noise(61 * 47 * 3, 7 + resample), width: 61, height: 47 }
      const theirs = (await new Qwen2VLImageProcessor(config)(
        new RawImage(new Uint8ClampedArray(image.data), image.width, image.height, 3)
      )) as Record<string, Tensor>
      expectSameInputs(await qwen2VLImageInputs(qwen2VLProcessor(config), image), theirs)
    })
  }
})

describe("Qwen2-VL preprocessor config", () => {
  it("takes transformers' defaults for the steps a config leaves out", () => {
    expect(processor).toEqual(qwen2VLProcessor(qwen2VLPreprocessorConfigSpelledOut))
    expect(processor.minPixels).toBe(3136)
    expect(processor.maxPixels).toBe(12845056)
  })

  it("reads the area bounds from size in newer configs, min_pixels and max_pixels first", () => {
    const { min_pixels: _min, max_pixels: _max, ...rest } = qwen2VLPreprocessorConfig
    const sized = qwen2VLProcessor({ ...rest, size: { shortest_edge: 1000, longest_edge: 2000 } })
    expect([sized.minPixels, sized.maxPixels]).toEqual([1000, 2000])
    const both = qwen2VLProcessor({ ...qwen2VLPreprocessorConfig, size: { shortest_edge: 1000, longest_edge: 2000 } })
    expect([both.minPixels, both.maxPixels]).toEqual([3136, 12845056])
  })

  it("refuses a config it cannot follow, naming the field", () => {
    expect(() => qwen2VLProcessor({ ...qwen2VLPreprocessorConfig, min_pixels: 10000, max_pixels: 100 })).toThrow(
      InvalidProcessorConfig
    )
    expect(() => qwen2VLProcessor({ ...qwen2VLPreprocessorConfig, do_resize: false })).toThrow(/do_resize/)
    expect(() => qwen2VLProcessor({ ...qwen2VLPreprocessorConfig, patch_size: 0 })).toThrow(/patch_size/)
  })

  it("refuses an image whose aspect ratio is over 200 with a clear error", async () => {
    const image = { data: new Uint8Array(2 * 500 * 3), width: 500, height: 2 }
    await expect(qwen2VLImageInputs(processor, image)).rejects.toThrow(
      "an image of 500×2 pixels has an aspect ratio of 250.0; Qwen2-VL takes at most 200"
    )
  })
})

describe("Qwen2-VL video patches, from first principles", () => {
  /** Frame f's pixel at (y, x) is (f·10, y, x): each value says where it came from. */
  const frame = (f: number, width: number, height: number): RgbImage => {
    const data = new Uint8Array(width * height * 3)
    for (let y = 0; y < height; y++) {
      for (let x = 0; x < width; x++) data.set([f * 10, y, x], (y * width + x) * 3)
    }
    return { data, width, height }
  }
  const unnormalized = qwen2VLProcessor({ ...qwen2VLPreprocessorConfig, do_rescale: false, do_normalize: false })

  it("repeats the last frame to fill the temporal patch and lays the patches out merge block by merge block", async () => {
    const [width, height, patch, merge, temporal] = [84, 56, 14, 2, 2]
    const clip = [0, 1, 2, 3, 4].map((f) => frame(f, width, height))
    const video = await qwen2VLVideoInputs(unnormalized, clip)
    expect(video.grid).toEqual([3, 4, 6])
    expect(video.patchDim).toBe(3 * temporal * patch * patch)
    expect(video.pixelValues.length).toBe(3 * 4 * 6 * video.patchDim)
    const [blockRows, blockCols] = [4 / merge, 6 / merge]
    for (let row = 0; row < 3 * 4 * 6; row++) {
      // A row is (t, block row, block column, row in block, column in block), in that order.
      const t = Math.floor(row / (blockRows * blockCols * merge * merge))
      const block = Math.floor(row / (merge * merge)) % (blockRows * blockCols)
      const inBlock = row % (merge * merge)
      const patchRow = Math.floor(block / blockCols) * merge + Math.floor(inBlock / merge)
      const patchCol = (block % blockCols) * merge + (inBlock % merge)
      for (let column = 0; column < video.patchDim; column++) {
        // A column is (channel, frame in the temporal patch, y, x).
        const channel = Math.floor(column / (temporal * patch * patch))
        const f = Math.min(t * temporal + (Math.floor(column / (patch * patch)) % temporal), 4)
        const y = patchRow * patch + (Math.floor(column / patch) % patch)
        const x = patchCol * patch + (column % patch)
        const expected = [f * 10, y, x][channel]
        const actual = video.pixelValues[row * video.patchDim + column]
        if (actual !== expected) expect({ row, column, actual }).toEqual({ row, column, actual: expected })
      }
    }
    // The last temporal patch holds frame 4 twice: the clip's last frame, repeated.
    const lastRow = video.pixelValues.subarray((3 * 4 * 6 - 1) * video.patchDim, 3 * 4 * 6 * video.patchDim)
    expect([lastRow[0], lastRow[patch * patch]]).toEqual([40, 40])
  })

  it("normalizes each value as the image processor does", async () => {
    const video = await qwen2VLVideoInputs(processor, [frame(3, 56, 56), frame(4, 56, 56)])
    expect(video.grid).toEqual([1, 4, 4])
    // Row 0 is the top-left patch; its first column is the red of frame 3 at (0, 0), 30.
    const mean = qwen2VLPreprocessorConfig.image_mean
    const std = qwen2VLPreprocessorConfig.image_std
    expect(video.pixelValues[0]).toBeCloseTo((30 / 255 - mean[0]) / std[0], 6)
    // Column 14·14 is the same pixel of frame 4; the green plane starts at 2·14·14 (y = 0).
    expect(video.pixelValues[14 * 14]).toBeCloseTo((40 / 255 - mean[0]) / std[0], 6)
    expect(video.pixelValues[2 * 14 * 14]).toBeCloseTo((0 - mean[1]) / std[1], 6)
  })

  it("resizes every frame to smart_resize of the first, as an image of that frame is resized", async () => {
    const first = { data: noise(100 * 60 * 3, 9), width: 100, height: 60 }
    const video = await qwen2VLVideoInputs(processor, [first, first, first, first], { maxPixels: 28 * 28 * 4 })
    const image = await qwen2VLImageInputs(processor, first, { maxPixels: 28 * 28 * 4 })
    expect(image.grid).toEqual([1, 2, 4])
    expect(video.grid).toEqual([2, 2, 4])
    expect(video.pixelValues.subarray(0, image.pixelValues.length)).toEqual(image.pixelValues)
    expect(video.pixelValues.subarray(image.pixelValues.length)).toEqual(image.pixelValues)
  })

  it("samples frames at the model's fps within the frame budget, in whole temporal patches", () => {
    const sample = (totalFrames: number, videoFps: number, sampling = {}) =>
      sampleVideoFrames(processor, { totalFrames, videoFps }, sampling)
    // 10 s at 30 fps, sampled at 2 fps: 20 frames, every 15th.
    expect(sample(300, 30)).toEqual(Array.from({ length: 20 }, (_, i) => i * 15))
    // A budget of 9 frames keeps 8 (whole temporal patches), spread over the whole clip.
    expect(sample(300, 30, { maxFrames: 9 })).toEqual([0, 37, 75, 112, 150, 187, 225, 262])
    // A request's own fps.
    expect(sample(300, 30, { fps: 1 })).toEqual(Array.from({ length: 10 }, (_, i) => i * 30))
    // Short clips: at least min_frames (4), never more than the clip has, whole patches.
    expect(sample(5, 30)).toEqual([0, 1, 2, 3])
    expect(sample(3, 30)).toEqual([0, 1])
    expect(sample(7, 1)).toEqual([0, 1, 2, 3, 4, 5])
    // Under one temporal patch: the frame there is, which the patcher repeats.
    expect(sample(1, 30)).toEqual([0])
  })
})

describe("Qwen2-VL pad tokens", () => {
  const pads = { imagePad: qwen2VLTokens.imagePad, videoPad: qwen2VLTokens.videoPad }
  const { visionStart: vs, visionEnd: ve, imagePad: ip, videoPad: vp } = qwen2VLTokens

  it("expands <|image_pad|> as transformers.js's Qwen2VLProcessor does", async () => {
    const text = "Describe <|vision_start|><|image_pad|><|vision_end|> in detail."
    const image = gradient(200, 140)
    const theirs = (await reference(text, new RawImage(new Uint8ClampedArray(image.data), 200, 140, 3))) as Record<
      string,
      Tensor
    >
    const prompt = Array.from((reference.tokenizer!(text).input_ids as Tensor).data as BigInt64Array, Number)
    const ours = await qwen2VLImageInputs(processor, image)
    const expanded = expandVisionPads(prompt, pads, { images: [ours.grid], videos: [] }, 2)
    expect(expanded).toEqual(Array.from(theirs.input_ids!.data as BigInt64Array, Number))
    expect(expanded.filter((id) => id === ip)).toHaveLength((14 * 10) / 4)
  })

  it("expands images and videos in order, each by its grid ÷ merge²", () => {
    const grids = {
      images: [
        [1, 4, 6],
        [1, 2, 2]
      ] as Array<GridThw>,
      videos: [[3, 2, 4]] as Array<GridThw>
    }
    expect(expandVisionPads([5, vs, ip, ve, vs, vp, ve, vs, ip, ve, 6], pads, grids, 2)).toEqual([
      5,
      vs,
      ...Array(6).fill(ip),
      ve,
      vs,
      ...Array(6).fill(vp),
      ve,
      vs,
      ip,
      ve,
      6
    ])
  })

  it("refuses a prompt whose placeholders do not match its images", () => {
    const grids = { images: [[1, 4, 6]] as Array<GridThw>, videos: [] }
    expect(() => expandVisionPads([vs, ip, ve, vs, ip, ve], pads, grids, 2)).toThrow(VisionPlaceholderMismatch)
    expect(() => expandVisionPads([vs, ip, ve, vs, ip, ve], pads, grids, 2)).toThrow(
      "the prompt has 2 <|image_pad|> placeholder(s) for 1 image(s)"
    )
    expect(() => expandVisionPads([vs, vp, ve], pads, grids, 2)).toThrow(VisionPlaceholderMismatch)
  })
})

describe("M-RoPE positions, against transformers.js's get_rope_index", () => {
  const pads = { imagePad: qwen2VLTokens.imagePad, videoPad: qwen2VLTokens.videoPad }
  const { visionStart: vs, visionEnd: ve, imagePad: ip, videoPad: vp } = qwen2VLTokens
  const text = (n: number, from: number) => Array.from({ length: n }, (_, i) => from + i)

  const prompts: ReadonlyArray<{
    name: string
    ids: Array<number>
    images: Array<GridThw>
    videos: Array<GridThw>
  }> = [
    {
      name: "text, an image, text, an image of another grid, text",
      ids: [
        ...text(5, 100),
        vs,
        ...Array(6).fill(ip),
        ve,
        ...text(3, 200),
        vs,
        ...Array(10).fill(ip),
        ve,
        ...text(4, 300)
      ],
      images: [
        [1, 4, 6],
        [1, 10, 4]
      ],
      videos: []
    },
    {
      name: "a video, then an image, nothing after",
      ids: [...text(2, 100), vs, ...Array(3 * 2 * 4).fill(vp), ve, vs, ...Array(4).fill(ip), ve],
      images: [[1, 4, 4]],
      videos: [[3, 4, 8]]
    },
    {
      name: "an image first",
      ids: [vs, ...Array(2).fill(ip), ve, ...text(3, 100)],
      images: [[1, 2, 4]],
      videos: []
    }
  ]

  for (const { name, ids, images, videos } of prompts) {
    it(`gives transformers.js's position_ids and rope delta: ${name}`, () => {
      const ours = mropePositions(ids, pads, { images, videos }, 2)
      const theirs = referenceRopeIndex(ids, { images, videos })
      expect(Array.from(ours.positions)).toEqual(theirs.positions)
      expect(ours.delta).toBe(theirs.delta)
    })
  }

  it("places an image's tokens on its merged grid, after the text before it", () => {
    const ids = [...text(5, 100), vs, ...Array(6).fill(ip), ve, 7]
    const { positions, delta } = mropePositions(ids, pads, { images: [[1, 4, 6]], videos: [] }, 2)
    const axis = (a: number) => Array.from(positions.subarray(a * ids.length, (a + 1) * ids.length))
    // vs is at 5; the 2×3 blocks start at 6; ve and the text after go on from 6 + 3.
    expect(axis(0)).toEqual([0, 1, 2, 3, 4, 5, 6, 6, 6, 6, 6, 6, 9, 10])
    expect(axis(1)).toEqual([0, 1, 2, 3, 4, 5, 6, 6, 6, 7, 7, 7, 9, 10])
    expect(axis(2)).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8, 6, 7, 8, 9, 10])
    expect(delta).toBe(11 - ids.length)
  })

  it("gives text-only prompts 0, 1, 2, ... on every axis and a delta of 0, as transformers (Python) does", () => {
    const ids = text(12, 100)
    const ours = mropePositions(ids, pads, { images: [], videos: [] }, 2)
    const theirs = referenceRopeIndex(ids, { images: [], videos: [] })
    expect(Array.from(ours.positions)).toEqual(theirs.positions)
    expect(ours.delta).toBe(0)
    // transformers.js 4.3.1's text-only path adds the sequence length where transformers subtracts it.
    expect(theirs.delta).toBe(2 * ids.length)
  })

  it("refuses pads that do not match the grids", () => {
    const grid = { images: [[1, 4, 6]] as Array<GridThw>, videos: [] }
    expect(() => mropePositions([vs, ...Array(5).fill(ip), ve], pads, grid, 2)).toThrow(VisionTokenMismatch)
    expect(() => mropePositions([vs, ...Array(5).fill(ip), ve], pads, grid, 2)).toThrow(
      "the prompt has 5 <|image_pad|> token(s) where its images' grids take 6"
    )
    expect(() => mropePositions([vs, ...Array(3).fill(ip), ve, ...Array(3).fill(ip)], pads, grid, 2)).toThrow(
      "the prompt's <|image_pad|> tokens are not in runs of its images' sizes"
    )
    expect(() => mropePositions([vs, ve], pads, grid, 2)).toThrow(VisionTokenMismatch)
  })
})
