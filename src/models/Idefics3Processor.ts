import { rawImageResize } from "./RawImageResize.js"
import * as Either from "effect/Either"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import { readFile } from "node:fs/promises"
import { join } from "node:path"
import type { Sharp } from "sharp"
import { sharp } from "./Sharp.js"
import type { RgbImage } from "./ImageProcessor.js"

/**
 * The Idefics3 (SmolVLM) processor, computing what transformers.js's Idefics3ImageProcessor and
 * Idefics3Processor compute:
 *
 * - each image is decoded with sharp, converted to RGB, resized (sharp, the config's resample
 *   kernel) so that its longest edge is size.longest_edge, rescaled and normalized;
 * - with do_image_splitting, the float image is resized (bilinear, ONNX Resize's half_pixel rule)
 *   to multiples of max_image_size.longest_edge, cut into square tiles in row-major order, and
 *   followed by the whole image resized to one tile (the global image); without it, the image is
 *   only resized to one tile and has rows = cols = 0;
 * - the tiles of all images of a prompt form pixel_values [1, frames, 3, tile, tile]; prompts of
 *   a batch are padded to the most frames with zero frames that pixel_attention_mask marks false;
 * - each <image> placeholder of the prompt becomes <fake_token_around_image>, <row_R_col_C> and
 *   image_seq_len <image> tokens per tile, then <global-img> and the global image's tokens.
 */

/** A config file the processor cannot follow, and the field that is wrong. */
export class InvalidProcessorConfig extends Schema.TaggedError<InvalidProcessorConfig>()("InvalidProcessorConfig", {
  file: Schema.String,
  /** Dotted path of the field ("size.longest_edge"); empty when the whole file is at fault. */
  field: Schema.String,
  reason: Schema.String
}) {
  override get message() {
    return this.field === "" ? `${this.file} ${this.reason}` : `${this.file}: ${this.field} ${this.reason}`
  }
}

/** A prompt whose <image> placeholders do not match the images sent with it. */
export class ImagePlaceholderMismatch extends Schema.TaggedError<ImagePlaceholderMismatch>()(
  "ImagePlaceholderMismatch",
  { placeholders: Schema.Int, images: Schema.Int }
) {
  override get message() {
    return `the prompt has ${this.placeholders} <image> placeholder(s) for ${this.images} image(s)`
  }
}

const Count = Schema.Int.pipe(Schema.positive())
/** Only longest_edge: a size given another way (height and width, shortest_edge) would be resized differently. */
const LongestEdge = Schema.Struct({ longest_edge: Count }).annotations({
  parseOptions: { onExcessProperty: "error" }
})
const PerChannel = Schema.Union(Schema.Number, Schema.Tuple(Schema.Number, Schema.Number, Schema.Number))
/** Steps of the generic image processor that Idefics3 does not use; a config that turns one on is refused. */
const NotImplemented = Schema.Literal(false).annotations({ message: () => "is not supported by this processor" })

/**
 * preprocessor_config.json of an Idefics3 model. Defaults are transformers.js's: note that
 * do_normalize is off unless the file turns it on.
 */
export const Idefics3ImageProcessorConfig = Schema.Struct({
  image_processor_type: Schema.optional(Schema.Literal("Idefics3ImageProcessor", "SmolVLMImageProcessor")),
  do_convert_rgb: Schema.optionalWith(Schema.Boolean, { default: () => true }),
  do_resize: Schema.optionalWith(Schema.Boolean, { default: () => true }),
  size: LongestEdge,
  max_image_size: LongestEdge,
  do_image_splitting: Schema.optionalWith(Schema.Boolean, { default: () => true }),
  /** PIL's codes: 0 nearest, 1 Lanczos, 2 bilinear, 3 bicubic, 4 box and 5 Hamming (both done as bilinear). */
  resample: Schema.optionalWith(Schema.Literal(0, 1, 2, 3, 4, 5), { default: () => 2 as const }),
  do_rescale: Schema.optionalWith(Schema.Boolean, { default: () => true }),
  rescale_factor: Schema.optionalWith(Schema.Number, { default: () => 1 / 255 }),
  do_normalize: Schema.optionalWith(Schema.Boolean, { default: () => false }),
  image_mean: Schema.optional(PerChannel),
  image_std: Schema.optional(PerChannel),
  /** Every frame is a full tile, so there is nothing to pad within a prompt; the flag is accepted as such. */
  do_pad: Schema.optional(Schema.Boolean),
  do_center_crop: Schema.optional(NotImplemented),
  do_crop_margin: Schema.optional(NotImplemented),
  do_thumbnail: Schema.optional(NotImplemented),
  do_flip_channel_order: Schema.optional(NotImplemented)
})
export type Idefics3ImageProcessorConfig = typeof Idefics3ImageProcessorConfig.Type

