import * as Either from "effect/Either"
import * as Schema from "effect/Schema"
import { InvalidProcessorConfig, preprocessorConfigFile } from "./Idefics3Processor.js"
import type { RgbImage } from "./ImageProcessor.js"
import { decodeConfig } from "./ModelDirectory.js"
import { type DecodeOptions, decodeRgb, levelTables, resizeRgb } from "./RgbPixels.js"

export { resizeRgb }

/**
 * The Qwen2-VL processor (Qwen2-VL, Qwen2.5-VL, and Qwen3-VL's images with its 16-pixel patches),
 * computing what transformers.js's Qwen2VLImageProcessor and Qwen2VLProcessor compute:
 *
 * - an image is decoded with sharp into 8-bit RGB and resized to the size `smartResize` gives
 *   (both edges multiples of patch_size × merge_size, the area within min_pixels and max_pixels)
 *   the way transformers.js's RawImage resizes under Node: an affine scale with the resample
 *   kernel (Lanczos through sharp's resize);
 * - it is rescaled and normalized, each step stored as float32 as transformers.js stores it;
 * - its frames (an image is one frame) are padded to a multiple of temporal_patch_size by
 *   repeating the last, then cut into patches in the order the vision encoder merges them:
 *   for each temporal patch, the merge × merge blocks in row-major order, within a block its
 *   patches in row-major order; each patch is [channel, frame, y, x] flattened. That is
 *   pixel_values [grid_t·grid_h·grid_w, C·temporal·patch·patch] and grid_thw [t, h, w];
 * - each <|image_pad|> (<|video_pad|>) of a prompt stands for grid_t·grid_h·grid_w ÷ merge²
 *   tokens, one per merged block.
 *
 * Images are always read as RGB (do_convert_rgb, true in every Qwen2-VL config, is not read).
 *
 * Where transformers (Python) differs, transformers.js is followed, since it is the reference the
 * platform's answers are checked against: `smartResize` rounds halves up (Python's round() rounds
 * them to even: an edge of 70 pixels is 84 here, 56 there), and an image with an edge under the
 * factor is first scaled up so that its short edge is the factor (Python does not).
 */

const Count = Schema.Int.pipe(Schema.positive())
const PerChannel = Schema.Union(Schema.Number, Schema.Tuple(Schema.Number, Schema.Number, Schema.Number))
const openAiClipMean = [0.48145466, 0.4578275, 0.40821073] as const
const openAiClipStd = [0.26862954, 0.26130258, 0.27577711] as const

/**
 * preprocessor_config.json of a Qwen2-VL model. Defaults are those of transformers' (Python)
 * Qwen2VLImageProcessor, whose configs often leave them out; transformers.js needs them spelled
 * out (without them it neither resizes nor normalizes). min_frames and max_frames are the
 * defaults of its Qwen2VLVideoProcessor, fps 2 that of Qwen2.5-VL's processor and Qwen's own video
 * reader.
 */
