/**
 * Video containers (mp4, mov, webm and other Matroska) decoded by ffmpeg as a child process. The
 * bytes go to a private temporary file (an mp4 may keep its index at its end, which a pipe cannot
 * seek to); ffprobe reads the header first, and the limits are checked from it before any frame is
 * decoded; then one ffmpeg run decodes only the sampled frames to raw RGB on its stdout. Each run
 * is bounded as MediaProcess.ts bounds it (its turn, memory, time, lifetime), in output bytes, and
 * in what it may open: the demuxer is the one the bytes' signature names (never guessed by ffmpeg,
 * which knows playlists and other files that name other files), and the only protocol is `file`.
 *
 * The binaries: `CORNSERVE_FFMPEG` / `CORNSERVE_FFPROBE` when set, else the static builds that the
 * optional npm packages `@ffmpeg-installer/linux-x64` and `@ffprobe-installer/linux-x64` ship,
 * else `ffmpeg` / `ffprobe` on the PATH.
 */
import { accessSync, constants } from "node:fs"
import { writeFile } from "node:fs/promises"
import { createRequire } from "node:module"
import { dirname, join } from "node:path"
import type { RgbImage } from "../../../models/ImageProcessor.js"
import { MediaError, MediaTooLarge } from "./errors.js"
import { type MediaLimits, mediaProcessBounds, videoDecodeBytes } from "./MediaLimits.js"
import { mebibytes, type RunBounds, runBounded, withScratchDirectory } from "./MediaProcess.js"

/** ffmpeg's demuxer for each container family this module reads. */
export type ContainerDemuxer = "mov" | "matroska"

const ascii = (bytes: Uint8Array, from: number, to: number) => Buffer.from(bytes.subarray(from, to)).toString("latin1")

/** Brands of ISO media files that hold still images, which sharp reads (AVIF, HEIF). */
const imageBrands = new Set(["avif", "avis", "heic", "heix", "heim", "heis", "mif1", "msf1"])

/** QuickTime files may begin with an atom other than `ftyp`. */
const quickTimeAtoms = new Set(["moov", "mdat", "free", "wide", "skip"])

/**
 * The demuxer for a video container, from its first bytes: ISO media (mp4, mov, 3gp) or EBML
 * (Matroska, webm); undefined for anything else (GIF, WebP, PNG, … go to the image decoder).
 */
export const containerDemuxerOf = (bytes: Uint8Array): ContainerDemuxer | undefined => {
  if (bytes.length >= 4 && bytes[0] === 0x1a && bytes[1] === 0x45 && bytes[2] === 0xdf && bytes[3] === 0xa3)
    return "matroska"
  if (bytes.length < 12) return undefined
  const atom = ascii(bytes, 4, 8)
  if (atom === "ftyp") return imageBrands.has(ascii(bytes, 8, 12)) ? undefined : "mov"
  return quickTimeAtoms.has(atom) ? "mov" : undefined
}

export interface VideoTools {
  readonly ffmpeg: string
  readonly ffprobe: string
}

const packagedBinary = (pkg: string, name: string): string | undefined => {
  try {
    const path = join(dirname(createRequire(import.meta.url).resolve(`${pkg}/package.json`)), name)
    accessSync(path, constants.X_OK)
    return path
  } catch {
    return undefined
  }
}

let tools: VideoTools | undefined

/** The ffmpeg and ffprobe this process runs, found once. */
export const videoTools = (): VideoTools => {
  tools ??= {
    ffmpeg: process.env.CORNSERVE_FFMPEG || (packagedBinary("@ffmpeg-installer/linux-x64", "ffmpeg") ?? "ffmpeg"),
    ffprobe: process.env.CORNSERVE_FFPROBE || (packagedBinary("@ffprobe-installer/linux-x64", "ffprobe") ?? "ffprobe")
  }
  return tools
}

/** How long probing may take, and decoding the sampled frames. */
export const probeBounds: RunBounds = { timeoutMs: 10_000, maxStdoutBytes: 1024 * 1024 }
export const decodeTimeoutMs = 60_000

/** The last lines of ffmpeg's stderr, without the names of the executor's own files. */
export const lastLines = (stderr: string, path: string) =>
  stderr
    .replaceAll(path, "input")
    .trim()
    .split("\n")
    .slice(-3)
    .map((line) => line.replace(/^\[[^\]]*\]\s*/, "").trim())
    .filter((line) => line.length > 0)
    .join("; ")

/** What ffprobe reads from a container's header, and its packet count. */
export interface VideoProbe {
  readonly format: string
  readonly codec: string
  readonly width: number
  readonly height: number
  readonly durationSeconds: number
  /** Frames of the video stream: its packets, counted by demuxing (not decoding) the file. */
  readonly frameCount: number
  /** Frames the header declares, where it does (mp4 and mov do, Matroska does not). */
  readonly declaredFrameCount: number | undefined
  /** Frames per second, the stream's average (or its base rate where no average is given). */
  readonly frameRate: number
}

