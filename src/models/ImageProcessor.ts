import * as Either from "effect/Either"
import * as Schema from "effect/Schema"
import type { Sharp } from "sharp"
import { sharp } from "./Sharp.js"
import { decodeConfig } from "./ModelDirectory.js"

/**
 * Turns an image into a model's pixel_values the way its preprocessor_config.json says (the
 * fields of Hugging Face image processors): resize to size.height × size.width (the whole image,
 * no crop) with the resample kernel, rescale, normalize, channels first.
 */

export const ImageProcessorConfig = Schema.Struct({
  size: Schema.Struct({ height: Schema.Int, width: Schema.Int }),
  resample: Schema.optionalWith(Schema.Int, { default: () => 2 }),
  do_rescale: Schema.optionalWith(Schema.Boolean, { default: () => true }),
  rescale_factor: Schema.optionalWith(Schema.Number, { default: () => 1 / 255 }),
  do_normalize: Schema.optionalWith(Schema.Boolean, { default: () => true }),
  image_mean: Schema.Tuple(Schema.Number, Schema.Number, Schema.Number),
  image_std: Schema.Tuple(Schema.Number, Schema.Number, Schema.Number)
})
export type ImageProcessorConfig = typeof ImageProcessorConfig.Type

export const decodeImageProcessorConfig = (preprocessorConfig: unknown): ImageProcessorConfig =>
  Either.getOrThrowWith(
    decodeConfig(ImageProcessorConfig, preprocessorConfig ?? {}),
    (reason) => new Error(`preprocessor_config.json has no usable image settings: ${reason}`)
  )

/** Interleaved 8-bit RGB pixels. */
export interface RgbImage {
  readonly data: Uint8Array
  readonly width: number
  readonly height: number
}

/** PIL's resample codes (what preprocessor configs hold) as sharp kernels. */
const kernels: Record<number, ResizeTarget["kernel"]> = {
  0: "nearest",
  1: "lanczos3",
  2: "linear",
  3: "cubic"
}

/** The size an image is resized to before it is normalized, and the kernel that resizes it. */
export interface ResizeTarget {
  readonly width: number
  readonly height: number
  readonly kernel: "nearest" | "lanczos3" | "linear" | "cubic"
}

export const resizeTarget = (config: ImageProcessorConfig): ResizeTarget => ({
  width: config.size.width,
  height: config.size.height,
  kernel: kernels[config.resample] ?? "linear"
})

/**
 * An image (a sharp pipeline: decoding bytes, or raw pixels) as 8-bit RGB of exactly the target's
 * size, resized in one step with its kernel: a second resize would blur it with another kernel.
 */
export const resizeRgb = async (image: Sharp, target: ResizeTarget): Promise<RgbImage> => {
  const { data, info } = await image
    .removeAlpha()
    .toColourspace("srgb")
    .resize(target.width, target.height, { fit: "fill", kernel: target.kernel })
    .raw()
    .toBuffer({ resolveWithObject: true })
  return { width: info.width, height: info.height, data: new Uint8Array(data.buffer, data.byteOffset, data.length) }
}

/** An image already at the config's size → pixel_values, [3, height, width]: rescaled, normalized, channels first. */
export const normalizePixels = (config: ImageProcessorConfig, rgb: RgbImage): Float32Array => {
  const plane = rgb.width * rgb.height
  const out = new Float32Array(3 * plane)
  for (let c = 0; c < 3; c++) {
    const scale = config.do_rescale ? config.rescale_factor : 1
    const mean = config.do_normalize ? config.image_mean[c]! : 0
    const std = config.do_normalize ? config.image_std[c]! : 1
    for (let i = 0; i < plane; i++) out[c * plane + i] = (rgb.data[i * 3 + c]! * scale - mean) / std
  }
  return out
}

/** An encoded image (PNG, JPEG, WebP, ...) or raw RGB of any size → pixel_values of one image, [3, height, width]. */
export const pixelValues = async (config: ImageProcessorConfig, image: Uint8Array | RgbImage): Promise<Float32Array> =>
  normalizePixels(
    config,
    await resizeRgb(
      image instanceof Uint8Array
        ? sharp(image)
        : sharp(image.data, { raw: { width: image.width, height: image.height, channels: 3 } }),
      resizeTarget(config)
    )
  )