/** processor_config.json: how many <image> tokens stand for one tile. */
const ProcessorConfig = Schema.Struct({ image_seq_len: Schema.optional(Count) })

/** The fields of config.json that give the number of features per tile. */
const VisionGeometry = Schema.Struct({
  scale_factor: Schema.optional(Count),
  vision_config: Schema.optional(Schema.Struct({ image_size: Count, patch_size: Count }))
})

export const preprocessorConfigFile = "preprocessor_config.json"
export const processorConfigFile = "processor_config.json"
const modelConfigFile = "config.json"

const decodeFile = <A, I>(schema: Schema.Schema<A, I>, value: unknown, file: string): A =>
  Either.getOrThrowWith(Schema.decodeUnknownEither(schema)(value, { errors: "all" }), (error) => {
    const issues = ParseResult.ArrayFormatter.formatErrorSync(error)
    // A field of a union (optional fields are unions with undefined) reports once per member: keep its first.
    const [first, ...others] = issues.filter(
      (issue, i) => issues.findIndex((other) => other.path.join(".") === issue.path.join(".")) === i
    )
    const also = others.map((issue) => `; ${issue.path.join(".")} ${issue.message}`).join("")
    return new InvalidProcessorConfig({
      file,
      field: first?.path.join(".") ?? "",
      reason: `${first?.message ?? "is not valid"}${also}`
    })
  })

export const decodeIdefics3ImageProcessorConfig = (value: unknown): Idefics3ImageProcessorConfig => {
  const config = decodeFile(Idefics3ImageProcessorConfig, value, preprocessorConfigFile)
  if (config.do_normalize) {
    for (const field of ["image_mean", "image_std"] as const) {
      if (config[field] === undefined) {
        throw new InvalidProcessorConfig({
          file: preprocessorConfigFile,
          field,
          reason: "is missing (do_normalize is true)"
        })
      }
    }
  }
  return config
}

export interface Idefics3Processor {
  readonly image: Idefics3ImageProcessorConfig
  /** <image> tokens per tile: image features the vision encoder gives per frame. */
  readonly imageSeqLen: number
}

/**
 * The processor of a model from its three config files (parsed JSON; undefined when absent).
 * image_seq_len comes from processor_config.json, as transformers.js takes it; config.json's
 * vision geometry gives it when that file has none, and must agree with it when both do.
 */
export const idefics3Processor = (files: {
  readonly preprocessorConfig: unknown
  readonly processorConfig?: unknown
  readonly modelConfig?: unknown
}): Idefics3Processor => {
  if (files.preprocessorConfig === undefined) {
    throw new InvalidProcessorConfig({ file: preprocessorConfigFile, field: "", reason: "is missing" })
  }
  const image = decodeIdefics3ImageProcessorConfig(files.preprocessorConfig)
  const declared = decodeFile(ProcessorConfig, files.processorConfig ?? {}, processorConfigFile).image_seq_len
  const geometry = decodeFile(VisionGeometry, files.modelConfig ?? {}, modelConfigFile)
  const vision = geometry.vision_config
  const derived =
    vision === undefined || geometry.scale_factor === undefined
      ? undefined
      : (vision.image_size / vision.patch_size) ** 2 / geometry.scale_factor ** 2
  if (declared !== undefined && derived !== undefined && declared !== derived) {
    throw new InvalidProcessorConfig({
      file: processorConfigFile,
      field: "image_seq_len",
      reason: `is ${declared}, but config.json's vision_config and scale_factor give ${derived} features per tile`
    })
  }
  const imageSeqLen = declared ?? derived
  if (imageSeqLen === undefined || !Number.isInteger(imageSeqLen)) {
    throw new InvalidProcessorConfig({
      file: processorConfigFile,
      field: "image_seq_len",
      reason: "is missing, and config.json has no vision_config and scale_factor to derive it from"
    })
  }
  return { image, imageSeqLen }
}

