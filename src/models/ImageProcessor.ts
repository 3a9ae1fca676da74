import { Either, Schema } from "effect"
import sharp from "sharp"
import { decodeConfig } from "./ModelDirectory.js"

/**
 * Turns an image into a model's pixel_values the way its preprocessor_config.json says (the
 * fields of Hugging Face image processors): resize to size.height × size.width (the whole image,
 * no crop), rescale, normalize, channels first.
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
const kernels: Record<number, "nearest" | "lanczos3" | "linear" | "cubic"> = {
  0: "nearest",
  1: "lanczos3",
  2: "linear",
  3: "cubic"
}

/** An encoded image (PNG, JPEG, WebP, ...) or raw RGB → pixel_values of one image, [3, height, width]. */
export const pixelValues = async (
  config: ImageProcessorConfig,
  image: Uint8Array | RgbImage
): Promise<Float32Array> => {
  const { height, width } = config.size
  const source =
    image instanceof Uint8Array
      ? sharp(image)
      : sharp(image.data, { raw: { width: image.width, height: image.height, channels: 3 } })
  const rgb = await source
    .removeAlpha()
    .toColourspace("srgb")
    .resize(width, height, { fit: "fill", kernel: kernels[config.resample] ?? "linear" })
    .raw()
    .toBuffer()
  const plane = width * height
  const out = new Float32Array(3 * plane)
  for (let c = 0; c < 3; c++) {
    const scale = config.do_rescale ? config.rescale_factor : 1
    const mean = config.do_normalize ? config.image_mean[c]! : 0
    const std = config.do_normalize ? config.image_std[c]! : 1
    for (let i = 0; i < plane; i++) out[c * plane + i] = (rgb[i * 3 + c]! * scale - mean) / std
  }
  return out
}