export const Qwen2VLImageProcessorConfig = Schema.Struct({
  image_processor_type: Schema.optional(Schema.Literal("Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast")),
  min_pixels: Schema.optional(Count),
  max_pixels: Schema.optional(Count),
  /** Newer configs bound the area here (shortest_edge, longest_edge); older saves wrote min_pixels, max_pixels. */
  size: Schema.optional(
    Schema.Struct({
      shortest_edge: Schema.optional(Count),
      longest_edge: Schema.optional(Count),
      min_pixels: Schema.optional(Count),
      max_pixels: Schema.optional(Count)
    })
  ),
  patch_size: Schema.optionalWith(Count, { default: () => 14 }),
  temporal_patch_size: Schema.optionalWith(Count, { default: () => 2 }),
  merge_size: Schema.optionalWith(Count, { default: () => 2 }),
  do_resize: Schema.optionalWith(
    Schema.Literal(true).annotations({
      message: () => "must be true: the patch grid needs edges the merge size divides"
    }),
    { default: () => true as const }
  ),
  /** PIL's codes: 0 nearest, 1 Lanczos, 2 bilinear, 3 bicubic, 4 box and 5 Hamming (both done as bilinear). */
  resample: Schema.optionalWith(Schema.Literal(0, 1, 2, 3, 4, 5), { default: () => 3 as const }),
  do_rescale: Schema.optionalWith(Schema.Boolean, { default: () => true }),
  rescale_factor: Schema.optionalWith(Schema.Number, { default: () => 1 / 255 }),
  do_normalize: Schema.optionalWith(Schema.Boolean, { default: () => true }),
  image_mean: Schema.optionalWith(PerChannel, { default: () => openAiClipMean }),
  image_std: Schema.optionalWith(PerChannel, { default: () => openAiClipStd }),
  fps: Schema.optionalWith(Schema.Number.pipe(Schema.positive()), { default: () => 2 }),
  min_frames: Schema.optionalWith(Count, { default: () => 4 }),
  max_frames: Schema.optionalWith(Count, { default: () => 768 })
})
export type Qwen2VLImageProcessorConfig = typeof Qwen2VLImageProcessorConfig.Type

export interface Qwen2VLProcessor {
  readonly config: Qwen2VLImageProcessorConfig
  /** The area bounds, from min_pixels / max_pixels, else size, else 56·56 and 28·28·1280. */
  readonly minPixels: number
  readonly maxPixels: number
  /** Why the model's videos are refused, where they are (Qwen3-VL's: see VisionProcessor.ts); else it takes them. */
  readonly videoRefusal?: string
}

/** The processor a preprocessor_config.json (parsed) describes; one it cannot follow is refused, naming why. */
export const qwen2VLProcessor = (preprocessorConfig: unknown): Qwen2VLProcessor => {
  const config = Either.getOrThrowWith(
    decodeConfig(Qwen2VLImageProcessorConfig, preprocessorConfig ?? {}),
    (reason) =>
      new InvalidProcessorConfig({ file: preprocessorConfigFile, field: "", reason: `is not usable: ${reason}` })
  )
  const minPixels = config.min_pixels ?? config.size?.shortest_edge ?? config.size?.min_pixels ?? 56 * 56
  const maxPixels = config.max_pixels ?? config.size?.longest_edge ?? config.size?.max_pixels ?? 28 * 28 * 1280
  if (minPixels > maxPixels) {
    throw new InvalidProcessorConfig({
      file: preprocessorConfigFile,
      field: "min_pixels",
      reason: `is ${minPixels}, more than max_pixels (${maxPixels})`
    })
  }
  return { config, minPixels, maxPixels }
}

// ---------------------------------------------------------------------------------------------
// Sizes

/** An image too long for its width (or the other way round) for the vision encoder. */
export class ExtremeAspectRatio extends Schema.TaggedError<ExtremeAspectRatio>()("ExtremeAspectRatio", {
  width: Schema.Int,
  height: Schema.Int
}) {
  override get message() {
    const ratio = Math.max(this.width, this.height) / Math.min(this.width, this.height)
    return `an image of ${this.width}×${this.height} pixels has an aspect ratio of ${ratio.toFixed(1)}; Qwen2-VL takes at most 200`
  }
}

/**
 * The size an image of `height` × `width` is resized to: each edge rounded to a multiple of
 * `factor`, then, if the area is over `maxPixels` (under `minPixels`), both edges scaled down
 * (up) by the same factor and rounded down (up) to multiples of `factor`. An image with an edge
 * under `factor` is first scaled up so that its short edge is `factor`. An aspect ratio over 200
 * is refused.
 */