const readJson = async (dir: string, file: string): Promise<unknown> => {
  let text: string
  try {
    text = await readFile(join(dir, file), "utf8")
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return undefined
    throw new InvalidProcessorConfig({ file, field: "", reason: `cannot be read: ${(error as Error).message}` })
  }
  try {
    return JSON.parse(text)
  } catch (error) {
    throw new InvalidProcessorConfig({ file, field: "", reason: `is not valid JSON: ${(error as Error).message}` })
  }
}

/** The processor of the model directory `dir`. */
export const loadIdefics3Processor = async (dir: string): Promise<Idefics3Processor> =>
  idefics3Processor({
    preprocessorConfig: await readJson(dir, preprocessorConfigFile),
    processorConfig: await readJson(dir, processorConfigFile),
    modelConfig: await readJson(dir, modelConfigFile)
  })

// ---------------------------------------------------------------------------------------------
// Images

/** 8-bit pixels with 1 to 4 interleaved channels, as sharp hands them over. */
interface Pixels {
  readonly data: Uint8Array
  readonly width: number
  readonly height: number
  readonly channels: number
}

/** Channel conversions with the formulas of transformers.js's RawImage (alpha is dropped, not blended). */
const convertChannels = (image: Pixels, channels: number): Pixels => {
  if (image.channels === channels) return image
  const count = image.width * image.height
  const out = new Uint8Array(count * channels)
  const src = image.data
  for (let i = 0; i < count; i++) {
    const s = i * image.channels
    const gray = image.channels < 3
    const [r, g, b] = gray ? [src[s]!, src[s]!, src[s]!] : [src[s]!, src[s + 1]!, src[s + 2]!]
    const alpha = image.channels === 2 || image.channels === 4 ? src[s + image.channels - 1]! : 255
    const d = i * channels
    if (channels === 1) out[d] = gray ? r : Math.round(0.2989 * r + 0.587 * g + 0.114 * b)
    else {
      out[d] = r
      out[d + 1] = g
      out[d + 2] = b
      if (channels === 4) out[d + 3] = alpha
    }
  }
  return { data: out, width: image.width, height: image.height, channels }
}

/** sharp's output as transformers.js reads it: oriented by EXIF, in the input's channel count. */
const readPixels = async (image: Sharp): Promise<Pixels> => {
  const { channels } = await image.metadata()
  const { data, info } = await image.rotate().raw().toBuffer({ resolveWithObject: true })
  const pixels = { data: new Uint8Array(data.buffer, data.byteOffset, data.length), ...info }
  return channels === undefined ? pixels : convertChannels(pixels, channels)
}

const rawSharp = (image: Pixels): Sharp =>
  sharp(image.data, { raw: { width: image.width, height: image.height, channels: image.channels as 1 | 3 | 4 } })

/** RawImage.resize under Node (see RawImageResize.ts). */
const resizePixels = async (image: Pixels, width: number, height: number, resample: number): Promise<Pixels> => {
  if (image.width === width && image.height === height) return image
  return readPixels(rawImageResize(rawSharp(image), image, { width, height }, resample))
}

/** The size whose longest edge is `longestEdge`, rounded as transformers.js rounds it (to 2 decimals, then down). */
export const longestEdgeSize = (
  width: number,
  height: number,
  longestEdge: number
): { readonly width: number; readonly height: number } => {
  const factor = Math.min(longestEdge / width, longestEdge / height)
  return {
    width: Math.floor(Number((width * factor).toFixed(2))),
    height: Math.floor(Number((height * factor).toFixed(2)))
  }
}

/** The size the resized image is split from: each edge up to a multiple of the tile, keeping the aspect. */
export const splitSize = (
  width: number,
  height: number,
  tile: number
): { readonly width: number; readonly height: number } => {
  const aspect = width / height
  if (width >= height) {
    const w = Math.ceil(width / tile) * tile
    return { width: w, height: Math.ceil(Math.floor(w / aspect) / tile) * tile }
  }
  const h = Math.ceil(height / tile) * tile
  return { width: Math.ceil(Math.floor(h * aspect) / tile) * tile, height: h }
}