const rate = (text: unknown): number | undefined => {
  if (typeof text !== "string") return undefined
  const [numerator, denominator] = text.split("/").map(Number)
  const value = denominator === undefined ? numerator! : numerator! / denominator
  return Number.isFinite(value) && value > 0 ? value : undefined
}

export const positive = (value: unknown): number | undefined => {
  const number = typeof value === "string" || typeof value === "number" ? Number(value) : Number.NaN
  return Number.isFinite(number) && number > 0 ? number : undefined
}

/** What ffprobe read of a file: its container's fields and name, and the first stream it selected. */
export interface ProbedHeader {
  readonly format: string
  readonly container: Readonly<Record<string, unknown>>
  readonly stream: Readonly<Record<string, unknown>> | undefined
}

/**
 * ffprobe's JSON of the file at `path` read with `demuxer`: `entries` (its -show_entries) of the
 * first stream of `streams` (its -select_streams) and of the container. A file ffprobe cannot read
 * is a MediaError naming its reason.
 */
export const probeHeader = async (
  demuxer: string,
  path: string,
  what: "video" | "audio",
  streams: string,
  entries: string,
  extraArgs: ReadonlyArray<string> = []
): Promise<ProbedHeader> => {
  const chunks: Array<Buffer> = []
  const { code, stderr } = await runBounded(
    videoTools().ffprobe,
    [
      "-v",
      "error",
      "-select_streams",
      streams,
      ...extraArgs,
      "-show_entries",
      entries,
      "-of",
      "json",
      ...inputArgs(demuxer, path)
    ],
    { ...probeBounds, what },
    (chunk) => chunks.push(chunk)
  )
  if (code !== 0) {
    throw new MediaError({
      message: `the ${what} could not be read: ${lastLines(stderr, path) || `ffprobe exited with ${code}`}`
    })
  }
  let parsed: {
    readonly streams?: ReadonlyArray<Record<string, unknown>>
    readonly format?: Record<string, unknown>
  }
  try {
    parsed = JSON.parse(Buffer.concat(chunks).toString("utf8"))
  } catch {
    throw new MediaError({ message: `the ${what}'s header could not be read` })
  }
  const container = parsed.format ?? {}
  return {
    format: typeof container.format_name === "string" ? container.format_name : "unknown",
    container,
    stream: parsed.streams?.[0]
  }
}

const readProbe = ({ format, container, stream }: ProbedHeader): VideoProbe => {
  if (stream === undefined) throw new MediaError({ message: `the ${format} file has no video stream` })
  const width = positive(stream.width)
  const height = positive(stream.height)
  if (width === undefined || height === undefined) {
    throw new MediaError({ message: `the ${format} file's video stream declares no frame size` })
  }
  const durationSeconds = positive(stream.duration) ?? positive(container.duration)
  const frameRate = rate(stream.avg_frame_rate) ?? rate(stream.r_frame_rate)
  const declaredFrameCount = positive(stream.nb_frames)
  const frameCount = positive(stream.nb_read_packets) ?? declaredFrameCount
  if (frameCount === undefined) throw new MediaError({ message: `the ${format} file's video stream has no frames` })
  return {
    format,
    codec: typeof stream.codec_name === "string" ? stream.codec_name : "unknown",
    width,
    height,
    durationSeconds: durationSeconds ?? (frameRate === undefined ? 0 : frameCount / frameRate),
    frameCount,
    declaredFrameCount,
    frameRate: frameRate ?? (durationSeconds === undefined ? 1 : frameCount / durationSeconds)
  }
}

/** Refuses a video over the limits, from its probe alone. */
export const checkVideoLimits = (probe: VideoProbe, limits: MediaLimits): void => {
  const pixels = probe.width * probe.height
  if (pixels > limits.maxImagePixels) {
    throw new MediaTooLarge({
      message: `the video's frames are ${probe.width}×${probe.height}, more than the limit of ${limits.maxImagePixels} pixels`
    })
  }
  const decodeBytes = videoDecodeBytes(probe.width, probe.height)
  if (decodeBytes > mediaProcessBounds.addressSpaceBytes) {
    throw new MediaTooLarge({
      message: `the video's frames are ${probe.width}×${probe.height}: decoding them takes about ${mebibytes(decodeBytes)} MiB, more memory than the ${mebibytes(mediaProcessBounds.addressSpaceBytes)} MiB one decoder may take`
    })
  }
  if (probe.durationSeconds > limits.maxVideoSeconds) {
    throw new MediaTooLarge({
      message: `the video lasts ${probe.durationSeconds.toFixed(1)} s, longer than the limit of ${limits.maxVideoSeconds} s`
    })
  }
  const frames = Math.max(probe.frameCount, probe.declaredFrameCount ?? 0)
  if (frames > limits.maxVideoFrames) {
    throw new MediaTooLarge({
      message: `the video has ${frames} frames, more than the limit of ${limits.maxVideoFrames}`
    })
  }
}