export const smartResize = (
  height: number,
  width: number,
  factor = 28,
  minPixels = 56 * 56,
  maxPixels = 28 * 28 * 1280
): { readonly height: number; readonly width: number } => {
  let h = height
  let w = width
  if (h < factor || w < factor) {
    const scale = Math.max(factor / h, factor / w)
    h = Math.round(h * scale)
    w = Math.round(w * scale)
  }
  if (Math.max(h, w) / Math.min(h, w) > 200) throw new ExtremeAspectRatio({ width, height })
  const hBar = Math.round(h / factor) * factor
  const wBar = Math.round(w / factor) * factor
  if (hBar * wBar > maxPixels) {
    const beta = Math.sqrt((h * w) / maxPixels)
    return {
      height: Math.max(factor, Math.floor(h / beta / factor) * factor),
      width: Math.max(factor, Math.floor(w / beta / factor) * factor)
    }
  }
  if (hBar * wBar < minPixels) {
    const beta = Math.sqrt(minPixels / (h * w))
    return { height: Math.ceil((h * beta) / factor) * factor, width: Math.ceil((w * beta) / factor) * factor }
  }
  return { height: hBar, width: wBar }
}

// ---------------------------------------------------------------------------------------------
// Pixels

/** Per-request bounds on the area an image or video frame is resized within (the config's otherwise). */
export interface PixelBounds {
  readonly minPixels?: number
  readonly maxPixels?: number
}

/** A request's processor settings, checked: the area bounds and the video sampling rate it asks for. */
export interface Qwen2VLRequestSettings {
  readonly bounds: PixelBounds
  readonly fps?: number
}

/**
 * A request's settings (vLLM's mm_processor_kwargs: min_pixels, max_pixels, fps) within the
 * model's: max_pixels at most the model's (which bounds what an image may cost), min_pixels at
 * least one merged patch and at most the max. Answers the reason when they are not.
 */
export const qwen2VLRequestSettings = (
  processor: Qwen2VLProcessor,
  options: {
    readonly min_pixels?: number | undefined
    readonly max_pixels?: number | undefined
    readonly fps?: number | undefined
  }
): Qwen2VLRequestSettings | string => {
  const factor = processor.config.patch_size * processor.config.merge_size
  const max = options.max_pixels ?? processor.maxPixels
  const min = options.min_pixels ?? Math.min(processor.minPixels, max)
  if (max > processor.maxPixels)
    return `mm_processor_kwargs.max_pixels is ${max}; this model takes at most ${processor.maxPixels}`
  if (min < factor * factor) return `mm_processor_kwargs.min_pixels is ${min}; it must be at least ${factor * factor}`
  if (min > max) return `mm_processor_kwargs.min_pixels (${min}) is more than max_pixels (${max})`
  return {
    bounds: { minPixels: min, maxPixels: max },
    ...(options.fps === undefined ? {} : { fps: options.fps })
  }
}

export interface Qwen2VLImageOptions extends PixelBounds, DecodeOptions {}

/** [t, h, w]: temporal patches, and patch rows and columns, as image_grid_thw / video_grid_thw hold them. */
export type GridThw = readonly [t: number, h: number, w: number]

/** What the vision encoder takes for one image or video. */
export interface Qwen2VLVisionInputs {
  /** float32 [grid_t·grid_h·grid_w, channels·temporal_patch_size·patch_size²], row-major. */
  readonly pixelValues: Float32Array
  readonly grid: GridThw
  /** The length of a row of pixelValues. */
  readonly patchDim: number
}

/**
 * Frames of one size (at least one; edges multiples of patch_size × merge_size) → the patches,
 * normalized on the way. Frames past the last, up to a multiple of temporal_patch_size, repeat it.
 */