/** A float image, channels first: [3, height, width]. */
interface Planes {
  readonly data: Float32Array
  readonly width: number
  readonly height: number
}

const perChannel = (value: number | ReadonlyArray<number> | undefined, fallback: number): ReadonlyArray<number> =>
  value === undefined ? [fallback, fallback, fallback] : typeof value === "number" ? [value, value, value] : value

/** Rescale then normalize, each result stored as float32 the way transformers.js stores it; HWC → CHW. */
const normalizedPlanes = (config: Idefics3ImageProcessorConfig, rgb: Pixels): Planes => {
  const plane = rgb.width * rgb.height
  const out = new Float32Array(3 * plane)
  const mean = perChannel(config.image_mean, 0)
  const std = perChannel(config.image_std, 1)
  for (let c = 0; c < 3; c++) {
    for (let i = 0; i < plane; i++) {
      let value = rgb.data[i * 3 + c]!
      if (config.do_rescale) value = Math.fround(config.rescale_factor * value)
      if (config.do_normalize) value = Math.fround((value - mean[c]!) / std[c]!)
      out[c * plane + i] = value
    }
  }
  return { data: out, width: rgb.width, height: rgb.height }
}

/**
 * Source coordinates of ONNX Resize's linear mode (half_pixel, no antialias), in float32 as ONNX
 * Runtime computes them: the two neighbours and their weights for each output index.
 */
const linearTaps = (input: number, output: number) => {
  const scale = Math.fround(output / input)
  const low = new Int32Array(output)
  const high = new Int32Array(output)
  const lowWeight = new Float32Array(output)
  const highWeight = new Float32Array(output)
  for (let o = 0; o < output; o++) {
    let x = Math.fround(Math.fround(Math.fround(o + 0.5) / scale) - 0.5)
    x = Math.max(0, Math.min(x, input - 1))
    const x1 = Math.min(Math.trunc(x), input - 1)
    const x2 = Math.min(x1 + 1, input - 1)
    low[o] = x1
    high[o] = x2
    // The weight of the low neighbour is the distance to the high one, and the other way round.
    lowWeight[o] = x1 === x2 ? 0.5 : Math.abs(x - x2)
    highWeight[o] = x1 === x2 ? 0.5 : Math.abs(x - x1)
  }
  return { low, high, lowWeight, highWeight }
}

/** transformers.js's interpolate_4d (bilinear): ONNX Resize, mode linear, to width × height. */
const resizePlanes = (image: Planes, width: number, height: number): Planes => {
  if (image.width === width && image.height === height) return image
  const xs = linearTaps(image.width, width)
  const ys = linearTaps(image.height, height)
  const inPlane = image.width * image.height
  const out = new Float32Array(3 * width * height)
  for (let c = 0; c < 3; c++) {
    const src = image.data.subarray(c * inPlane, (c + 1) * inPlane)
    for (let y = 0; y < height; y++) {
      const top = ys.low[y]! * image.width
      const bottom = ys.high[y]! * image.width
      const wTop = ys.lowWeight[y]!
      const wBottom = ys.highWeight[y]!
      const row = (c * height + y) * width
      for (let x = 0; x < width; x++) {
        const left = xs.low[x]!
        const right = xs.high[x]!
        const wLeft = xs.lowWeight[x]!
        const wRight = xs.highWeight[x]!
        out[row + x] =
          wLeft * wTop * src[top + left]! +
          wRight * wTop * src[top + right]! +
          wLeft * wBottom * src[bottom + left]! +
          wRight * wBottom * src[bottom + right]!
      }
    }
  }
  return { data: out, width, height }
}

const crop = (image: Planes, top: number, left: number, size: number): Float32Array => {
  const out = new Float32Array(3 * size * size)
  for (let c = 0; c < 3; c++) {
    for (let y = 0; y < size; y++) {
      const start = (c * image.height + top + y) * image.width + left
      out.set(image.data.subarray(start, start + size), (c * size + y) * size)
    }
  }
  return out
}

