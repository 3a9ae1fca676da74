/**
 * Media preprocessing, run in a router's thread pool (Eric's, and the LLM executor's for the
 * model's own encoders): decoded media → the encoder's inputs, as the model's
 * preprocessor_config.json says. Each function answers stackable tensors: one row per image, per
 * video frame, or per audio clip. Without `limits`, the defaults bound the decoding.
 */
import { windowingProblems, windowingText } from "../../../app-runtime/schemas/Transcriptions.js"
import { type AudioProcessorConfig, inputValues } from "../../../models/AudioProcessor.js"
import { type FixedSizePixels, fixedSizePixelValues } from "../../../models/FixedSizeImage.js"
import { type Idefics3ImageProcessorConfig, idefics3ImageFrames } from "../../../models/Idefics3Processor.js"
import { type ImageProcessorConfig, normalizePixels, resizeTarget } from "../../../models/ImageProcessor.js"
import {
  type GridThw,
  type PixelBounds,
  patchFrames,
  type Qwen2VLProcessor,
  qwen2VLFrameSize,
  qwen2VLImageInputs,
  type Qwen2VLVisionInputs,
  resizeRgb as resizeQwen2VLFrame,
  sampleVideoFrames
} from "../../../models/Qwen2VLProcessor.js"
import { type UltravoxAudio, ultravoxAudioRows } from "../../../models/UltravoxProcessor.js"
import { voxtralAudioRows, voxtralAudioValues } from "../../../models/VoxtralProcessor.js"
import { whisperFeatureExtractor, whisperFeatures } from "../../../models/WhisperFeatures.js"
import { audioWindows, maxSpeechWindows } from "../../../models/WhisperGeneration.js"
import { BadRequest } from "../errors.js"
import type { WireTensor } from "../wire.js"
import { MediaError } from "./errors.js"
import { decodeAudio, decodeImage, decodeVideoFrames, describeSharpError } from "./MediaDecoder.js"
import { defaultMediaLimits, type MediaLimits } from "./MediaLimits.js"
import { containerDemuxerOf, decodeContainerFrames } from "./VideoContainer.js"

/** An image split into rows × cols tiles plus a global image (0 × 0: one frame, not split). */
export interface TileGrid {
  readonly rows: number
  readonly cols: number
}

