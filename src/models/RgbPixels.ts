import { sharp } from "./Sharp.js"
import type { RgbImage } from "./ImageProcessor.js"
import { rawImageResize } from "./RawImageResize.js"

/**
 * The steps transformers.js's image processors take on an image under Node, done so that the
 * pixels come out bit for bit the same: decoding, resizing, and rescaling then normalizing each
 * 8-bit level. Processors that must give transformers.js's pixel_values build on these.
 */

/** PIL's resample codes: 0 nearest, 1 Lanczos, 2 bilinear, 3 bicubic, 4 box and 5 Hamming (both done as bilinear). */
export type Resample = 0 | 1 | 2 | 3 | 4 | 5

/** One value for every channel, or one per channel (R, G, B). */
export type PerChannel = number | readonly [number, number, number]

/** How 8-bit levels become float pixel values: the fields of a preprocessor_config.json that say so. */
export interface LevelScaling {
  readonly do_rescale: boolean
  readonly rescale_factor: number
  readonly do_normalize: boolean
  /** Read only when do_normalize is true, which needs both. */
  readonly image_mean?: PerChannel | undefined
  readonly image_std?: PerChannel | undefined
}

export interface DecodeOptions {
  /** sharp's limit on the pixels of an encoded image, checked from its header before decoding. */
  readonly limitInputPixels?: number
}

/** An encoded image as transformers.js reads it: oriented by EXIF, alpha dropped (not blended), gray spread to RGB. */
export const decodeRgb = async (bytes: Uint8Array, options: DecodeOptions = {}): Promise<RgbImage> => {
  const { data, info } = await sharp(
    bytes,
    options.limitInputPixels === undefined ? {} : { limitInputPixels: options.limitInputPixels }
  )
    .rotate()
    .removeAlpha()
    .toColourspace("srgb")
    .raw()
    .toBuffer({ resolveWithObject: true })
  return { data: new Uint8Array(data.buffer, data.byteOffset, data.length), width: info.width, height: info.height }
}

/** RawImage.resize of transformers.js under Node (see RawImageResize.ts); an image already of the size is kept. */
export const resizeRgb = async (
  image: RgbImage,
  size: { readonly height: number; readonly width: number },
  resample: Resample
): Promise<RgbImage> => {
  if (image.width === size.width && image.height === size.height) return image
  const source = sharp(image.data, { raw: { width: image.width, height: image.height, channels: 3 } })
  const resized = rawImageResize(source, image, size, resample)
  const { data, info } = await resized.raw().toBuffer({ resolveWithObject: true })
  if (info.width !== size.width || info.height !== size.height || info.channels !== 3) {
    throw new Error(
      `resizing ${image.width}×${image.height} to ${size.width}×${size.height} gave ${info.width}×${info.height}×${info.channels}`
    )
  }
  return { data: new Uint8Array(data.buffer, data.byteOffset, data.length), width: info.width, height: info.height }
}

const channelValue = (value: PerChannel | undefined, channel: number, field: string): number => {
  if (value === undefined) throw new Error(`${field} is needed to normalize`)
  return typeof value === "number" ? value : value[channel]!
}

/**
 * Per channel, the value of each 8-bit level: rescaled, then normalized, each result stored as
 * float32 as transformers.js stores it.
 */
export const levelTables = (scaling: LevelScaling): ReadonlyArray<Float32Array> =>
  [0, 1, 2].map((c) => {
    const mean = scaling.do_normalize ? channelValue(scaling.image_mean, c, "image_mean") : 0
    const std = scaling.do_normalize ? channelValue(scaling.image_std, c, "image_std") : 1
    const table = new Float32Array(256)
    for (let level = 0; level < 256; level++) {
      let value = level
      if (scaling.do_rescale) value = Math.fround(scaling.rescale_factor * value)
      if (scaling.do_normalize) value = Math.fround((value - mean) / std)
      table[level] = value
    }
    return table
  })