/** One image as the vision encoder takes it: its tiles in row-major order, then the global image. */
export interface Idefics3ImageFrames {
  /** [frames, 3, tile, tile]. */
  readonly frames: Float32Array
  readonly frameCount: number
  readonly tile: number
  /** Tile rows and columns; both 0 when the image is not split (it is then one frame). */
  readonly rows: number
  readonly cols: number
}

/** Splits an image whose edges are multiples of the tile; the last row and column are cut from the far edge. */
const splitPlanes = (image: Planes, tile: number): Idefics3ImageFrames => {
  if (image.height <= tile && image.width <= tile) {
    return { frames: image.data, frameCount: 1, tile, rows: 0, cols: 0 }
  }
  const rows = Math.ceil(image.height / tile)
  const cols = Math.ceil(image.width / tile)
  const tileHeight = Math.ceil(image.height / rows)
  const tileWidth = Math.ceil(image.width / cols)
  if (tileHeight !== tile || tileWidth !== tile) {
    throw new Error(`an image of ${image.width}×${image.height} does not split into ${tile}×${tile} tiles`)
  }
  const frameSize = 3 * tile * tile
  const frames = new Float32Array((rows * cols + 1) * frameSize)
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) {
      const top = r === rows - 1 ? image.height - tile : r * tile
      const left = c === cols - 1 ? image.width - tile : c * tile
      frames.set(crop(image, top, left, tile), (r * cols + c) * frameSize)
    }
  }
  frames.set(resizePlanes(image, tile, tile).data, rows * cols * frameSize)
  return { frames, frameCount: rows * cols + 1, tile, rows, cols }
}

export interface Idefics3ImageOptions {
  /** Overrides the config's do_image_splitting, as transformers.js's call option does. */
  readonly doImageSplitting?: boolean
  /** sharp's limit on the pixels of an encoded image, checked from its header before decoding. */
  readonly limitInputPixels?: number
}

const decodePixels = async (image: Uint8Array | RgbImage, options: Idefics3ImageOptions): Promise<Pixels> =>
  image instanceof Uint8Array
    ? readPixels(
        sharp(image, options.limitInputPixels === undefined ? {} : { limitInputPixels: options.limitInputPixels })
      )
    : { data: image.data, width: image.width, height: image.height, channels: 3 }

/** One image (encoded bytes that sharp reads, or 8-bit RGB) → its frames. */
export const idefics3ImageFrames = async (
  config: Idefics3ImageProcessorConfig,
  image: Uint8Array | RgbImage,
  options: Idefics3ImageOptions = {}
): Promise<Idefics3ImageFrames> => {
  let pixels = await decodePixels(image, options)
  if (config.do_convert_rgb) pixels = convertChannels(pixels, 3)
  else if (pixels.channels !== 3) {
    throw new InvalidProcessorConfig({
      file: preprocessorConfigFile,
      field: "do_convert_rgb",
      reason: `is false, and an image has ${pixels.channels} channel(s) instead of 3`
    })
  }
  if (config.do_resize) {
    const size = longestEdgeSize(pixels.width, pixels.height, config.size.longest_edge)
    pixels = await resizePixels(pixels, size.width, size.height, config.resample)
  }
  const planes = normalizedPlanes(config, pixels)
  const tile = config.max_image_size.longest_edge
  if (options.doImageSplitting ?? config.do_image_splitting) {
    const size = splitSize(planes.width, planes.height, tile)
    return splitPlanes(resizePlanes(planes, size.width, size.height), tile)
  }
  return { frames: resizePlanes(planes, tile, tile).data, frameCount: 1, tile, rows: 0, cols: 0 }
}

/** The vision encoder's inputs for a batch of prompts, and each image's tile grid. */
export interface Idefics3PixelInputs {
  /** float32 [batch, frames, 3, tile, tile]; prompts with fewer frames are padded with zero frames. */
  readonly pixelValues: Float32Array
  /** bool (0/1) [batch, frames, tile, tile]: false on padding frames. */
  readonly pixelAttentionMask: Uint8Array
  readonly batch: number
  readonly frames: number
  readonly tile: number
  /** Per prompt, per image. */
  readonly rows: ReadonlyArray<ReadonlyArray<number>>
  readonly cols: ReadonlyArray<ReadonlyArray<number>>
}