export interface Preprocessed {
  readonly inputs: Readonly<Record<string, WireTensor>>
  /** Idefics3 images: how the frames tile the image, which the prompt spells out. */
  readonly grid?: TileGrid
  /** Qwen2-VL images and videos: [temporal patches, patch rows, patch columns], the encoder's grid_thw. */
  readonly thw?: GridThw
  /** Ultravox and Voxtral audio: the rows its encoder gives, which its placeholder is repeated for. */
  readonly rows?: number
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

export const audio = async (input: {
  readonly bytes: Uint8Array
  readonly mimeType: string | undefined
  readonly config: AudioProcessorConfig
  readonly limits?: MediaLimits
}): Promise<Preprocessed> => {
  const samples = await decodeAudio(bufferOf(input.bytes), input.mimeType, input.config.sampling_rate, input.limits)
  const values = inputValues(input.config, samples, input.config.sampling_rate)
  return { inputs: { input_values: { dtype: "float32", shape: [1, values.length], data: values } } }
}

const qwen2VLPreprocessed = (inputs: Qwen2VLVisionInputs): Preprocessed => ({
  inputs: {
    pixel_values: {
      dtype: "float32",
      shape: [inputs.pixelValues.length / inputs.patchDim, inputs.patchDim],
      data: inputs.pixelValues
    }
  },
  thw: inputs.grid
})

/** A refusal of the processor's (an image too long for its width) as the request's media error. */
const asMediaError = (error: unknown): never => {
  if ((error as { readonly _tag?: string })._tag === "ExtremeAspectRatio")
    throw new MediaError({ message: (error as Error).message })
  throw error
}

/** Each thread builds a model's feature extractor once (its FFT tables and mel filters). */
const extractors = new Map<string, ReturnType<typeof whisperFeatureExtractor>>()

/** The Whisper feature extractor of a preprocessor_config.json. */
const extractorOf = (preprocessorConfig: unknown) => {
  const key = JSON.stringify(preprocessorConfig)
  let extractor = extractors.get(key)
  if (extractor === undefined) {
    extractor = whisperFeatureExtractor(preprocessorConfig)
    extractors.set(key, extractor)
  }
  return extractor
}

/** One window of a clip as Whisper reads it: its features [mel bins × frames] (30 s, padded) and its strides. */
export interface SpeechWindow {
  readonly features: Float32Array
  /** Seconds: [window length, left stride, right stride]. */
  readonly stride: readonly [number, number, number]
}

/**
 * A clip as Whisper's ASR pipeline reads it: decoded at the extractor's rate, cut in windows of
 * `chunkSeconds` overlapping by `strideSeconds` (one window when 0), each window's features
 * padded to the extractor's 30 s. Without `chunkSeconds`, a clip longer than the extractor's window
 * is cut in windows of that length, and a shorter one is one window. Windows that do not move on a
 * quarter of their length, or more windows than a clip of the longest audio the limits take cut in
 * whole windows, are the request's fault (BadRequest), refused before any window's features are
 * computed.
 */
export const speechWindows = async (input: {
  readonly bytes: Uint8Array
  readonly mimeType: string | undefined
  readonly preprocessorConfig: unknown
  readonly chunkSeconds?: number
  readonly strideSeconds?: number
  readonly limits?: MediaLimits
}): Promise<{ readonly duration: number; readonly windows: ReadonlyArray<SpeechWindow> }> => {
  const extractor = extractorOf(input.preprocessorConfig)
  const rate = extractor.samplingRate
  const windowSeconds = extractor.nSamples / rate
  const problems = windowingProblems(
    { chunk_length_s: input.chunkSeconds, stride_length_s: input.strideSeconds },
    windowSeconds
  )
  if (problems.length > 0) throw new BadRequest({ message: windowingText(problems) })
  const limits = input.limits ?? defaultMediaLimits
  const samples = await decodeAudio(bufferOf(input.bytes), input.mimeType, rate, limits)
  if (samples.length < 2) throw new MediaError({ message: "the audio is too short to have features" })
  const chunkSeconds = input.chunkSeconds ?? (samples.length > extractor.nSamples ? windowSeconds : 0)
  const cut = audioWindows(samples.length, rate, chunkSeconds, input.strideSeconds)
  const most = maxSpeechWindows(limits.maxAudioSeconds, windowSeconds)
  if (cut.length > most) {
    const asked = `chunk_length_s ${chunkSeconds}${input.strideSeconds === undefined ? "" : ` and stride_length_s ${input.strideSeconds}`}`
    const seconds = (samples.length / rate).toFixed(1)
    throw new BadRequest({
      message:
        `${asked} cut this ${seconds} s clip in ${cut.length} windows, and a request may have at most ${most} ` +
        `(each is ${windowSeconds} s of features): ask for a longer chunk_length_s or a shorter stride_length_s, ` +
        "or send a shorter clip"
    })
  }
  const windows = cut.map((window) => {
    const clip = samples.subarray(Math.trunc(window.from), Math.trunc(window.to))
    return {
      features: whisperFeatures(extractor, clip).data,
      stride: [clip.length / rate, window.strideLeft / rate, window.strideRight / rate] as const
    }
  })
  return { duration: samples.length / rate, windows }
}

/**
 * An image as a vision encoder of one input size takes it (Gemma 3's, LLaVA-OneVision's), as
 * transformers.js's base ImageProcessor makes it: pixel_values [1, 3, height, width].
 */
export const fixedSizeImage = async (input: {
  readonly bytes: Uint8Array
  readonly config: FixedSizePixels
  readonly limits?: MediaLimits
}): Promise<Preprocessed> => {
  const maxPixels = (input.limits ?? defaultMediaLimits).maxImagePixels
  try {
    const { data, shape } = await fixedSizePixelValues(input.bytes, input.config, { limitInputPixels: maxPixels })
    return { inputs: { pixel_values: { dtype: "float32", shape: [...shape], data } } }
  } catch (error) {
    if ((error as { readonly _tag?: string })._tag !== undefined) return asMediaError(error)
    throw describeSharpError(error, "image", maxPixels)
  }
}

/** An image as Qwen2-VL takes it: its patches, pixel_values [patches, C·T·P·P], in merge-block order, and its grid. */
export const qwen2VLImage = async (input: {
  readonly bytes: Uint8Array
  readonly processor: Qwen2VLProcessor
  readonly limits?: MediaLimits
  /** The request's area bounds (checked by qwen2VLRequestSettings). */
  readonly bounds?: PixelBounds
}): Promise<Preprocessed> => {
  const maxPixels = (input.limits ?? defaultMediaLimits).maxImagePixels
  let inputs: Qwen2VLVisionInputs
  try {
    inputs = await qwen2VLImageInputs(input.processor, input.bytes, { ...input.bounds, limitInputPixels: maxPixels })
  } catch (error) {
    if ((error as { readonly _tag?: string })._tag !== undefined) return asMediaError(error)
    throw describeSharpError(error, "image", maxPixels)
  }
  return qwen2VLPreprocessed(inputs)
}

/** The most pixels a video frame is resized to, as Qwen's own video reader bounds it (VIDEO_MAX_PIXELS). */
const videoFrameMaxPixels = 768 * 28 * 28

/**
 * A video container (mp4, mov, webm) as Qwen2-VL takes it: frames sampled at the processor's fps
 * within its frame budget, each resized to the size the first takes, cut into temporal patches.
 * As Qwen's video reader does, a frame's area is bounded so that the whole video takes at most
 * `maxTokens` vision tokens (and at most 768·28·28 pixels a frame).
 */
export const qwen2VLVideo = async (input: {
  readonly bytes: Uint8Array
  readonly processor: Qwen2VLProcessor
  readonly maxTokens: number
  readonly limits?: MediaLimits
  /** The request's area bounds and sampling rate (checked by qwen2VLRequestSettings). */
  readonly bounds?: PixelBounds
  readonly fps?: number
}): Promise<Preprocessed> => {
  const { processor } = input
  if (processor.videoRefusal !== undefined) throw new MediaError({ message: processor.videoRefusal })
  const demuxer = containerDemuxerOf(input.bytes)
  if (demuxer === undefined) {
    throw new MediaError({ message: "a video for this model must be an mp4, mov or webm (Matroska) file" })
  }
  const { patch_size: patch, merge_size: merge, temporal_patch_size: temporal } = processor.config
  let size: { readonly height: number; readonly width: number } | undefined
  let frames: Array<Awaited<ReturnType<typeof resizeQwen2VLFrame>>>
  try {
    frames = await decodeContainerFrames(
      input.bytes,
      demuxer,
      input.limits ?? defaultMediaLimits,
      (video) => {
        const indices = sampleVideoFrames(
          processor,
          { totalFrames: video.frameCount, videoFps: video.frameRate },
          input.fps === undefined ? {} : { fps: input.fps }
        )
        const perFrame = Math.floor((input.maxTokens * temporal * (patch * merge) ** 2) / indices.length)
        const minPixels = input.bounds?.minPixels ?? processor.minPixels
        const ceiling = input.bounds?.maxPixels ?? processor.maxPixels
        const maxPixels = Math.max(minPixels, Math.min(ceiling, videoFrameMaxPixels, perFrame))
        size = qwen2VLFrameSize(processor, video, { minPixels, maxPixels })
        return indices
      },
      (frame) => resizeQwen2VLFrame(frame, size!, processor.config.resample)
    )
  } catch (error) {
    return asMediaError(error)
  }
  return qwen2VLPreprocessed(patchFrames(processor.config, frames))
}

/**
 * A clip as Ultravox takes it: decoded and resampled to the feature extractor's rate, its Whisper
 * features not padded (audio_values [1, mel bins, frames]), and the rows its encoder gives. A clip
 * longer than the extractor's window (30 s) is refused: the processor's features stop there, and
 * its rows would not match the encoder's.
 */
export const ultravoxAudio = async (input: {
  readonly bytes: Uint8Array
  readonly mimeType: string | undefined
  readonly preprocessorConfig: unknown
  readonly audio: Omit<UltravoxAudio, "extractor" | "kind">
  readonly limits?: MediaLimits
}): Promise<Preprocessed> => {
  const extractor = extractorOf(input.preprocessorConfig)
  const samples = await decodeAudio(bufferOf(input.bytes), input.mimeType, extractor.samplingRate, input.limits)
  if (samples.length > extractor.nSamples) {
    throw new MediaError({
      message: `the audio lasts ${(samples.length / extractor.samplingRate).toFixed(1)} s; this model takes at most ${extractor.nSamples / extractor.samplingRate} s a clip`
    })
  }
  if (samples.length < extractor.hopLength) throw new MediaError({ message: "the audio is too short to have features" })
  const { data, frames } = whisperFeatures(extractor, samples, { pad: false })
  return {
    inputs: { audio_values: { dtype: "float32", shape: [1, extractor.featureSize, frames], data } },
    rows: ultravoxAudioRows(input.audio, samples.length)
  }
}

/**
 * A clip as Voxtral takes it: decoded and resampled to the feature extractor's rate, cut in
 * chunks of its window (30 s), each chunk's Whisper features padded to the window
 * (audio_values [chunks, mel bins, frames]), and the rows its encoder gives (375 a chunk).
 */
export const voxtralAudio = async (input: {
  readonly bytes: Uint8Array
  readonly mimeType: string | undefined
  readonly preprocessorConfig: unknown
  readonly limits?: MediaLimits
}): Promise<Preprocessed> => {
  const extractor = extractorOf(input.preprocessorConfig)
  const samples = await decodeAudio(bufferOf(input.bytes), input.mimeType, extractor.samplingRate, input.limits)
  if (samples.length === 0) throw new MediaError({ message: "the audio has no samples" })
  const { data, chunks, frames } = voxtralAudioValues(extractor, samples)
  return {
    inputs: { audio_values: { dtype: "float32", shape: [chunks, extractor.featureSize, frames], data } },
    rows: voxtralAudioRows(chunks)
  }
}
