import { sharp } from "../../../models/Sharp.js"
import { type ResizeTarget, type RgbImage, resizeRgb } from "../../../models/ImageProcessor.js"
import { MediaError, MediaTooLarge } from "./errors.js"
import { defaultMediaLimits, type MediaLimits } from "./MediaLimits.js"
import { audioDemuxerOf, decodeAudioContainer } from "./AudioContainer.js"
import { resample } from "./Resampler.js"
import { containerDemuxerOf, decodeContainerFrames } from "./VideoContainer.js"

export const describeSharpError = (error: unknown, what: string, maxPixels: number): MediaError | MediaTooLarge => {
  const message = error instanceof Error ? error.message : String(error)
  if (/pixel limit/i.test(message))
    return new MediaTooLarge({ message: `the ${what} has more than ${maxPixels} pixels` })
  return new MediaError({ message: `the ${what} could not be decoded: ${message}` })
}

/** Decodes an image (PNG, JPEG, WebP, GIF, …), drops alpha, and resizes it once to the target. */
export const decodeImage = async (
  bytes: Buffer,
  target: ResizeTarget,
  limits: MediaLimits = defaultMediaLimits,
  page = 0
): Promise<RgbImage> => {
  try {
    return await resizeRgb(sharp(bytes, { limitInputPixels: limits.maxImagePixels, page }), target)
  } catch (error) {
    throw describeSharpError(error, "image", limits.maxImagePixels)
  }
}

/** Indices of `count` frames spread evenly over `total` (all of them when there are few enough). */
export const sampleFrameIndices = (total: number, count: number): ReadonlyArray<number> => {
  if (total <= count) return Array.from({ length: total }, (_, index) => index)
  if (count === 1) return [0]
  return Array.from({ length: count }, (_, index) => Math.round((index * (total - 1)) / (count - 1)))
}

/**
 * Frames of a video: at most `maxFrames`, evenly sampled (`sampleFrameIndices`), each resized to
 * the target. A video container (mp4, mov, webm; told by its first bytes, not its declared type) is
 * decoded by ffmpeg (VideoContainer.ts), anything else by sharp as an animated image (GIF or WebP);
 * a still image is a one-frame video. Either way the header is read first: a video with too many
 * frames, or too many pixels, or (a container) too long, is refused before any frame is decoded
 * (reaching a frame decodes the frames before it).
 */
export const decodeVideoFrames = async (
  bytes: Buffer,
  target: ResizeTarget,
  maxFrames: number,
  limits: MediaLimits = defaultMediaLimits
): Promise<ReadonlyArray<RgbImage>> => {
  const demuxer = containerDemuxerOf(bytes)
  if (demuxer !== undefined) {
    return decodeContainerFrames(
      bytes,
      demuxer,
      limits,
      (video) => sampleFrameIndices(video.frameCount, maxFrames),
      (frame) =>
        resizeRgb(sharp(frame.data, { raw: { width: frame.width, height: frame.height, channels: 3 } }), target)
    )
  }
  let pages: number
  try {
    // Animated, sharp sees all the frames as one tall image, so its pixel limit counts them all.
    pages = (await sharp(bytes, { limitInputPixels: limits.maxImagePixels, animated: true }).metadata()).pages ?? 1
  } catch (error) {
    throw describeSharpError(error, "video (all its frames together)", limits.maxImagePixels)
  }
  if (pages > limits.maxAnimationFrames) {
    throw new MediaTooLarge({
      message: `the video has ${pages} frames, more than the limit of ${limits.maxAnimationFrames}`
    })
  }
  return Promise.all(sampleFrameIndices(pages, maxFrames).map((page) => decodeImage(bytes, target, limits, page)))
}

/** The sample rates a WAV file may declare: those recorders and codecs use, from telephony to studio. */
export const wavSampleRates = { min: 8_000, max: 192_000 } as const

/** Refuses audio longer than the limit, from its length alone, before any sample is decoded or resampled. */
const checkDuration = (frames: number, sampleRate: number, limits: MediaLimits) => {
  const seconds = frames / sampleRate
  if (seconds > limits.maxAudioSeconds) {
    throw new MediaTooLarge({
      message: `the audio lasts ${seconds.toFixed(1)} s, longer than the limit of ${limits.maxAudioSeconds} s`
    })
  }
}

