import sharp from "sharp"
import { describe, expect, it } from "vitest"
import { image, video } from "../../../../src/executors/common/media/preprocess.js"
import { decodeImageProcessorConfig } from "../../../../src/models/ImageProcessor.js"

/**
 * Preprocessing against values worked out by hand, not by the code under test: images whose
 * resize with PIL's filters has a known answer, then rescaled by 1/255 and normalized with the
 * config's mean and std, channels first.
 */

type Rgb = readonly [number, number, number]

const imageMean = [0.5, 0.4, 0.3] as const
const imageStd = [0.5, 0.25, 0.2] as const

const configOf = (resample: number, width: number, height: number) =>
  decodeImageProcessorConfig({ size: { width, height }, resample, image_mean: imageMean, image_std: imageStd })

const png = async (width: number, height: number, pixel: (x: number, y: number) => Rgb): Promise<Uint8Array> => {
  const raw = Buffer.alloc(width * height * 3)
  for (let y = 0; y < height; y++) for (let x = 0; x < width; x++) raw.set(pixel(x, y), (y * width + x) * 3)
  return new Uint8Array(
    await sharp(raw, { raw: { width, height, channels: 3 } })
      .png()
      .toBuffer()
  )
}

/** pixel_values of an image given pixel by pixel: [3, height, width], each 8-bit value v as (v / 255 - mean) / std. */
const expectedPixelValues = (width: number, height: number, pixel: (x: number, y: number) => Rgb) =>
  Array.from({ length: 3 * width * height }, (_, index) => {
    const channel = Math.floor(index / (width * height))
    const x = index % width
    const y = Math.floor(index / width) % height
    return (pixel(x, y)[channel]! / 255 - imageMean[channel]!) / imageStd[channel]!
  })

const expectValues = (actual: ArrayLike<number>, expected: ReadonlyArray<number>) => {
  expect(actual.length).toBe(expected.length)
  expected.forEach((value, index) => expect(actual[index], `element ${index}`).toBeCloseTo(value, 5))
}

/** Every source pixel differs, so a nearest-neighbour resize shows which one it took. */
const grid = (x: number, y: number): Rgb => [x * 40, y * 25, 7 + x + y]

describe("image preprocessing, against a hand computation", () => {
  it("nearest (resample 0), downscaled by 3: each output pixel is the source pixel under its centre", async () => {
    // PIL's NEAREST takes source pixel floor((i + 0.5) * 3) = 3i + 1, the middle of each 3 × 3 block.
    const { inputs } = await image({ bytes: await png(6, 9, grid), config: configOf(0, 2, 3) })
    expect(inputs.pixel_values!.shape).toEqual([1, 3, 3, 2])
    expectValues(
      inputs.pixel_values!.data as Float32Array,
      expectedPixelValues(2, 3, (x, y) => grid(3 * x + 1, 3 * y + 1))
    )
  })

  it("bilinear (resample 2), downscaled by 2: a triangle filter twice as wide", async () => {
    // A vertical edge between columns 3 and 4. Output column i weighs source columns 2i - 1 … 2i + 2
    // by the triangle of half-width 2 at distances 1.5, 0.5, 0.5, 1.5 from its centre: 1/8, 3/8,
    // 3/8, 1/8. Columns past the border lie in a uniform region, whatever the edge rule.
    const left: Rgb = [0, 240, 60]
    const right: Rgb = [240, 0, 60]
    const source = (x: number): Rgb => (x < 4 ? left : right)
    const weights = [1 / 8, 3 / 8, 3 / 8, 1 / 8]
    const filtered = (x: number): Rgb => {
      const channel = (c: number) => weights.reduce((sum, weight, tap) => sum + weight * source(2 * x - 1 + tap)[c]!, 0)
      return [channel(0), channel(1), channel(2)]
    }
    expect([0, 1, 2, 3].map((x) => filtered(x)[0])).toEqual([0, 30, 210, 240])

    const { inputs } = await image({ bytes: await png(8, 8, source), config: configOf(2, 4, 4) })
    expectValues(inputs.pixel_values!.data as Float32Array, expectedPixelValues(4, 4, filtered))
  })

  it("resizes each frame of a video with the configured kernel too", async () => {
    const { inputs } = await video({ bytes: await png(6, 9, grid), config: configOf(0, 2, 3), maxFrames: 4 })
    expect(inputs.pixel_values!.shape).toEqual([1, 3, 3, 2])
    expectValues(
      inputs.pixel_values!.data as Float32Array,
      expectedPixelValues(2, 3, (x, y) => grid(3 * x + 1, 3 * y + 1))
    )
  })
})
