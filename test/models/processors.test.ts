import sharp from "sharp"
import { describe, expect, it } from "vitest"
import { decodeAudioProcessorConfig, inputValues } from "../../src/models/AudioProcessor.js"
import { decodeImageProcessorConfig, pixelValues } from "../../src/models/ImageProcessor.js"

const imageConfig = decodeImageProcessorConfig({
  size: { height: 4, width: 4 },
  image_mean: [0.5, 0.5, 0.5],
  image_std: [0.5, 0.5, 0.5]
})

describe("pixelValues", () => {
  it("resizes the whole image, rescales and normalizes, channels first", async () => {
    const data = new Uint8Array(8 * 2 * 3)
    for (let i = 0; i < 16; i++) data.set([255, 0, 51], i * 3)
    const pixels = await pixelValues(imageConfig, { data, width: 8, height: 2 })
    expect(pixels).toHaveLength(3 * 16)
    expect([pixels[0], pixels[16], pixels[32]].map((v) => Number(v!.toFixed(4)))).toEqual([1, -1, -0.6])
  })

  it("decodes encoded images", async () => {
    const png = await sharp({
      create: { width: 10, height: 6, channels: 4, background: { r: 0, g: 255, b: 0, alpha: 1 } }
    })
      .png()
      .toBuffer()
    const pixels = await pixelValues(imageConfig, new Uint8Array(png))
    expect([...pixels.subarray(0, 16)].every((v) => v === -1)).toBe(true)
    expect([...pixels.subarray(16, 32)].every((v) => v === 1)).toBe(true)
  })

  it("refuses a preprocessor config without image settings", () => {
    expect(() => decodeImageProcessorConfig({ sampling_rate: 16000 })).toThrow(/no usable image settings/)
    expect(() => decodeAudioProcessorConfig(undefined)).toThrow(/no usable audio settings/)
  })
})

describe("inputValues", () => {
  const config = decodeAudioProcessorConfig({ sampling_rate: 4, n_samples: 6 })

  it("zero-pads short clips and cuts long ones", () => {
    expect([...inputValues(config, Float32Array.of(0.5, -0.5), 4)]).toEqual([0.5, -0.5, 0, 0, 0, 0])
    expect([...inputValues(config, Float32Array.of(1, 2, 3, 4, 5, 6, 7, 8), 4)]).toEqual([1, 2, 3, 4, 5, 6])
  })

  it("resamples to the model's rate", () => {
    expect([...inputValues(config, Float32Array.of(0, 1, 2, 3, 4, 5, 6, 7), 8)]).toEqual([0, 2, 4, 6, 0, 0])
    expect([...inputValues(config, Float32Array.of(0, 1), 2)]).toEqual([0, 0.5, 1, 1, 0, 0])
  })
})