const sampleReader = (bytes: Buffer, code: number, bits: number): ((at: number) => number) | undefined =>
  code === 3 && bits === 32
    ? (at) => bytes.readFloatLE(at)
    : code === 1 && bits === 16
      ? (at) => bytes.readInt16LE(at) / 32768
      : code === 1 && bits === 24
        ? (at) => bytes.readIntLE(at, 3) / 8388608
        : code === 1 && bits === 32
          ? (at) => bytes.readInt32LE(at) / 2147483648
          : code === 1 && bits === 8
            ? (at) => (bytes.readUInt8(at) - 128) / 128
            : undefined

const readWav = (
  bytes: Buffer,
  limits: MediaLimits
): { readonly samples: Float32Array; readonly sampleRate: number } => {
  if (bytes.length < 12 || bytes.toString("ascii", 0, 4) !== "RIFF" || bytes.toString("ascii", 8, 12) !== "WAVE") {
    throw new MediaError({ message: "the audio is not a WAV file (RIFF/WAVE header missing)" })
  }
  let offset = 12
  let format: { code: number; channels: number; sampleRate: number; bits: number } | undefined
  while (offset + 8 <= bytes.length) {
    const id = bytes.toString("ascii", offset, offset + 4)
    const size = bytes.readUInt32LE(offset + 4)
    const body = offset + 8
    if (id === "fmt ") {
      if (size < 16 || body + size > bytes.length)
        throw new MediaError({ message: "the WAV file's format chunk is cut short" })
      format = {
        code: bytes.readUInt16LE(body),
        channels: bytes.readUInt16LE(body + 2),
        sampleRate: bytes.readUInt32LE(body + 4),
        bits: bytes.readUInt16LE(body + 14)
      }
      if (format.code === 0xfffe && size >= 26) format.code = bytes.readUInt16LE(body + 24)
    } else if (id === "data") {
      if (format === undefined) throw new MediaError({ message: "the WAV file has its data before its format" })
      const { code, channels, sampleRate, bits } = format
      if (channels < 1) throw new MediaError({ message: "the WAV file has no channels" })
      if (sampleRate < wavSampleRates.min || sampleRate > wavSampleRates.max) {
        throw new MediaError({
          message: `the WAV file's sample rate of ${sampleRate} Hz is outside ${wavSampleRates.min}–${wavSampleRates.max} Hz`
        })
      }
      const read = sampleReader(bytes, code, bits)
      if (read === undefined)
        throw new MediaError({ message: `WAV sample format ${code} with ${bits} bits is not supported` })
      const width = bits / 8
      // A data chunk may declare more than the file holds (a truncated or streamed recording): what is there counts.
      const end = Math.min(bytes.length, body + size)
      const frames = Math.floor((end - body) / (width * channels))
      checkDuration(frames, sampleRate, limits)
      const samples = new Float32Array(frames)
      for (let frame = 0; frame < frames; frame++) {
        let sum = 0
        for (let channel = 0; channel < channels; channel++) sum += read(body + (frame * channels + channel) * width)
        samples[frame] = sum / channels
      }
      return { samples, sampleRate }
    }
    offset = body + size + (size % 2)
  }
  throw new MediaError({ message: "the WAV file has no data chunk" })
}

/**
 * Mono float samples at `sampleRate` from raw PCM16 (`audio/pcm16`, taken to be at `sampleRate`),
 * a WAV file (8/16/24/32-bit PCM or 32-bit float, any channel count, mixed down; read here), or
 * mp3, AAC, ogg (Vorbis, Opus), flac, m4a or webm (decoded by ffmpeg, AudioContainer.ts), told
 * apart by their first bytes; resampled to `sampleRate` band-limited (Resampler.ts for WAV,
 * ffmpeg's own while decoding the others).
 */
export const decodeAudio = async (
  bytes: Buffer,
  mimeType: string | undefined,
  sampleRate: number,
  limits: MediaLimits = defaultMediaLimits
): Promise<Float32Array> => {
  if (mimeType === "audio/pcm16" || mimeType === "audio/l16") {
    const frames = Math.floor(bytes.length / 2)
    checkDuration(frames, sampleRate, limits)
    const samples = new Float32Array(frames)
    for (let index = 0; index < samples.length; index++) samples[index] = bytes.readInt16LE(index * 2) / 32768
    return samples
  }
  const demuxer = audioDemuxerOf(bytes)
  if (demuxer === undefined) {
    throw new MediaError({
      message: "the audio is not in a format this executor reads: WAV, mp3, AAC, ogg (Vorbis, Opus), flac, m4a or webm"
    })
  }
  if (demuxer !== "wav") return decodeAudioContainer(bytes, demuxer, sampleRate, limits)
  const wav = readWav(bytes, limits)
  return resample(wav.samples, wav.sampleRate, sampleRate)
}
