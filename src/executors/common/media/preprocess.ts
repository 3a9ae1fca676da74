/**
 * Media preprocessing, run in a router's thread pool (Eric's, and the LLM executor's for the
 * model's own encoders): decoded media → the encoder's inputs, as the model's
 * preprocessor_config.json says. Each function answers stackable tensors: one row per image, per
 * video frame, or per audio clip. Without `limits`, the defaults bound the decoding.
 */
import { type AudioProcessorConfig, inputValues } from "../../../models/AudioProcessor.js"
import { type Idefics3ImageProcessorConfig, idefics3ImageFrames } from "../../../models/Idefics3Processor.js"
import { type ImageProcessorConfig, normalizePixels, resizeTarget } from "../../../models/ImageProcessor.js"
import type { WireTensor } from "../wire.js"
import { decodeAudio, decodeImage, decodeVideoFrames, describeSharpError } from "./MediaDecoder.js"
import { defaultMediaLimits, type MediaLimits } from "./MediaLimits.js"

/** An image split into rows × cols tiles plus a global image (0 × 0: one frame, not split). */
export interface TileGrid {
  readonly rows: number
  readonly cols: number
}

export interface Preprocessed {
  readonly inputs: Readonly<Record<string, WireTensor>>
  /** Idefics3 images: how the frames tile the image, which the prompt spells out. */
  readonly grid?: TileGrid
}

const stackFrames = (frames: ReadonlyArray<Float32Array>, height: number, width: number): WireTensor => {
  const data = new Float32Array(frames.length * 3 * height * width)
  frames.forEach((frame, index) => data.set(frame, index * frame.length))
  return { dtype: "float32", shape: [frames.length, 3, height, width], data }
}

const bufferOf = (bytes: Uint8Array) => Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength)

export const image = async (input: {
  readonly bytes: Uint8Array
  readonly config: ImageProcessorConfig
  readonly limits?: MediaLimits
}): Promise<Preprocessed> => {
  const { height, width } = input.config.size
  const decoded = await decodeImage(bufferOf(input.bytes), resizeTarget(input.config), input.limits)
  return {
    inputs: {
      pixel_values: { dtype: "float32", shape: [1, 3, height, width], data: normalizePixels(input.config, decoded) }
    }
  }
}

/** An image as Idefics3 (SmolVLM) takes it: pixel_values [frames, 3, tile, tile], its tiles then the global image. */
export const idefics3Image = async (input: {
  readonly bytes: Uint8Array
  readonly config: Idefics3ImageProcessorConfig
  readonly limits?: MediaLimits
}): Promise<Preprocessed> => {
  const maxPixels = (input.limits ?? defaultMediaLimits).maxImagePixels
  let frames: Awaited<ReturnType<typeof idefics3ImageFrames>>
  try {
    frames = await idefics3ImageFrames(input.config, input.bytes, { limitInputPixels: maxPixels })
  } catch (error) {
    if ((error as { readonly _tag?: string })._tag === "InvalidProcessorConfig") throw error
    throw describeSharpError(error, "image", maxPixels)
  }
  return {
    inputs: {
      pixel_values: {
        dtype: "float32",
        shape: [frames.frameCount, 3, frames.tile, frames.tile],
        data: frames.frames
      }
    },
    grid: { rows: frames.rows, cols: frames.cols }
  }
}

export const video = async (input: {
  readonly bytes: Uint8Array
  readonly config: ImageProcessorConfig
  readonly maxFrames: number
  readonly limits?: MediaLimits
}): Promise<Preprocessed> => {
  const { height, width } = input.config.size
  const frames = await decodeVideoFrames(
    bufferOf(input.bytes),
    resizeTarget(input.config),
    input.maxFrames,
    input.limits
  )
  const values = frames.map((frame) => normalizePixels(input.config, frame))
  return { inputs: { pixel_values: stackFrames(values, height, width) } }
}

export const audio = (input: {
  readonly bytes: Uint8Array
  readonly mimeType: string | undefined
  readonly config: AudioProcessorConfig
  readonly limits?: MediaLimits
}): Preprocessed => {
  const samples = decodeAudio(bufferOf(input.bytes), input.mimeType, input.config.sampling_rate, input.limits)
  const values = inputValues(input.config, samples, input.config.sampling_rate)
  return { inputs: { input_values: { dtype: "float32", shape: [1, values.length], data: values } } }
}