export const patchFrames = (
  config: Qwen2VLImageProcessorConfig,
  frames: ReadonlyArray<RgbImage>
): Qwen2VLVisionInputs => {
  const { temporal_patch_size: temporal, patch_size: patch, merge_size: merge } = config
  const { width, height } = frames[0]!
  const gridT = Math.ceil(frames.length / temporal)
  const gridH = height / patch
  const gridW = width / patch
  const patchDim = 3 * temporal * patch * patch
  const tables = levelTables(config)
  const out = new Float32Array(gridT * gridH * gridW * patchDim)
  let o = 0
  for (let t = 0; t < gridT; t++) {
    const group = Array.from(
      { length: temporal },
      (_, i) => frames[Math.min(t * temporal + i, frames.length - 1)]!.data
    )
    for (let blockRow = 0; blockRow < gridH / merge; blockRow++) {
      for (let blockCol = 0; blockCol < gridW / merge; blockCol++) {
        for (let row = 0; row < merge; row++) {
          for (let col = 0; col < merge; col++) {
            const top = (blockRow * merge + row) * patch
            const left = (blockCol * merge + col) * patch
            for (let c = 0; c < 3; c++) {
              const table = tables[c]!
              for (const frame of group) {
                for (let y = 0; y < patch; y++) {
                  let source = ((top + y) * width + left) * 3 + c
                  for (let x = 0; x < patch; x++, source += 3) out[o++] = table[frame[source]!]!
                }
              }
            }
          }
        }
      }
    }
  }
  return { pixelValues: out, grid: [gridT, gridH, gridW], patchDim }
}

/** The size a frame of `image`'s size is resized to, within the bounds (the processor's where not given). */
export const qwen2VLFrameSize = (
  processor: Qwen2VLProcessor,
  image: { readonly height: number; readonly width: number },
  bounds: PixelBounds = {}
) =>
  smartResize(
    image.height,
    image.width,
    processor.config.patch_size * processor.config.merge_size,
    bounds.minPixels ?? processor.minPixels,
    bounds.maxPixels ?? processor.maxPixels
  )

/** One image (encoded bytes that sharp reads, or 8-bit RGB) → pixel_values and image_grid_thw. */
export const qwen2VLImageInputs = async (
  processor: Qwen2VLProcessor,
  image: Uint8Array | RgbImage,
  options: Qwen2VLImageOptions = {}
): Promise<Qwen2VLVisionInputs> => {
  const rgb = image instanceof Uint8Array ? await decodeRgb(image, options) : image
  const resized = await resizeRgb(rgb, qwen2VLFrameSize(processor, rgb, options), processor.config.resample)
  return patchFrames(processor.config, [resized])
}

// ---------------------------------------------------------------------------------------------
// Video

/**
 * Vision tokens one video may take in a model of `maxPositions` positions: half of them, at most
 * 16,384. Frames are made smaller to fit, as Qwen's video reader bounds a video's total pixels.
 */
export const qwen2VLVideoTokenBudget = (maxPositions: number | undefined): number =>
  Math.min(16384, Math.floor((maxPositions ?? 32768) / 2))

export interface VideoSampling {
  /** Frames per second to sample; the config's fps otherwise. */
  readonly fps?: number
  /** The frame budget: at most this many frames; the config's max_frames otherwise. */
  readonly maxFrames?: number
}

/**
 * Which frames of a video of `totalFrames` frames at `videoFps` to keep, by the rule of
 * transformers' Qwen2VLVideoProcessor.sample_frames when sampling by fps:
 *
 *     budget = ⌊min(max_frames, totalFrames) / temporal_patch_size⌋ · temporal_patch_size
 *     n      = min(max(totalFrames / videoFps · fps, min_frames), budget, totalFrames)
 *     n      = ⌊n / temporal_patch_size⌋ · temporal_patch_size
 *     frame i of n is ⌊i · totalFrames / n⌋
 *
 * (the indices torch.arange(0, total, total / n) truncates to, computed exactly). A video shorter
 * than one temporal patch, where Python divides by zero, keeps all its frames; the patcher then
 * repeats the last.
 */
