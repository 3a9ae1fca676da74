import * as Either from "effect/Either"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import { InvalidModelDirectory, type ModelDirectory } from "./ModelDirectory.js"
import { type DecodeOptions, decodeRgb, type LevelScaling, levelTables, type Resample, resizeRgb } from "./RgbPixels.js"

/**
 * An image as transformers.js's base ImageProcessor makes it for a vision encoder of one input
 * size (Gemma 3's, LLaVA-OneVision's), under Node: decoded with sharp (oriented by EXIF, alpha
 * dropped without blending, gray spread to RGB), resized to exactly size.width × size.height
 * whatever its aspect ratio (an affine scale with the resample kernel, Lanczos through sharp's
 * resize; an image already of that size is kept), rescaled then normalized with each step stored
 * as float32, channels first: pixel_values [1, 3, height, width].
 */

export const Count = Schema.Int.pipe(Schema.positive())
const PerChannel = Schema.Union(Schema.Number, Schema.Tuple(Schema.Number, Schema.Number, Schema.Number))
const nullable = { nullable: true } as const

/** A step of the base image processor that these configs leave off; a config that turns one on is refused. */
export const off = (family: string) =>
  Schema.optional(
    Schema.NullOr(Schema.Literal(false).annotations({ message: () => `is not supported by ${family}'s processor` }))
  )

/** The fields of a fixed-size image processor's preprocessor_config.json, with transformers.js's defaults. */
export const fixedSizeImageFields = {
  /** Only height and width: a size given another way (shortest_edge, longest_edge) would keep the aspect ratio. */
  size: Schema.Struct({ height: Count, width: Count }).annotations({
    parseOptions: { onExcessProperty: "error" }
  }),
  do_resize: Schema.optional(
    Schema.NullOr(
      Schema.Literal(true).annotations({ message: () => "must be true: the vision encoder takes one size" })
    )
  ),
  resample: Schema.optionalWith(
    Schema.Literal(0, 1, 2, 3, 4, 5).annotations({
      message: () => ({
        message: "must be one of PIL's filters: 0 nearest, 1 Lanczos, 2 bilinear, 3 bicubic, 4 box, 5 Hamming",
        override: true
      })
    }),
    { ...nullable, default: () => 2 as const }
  ),
  do_rescale: Schema.optionalWith(Schema.Boolean, { ...nullable, default: () => true }),
  rescale_factor: Schema.optionalWith(Schema.Number, { ...nullable, default: () => 1 / 255 }),
  /** transformers.js's ImageProcessor normalizes only when the file says so. */
  do_normalize: Schema.optionalWith(Schema.Boolean, { ...nullable, default: () => false }),
  image_mean: Schema.optional(PerChannel),
  image_std: Schema.optional(PerChannel),
  /** Null means true, as in transformers.js. */
  do_convert_rgb: Schema.optional(
    Schema.NullOr(
      Schema.Literal(true).annotations({ message: () => "must be true: this processor reads every image as RGB" })
    )
  )
}

/** What a fixed-size image needs, as plain data (it crosses to preprocessing threads). */
export interface FixedSizePixels extends LevelScaling {
  readonly size: { readonly height: number; readonly width: number }
  readonly resample: Resample
}

/** A config file decoded, or refused naming each wrong field with the first reason its schema gives. */
export const decodeConfigFile = <A, I>(
  model: ModelDirectory,
  schema: Schema.Schema<A, I>,
  value: unknown,
  file: string
): A =>
  Either.getOrThrowWith(Schema.decodeUnknownEither(schema)(value, { errors: "all" }), (error) => {
    const issues = ParseResult.ArrayFormatter.formatErrorSync(error)
    // A field of a union (optional fields are unions with undefined) reports once per member: keep its first.
    const reasons = issues
      .filter((issue, i) => issues.findIndex((other) => other.path.join(".") === issue.path.join(".")) === i)
      .map((issue) => `${issue.path.join(".")} ${issue.message}`.trim())
    return new InvalidModelDirectory({ path: model.path, reason: `${file}: ${reasons.join("; ")}` })
  })

/** The pixel settings of a decoded config; normalizing without a mean and a deviation is refused. */
export const fixedSizePixels = (
  model: ModelDirectory,
  image: Schema.Schema.Type<Schema.Struct<typeof fixedSizeImageFields>>,
  file: string
): FixedSizePixels => {
  if (image.do_normalize && (image.image_mean === undefined || image.image_std === undefined)) {
    throw new InvalidModelDirectory({
      path: model.path,
      reason: `${file} turns do_normalize on but lacks image_mean or image_std`
    })
  }
  return {
    size: image.size,
    resample: image.resample,
    do_rescale: image.do_rescale,
    rescale_factor: image.rescale_factor,
    do_normalize: image.do_normalize,
    image_mean: image.image_mean,
    image_std: image.image_std
  }
}

/** One image as the vision encoder takes it. */
export interface FixedSizePixelValues {
  /** float32, channels first. */
  readonly data: Float32Array
  readonly shape: readonly [1, 3, number, number]
}

/** An encoded image (PNG, JPEG, WebP, ...) → pixel_values [1, 3, height, width], as transformers.js gives them. */
export const fixedSizePixelValues = async (
  bytes: Uint8Array,
  config: FixedSizePixels,
  options: DecodeOptions = {}
): Promise<FixedSizePixelValues> => {
  const { width, height } = config.size
  const rgb = await resizeRgb(await decodeRgb(bytes, options), config.size, config.resample)
  const tables = levelTables(config)
  const plane = width * height
  const data = new Float32Array(3 * plane)
  for (let c = 0; c < 3; c++) {
    const table = tables[c]!
    for (let i = 0, source = c; i < plane; i++, source += 3) data[c * plane + i] = table[rgb.data[source]!]!
  }
  return { data, shape: [1, 3, height, width] }
}