/** Stacks the frames of each prompt's images ([prompt][image]) into one batch. */
export const stackIdefics3Frames = (
  prompts: ReadonlyArray<ReadonlyArray<Idefics3ImageFrames>>
): Idefics3PixelInputs => {
  const tile = prompts[0]?.[0]?.tile
  if (tile === undefined || prompts.some((images) => images.length === 0)) {
    throw new Error("every prompt of a batch needs at least one image")
  }
  if (prompts.some((images) => images.some((image) => image.tile !== tile))) {
    throw new Error("the images of a batch were processed with different tile sizes")
  }
  const counts = prompts.map((images) => images.reduce((sum, image) => sum + image.frameCount, 0))
  const frames = Math.max(...counts)
  const frameSize = 3 * tile * tile
  const maskSize = tile * tile
  const pixelValues = new Float32Array(prompts.length * frames * frameSize)
  const pixelAttentionMask = new Uint8Array(prompts.length * frames * maskSize)
  prompts.forEach((images, p) => {
    let offset = p * frames
    for (const image of images) {
      pixelValues.set(image.frames, offset * frameSize)
      offset += image.frameCount
    }
    pixelAttentionMask.fill(1, p * frames * maskSize, (p * frames + counts[p]!) * maskSize)
  })
  return {
    pixelValues,
    pixelAttentionMask,
    batch: prompts.length,
    frames,
    tile,
    rows: prompts.map((images) => images.map((image) => image.rows)),
    cols: prompts.map((images) => images.map((image) => image.cols))
  }
}

/** Every image of every prompt ([prompt][image]) → the vision encoder's inputs. */
export const idefics3PixelInputs = async (
  config: Idefics3ImageProcessorConfig,
  prompts: ReadonlyArray<ReadonlyArray<Uint8Array | RgbImage>>,
  options: Idefics3ImageOptions = {}
): Promise<Idefics3PixelInputs> =>
  stackIdefics3Frames(
    await Promise.all(
      prompts.map((images) => Promise.all(images.map((image) => idefics3ImageFrames(config, image, options))))
    )
  )

// ---------------------------------------------------------------------------------------------
// Prompts

export const idefics3Tokens = {
  image: "<image>",
  fakeTokenAroundImage: "<fake_token_around_image>",
  globalImage: "<global-img>",
  tilePosition: (row: number, col: number) => `<row_${row}_col_${col}>`
} as const

/** The text that stands for one image of `rows` × `cols` tiles (0 × 0: not split). */
export const idefics3ImagePrompt = (grid: { readonly rows: number; readonly cols: number }, imageSeqLen: number) => {
  const { image, fakeTokenAroundImage: fake, globalImage, tilePosition } = idefics3Tokens
  const tokens = image.repeat(imageSeqLen)
  const global = `${fake}${globalImage}${tokens}${fake}`
  if (grid.rows === 0 && grid.cols === 0) return global
  let text = ""
  for (let r = 1; r <= grid.rows; r++) {
    for (let c = 1; c <= grid.cols; c++) text += `${fake}${tilePosition(r, c)}${tokens}`
    text += "\n"
  }
  return `${text}\n${global}`
}

/** A prompt with one <image> placeholder per image → the prompt the tokenizer encodes. */
export const expandIdefics3Prompt = (
  text: string,
  images: ReadonlyArray<{ readonly rows: number; readonly cols: number }>,
  imageSeqLen: number
): string => {
  const pieces = text.split(idefics3Tokens.image)
  if (pieces.length - 1 !== images.length) {
    throw new ImagePlaceholderMismatch({ placeholders: pieces.length - 1, images: images.length })
  }
  return images.reduce(
    (prompt, grid, i) => prompt + idefics3ImagePrompt(grid, imageSeqLen) + pieces[i + 1]!,
    pieces[0]!
  )
}

/** How many <image> tokens (image features) an image of this grid takes. */
export const idefics3ImageTokenCount = (grid: { readonly rows: number; readonly cols: number }, imageSeqLen: number) =>
  (grid.rows * grid.cols + 1) * imageSeqLen