const inputArgs = (demuxer: string, path: string) => ["-protocol_whitelist", "file", "-f", demuxer, "-i", path]

const probe = async (demuxer: ContainerDemuxer, path: string): Promise<VideoProbe> =>
  readProbe(
    await probeHeader(
      demuxer,
      path,
      "video",
      "v:0",
      "format=format_name,duration:stream=codec_name,width,height,duration,nb_frames,nb_read_packets,avg_frame_rate,r_frame_rate",
      ["-count_packets"]
    )
  )

/**
 * The frames at `indices` (in order, each below the probe's frame count) as 8-bit RGB of the
 * stream's declared size, each handed to `onFrame` as it arrives so that only one full-size frame
 * is held at a time.
 */
const decodeFrames = async <A>(
  demuxer: ContainerDemuxer,
  path: string,
  video: VideoProbe,
  indices: ReadonlyArray<number>,
  maxPixels: number,
  onFrame: (frame: RgbImage) => Promise<A>
): Promise<Array<A>> => {
  const { width, height } = video
  const frameBytes = width * height * 3
  const select = indices.map((index) => `eq(n\\,${index})`).join("+")
  const results: Array<Promise<A>> = []
  let pending: Array<Buffer> = []
  let pendingBytes = 0
  const run = runBounded(
    videoTools().ffmpeg,
    [
      "-v",
      "error",
      "-nostdin",
      "-noautorotate",
      "-max_pixels",
      String(maxPixels),
      "-threads",
      String(mediaProcessBounds.decoderThreads),
      ...inputArgs(demuxer, path),
      "-map",
      "0:v:0",
      // A stream that changes size midway is scaled back to its declared size, so every frame is frameBytes.
      "-vf",
      `select='${select}',scale=${width}:${height}`,
      "-vsync",
      "passthrough",
      "-frames:v",
      String(indices.length),
      "-f",
      "rawvideo",
      "-pix_fmt",
      "rgb24",
      "pipe:1"
    ],
    { timeoutMs: decodeTimeoutMs, maxStdoutBytes: frameBytes * indices.length },
    (chunk) => {
      let rest = chunk
      while (pendingBytes + rest.length >= frameBytes) {
        const take = frameBytes - pendingBytes
        const data = Buffer.concat([...pending, rest.subarray(0, take)])
        rest = rest.subarray(take)
        pending = []
        pendingBytes = 0
        results.push(onFrame({ data: new Uint8Array(data.buffer, data.byteOffset, data.length), width, height }))
      }
      if (rest.length > 0) {
        pending.push(Buffer.from(rest))
        pendingBytes += rest.length
      }
    }
  )
  // A run that fails leaves frames still being handled: they settle before the failure goes on.
  const { code, stderr } = await run.catch(async (error: unknown) => {
    await Promise.allSettled(results)
    throw error
  })
  const frames = await Promise.all(results)
  if (code !== 0) {
    throw new MediaError({
      message: `the video could not be decoded: ${lastLines(stderr, path) || `ffmpeg exited with ${code}`}`
    })
  }
  if (frames.length < indices.length) {
    throw new MediaError({
      message: `the video could not be decoded: it ended after ${frames.length} of the ${indices.length} frames sampled from its ${video.frameCount}${stderr.trim() === "" ? "" : ` (${lastLines(stderr, path)})`}`
    })
  }
  return frames
}

/**
 * The sampled frames of a video container: probed, checked against the limits, then only the
 * frames `sample` picks from the probe (indices in increasing order, below its frame count) are
 * decoded, each handed to `onFrame` (a resize, say) as it arrives. Corrupt, truncated or refused
 * input is a MediaError or MediaTooLarge.
 */
export const decodeContainerFrames = <A>(
  bytes: Uint8Array,
  demuxer: ContainerDemuxer,
  limits: MediaLimits,
  sample: (video: VideoProbe) => ReadonlyArray<number>,
  onFrame: (frame: RgbImage) => Promise<A>
): Promise<Array<A>> =>
  withScratchDirectory("video", async (directory) => {
    const path = join(directory, "input")
    await writeFile(path, bytes, { mode: 0o600 })
    const video = await probe(demuxer, path)
    checkVideoLimits(video, limits)
    const indices = sample(video)
    if (
      indices.length === 0 ||
      indices.some(
        (index, at) =>
          !Number.isInteger(index) || index < 0 || index >= video.frameCount || (at > 0 && index <= indices[at - 1]!)
      )
    ) {
      throw new Error(`frame indices must increase within 0…${video.frameCount - 1}: ${indices.join(", ")}`)
    }
    return decodeFrames(demuxer, path, video, indices, limits.maxImagePixels, onFrame)
  })