export const sampleVideoFrames = (
  processor: Qwen2VLProcessor,
  video: { readonly totalFrames: number; readonly videoFps: number },
  sampling: VideoSampling = {}
): ReadonlyArray<number> => {
  const { temporal_patch_size: temporal, min_frames: minFrames } = processor.config
  const { totalFrames, videoFps } = video
  const fps = sampling.fps ?? processor.config.fps
  const maxFrames = sampling.maxFrames ?? processor.config.max_frames
  const budget = Math.floor(Math.min(maxFrames, totalFrames) / temporal) * temporal
  const wanted = Math.min(Math.max((totalFrames / videoFps) * fps, minFrames), budget, totalFrames)
  const count = Math.floor(wanted / temporal) * temporal
  if (count === 0) return Array.from({ length: totalFrames }, (_, i) => i)
  return Array.from({ length: count }, (_, i) => Math.floor((i * totalFrames) / count))
}

/**
 * A video's frames (decoded, already sampled, in order; 8-bit RGB) → pixel_values_videos and
 * video_grid_thw. Every frame is resized to the size `smartResize` gives the first.
 */
export const qwen2VLVideoInputs = async (
  processor: Qwen2VLProcessor,
  frames: ReadonlyArray<RgbImage>,
  bounds: PixelBounds = {}
): Promise<Qwen2VLVisionInputs> => {
  const first = frames[0]
  if (first === undefined) throw new Error("a video needs at least one frame")
  const size = qwen2VLFrameSize(processor, first, bounds)
  const resized = await Promise.all(frames.map((frame) => resizeRgb(frame, size, processor.config.resample)))
  return patchFrames(processor.config, resized)
}

// ---------------------------------------------------------------------------------------------
// Prompts

/** How many pad tokens (merged vision features) an image or video of this grid takes. */
export const visionTokenCount = (grid: GridThw, mergeSize: number): number =>
  (grid[0] * grid[1] * grid[2]) / (mergeSize * mergeSize)

/** A prompt whose <|image_pad|> (<|video_pad|>) tokens do not match the images (videos) sent with it. */
export class VisionPlaceholderMismatch extends Schema.TaggedError<VisionPlaceholderMismatch>()(
  "VisionPlaceholderMismatch",
  { kind: Schema.Literal("image", "video"), placeholders: Schema.Int, items: Schema.Int }
) {
  override get message() {
    return `the prompt has ${this.placeholders} <|${this.kind}_pad|> placeholder(s) for ${this.items} ${this.kind}(s)`
  }
}

/** The ids of the tokens that stand for images and videos in a prompt (config.json's image_token_id, video_token_id). */
export interface VisionPadTokens {
  readonly imagePad: number
  readonly videoPad: number
}

/** The grids of a prompt's images and videos, each in the order they appear. */
export interface VisionGrids {
  readonly images: ReadonlyArray<GridThw>
  readonly videos: ReadonlyArray<GridThw>
}

/**
 * A tokenized prompt with one <|image_pad|> per image and one <|video_pad|> per video → the
 * prompt the model reads: the n-th image's pad repeated `visionTokenCount` of the n-th grid times,
 * and so for videos.
 */
export const expandVisionPads = (
  ids: ReadonlyArray<number>,
  pads: VisionPadTokens,
  grids: VisionGrids,
  mergeSize: number
): Array<number> => {
  const count = (id: number) => ids.reduce((n, token) => n + (token === id ? 1 : 0), 0)
  for (const [kind, id, items] of [
    ["image", pads.imagePad, grids.images],
    ["video", pads.videoPad, grids.videos]
  ] as const) {
    const placeholders = count(id)
    if (placeholders !== items.length) throw new VisionPlaceholderMismatch({ kind, placeholders, items: items.length })
  }
  const next = { image: 0, video: 0 }
  const out: Array<number> = []
  for (const token of ids) {
    const grid =
      token === pads.imagePad
        ? grids.images[next.image++]
        : token === pads.videoPad
          ? grids.videos[next.video++]
          : undefined
    if (grid === undefined) out.push(token)
    else for (let i = visionTokenCount(grid, mergeSize); i > 0; i--) out.push(token)
  }
  return out
}
