import { randomBytes } from "node:crypto"
import { readdir } from "node:fs/promises"
import { tmpdir } from "node:os"
import sharp from "sharp"
import { describe, expect, it } from "vitest"
import { decodeVideoFrames, sampleFrameIndices } from "../../../../src/executors/common/media/MediaDecoder.js"
import { defaultMediaLimits, type MediaLimits } from "../../../../src/executors/common/media/MediaLimits.js"
import { containerDemuxerOf, decodeContainerFrames } from "../../../../src/executors/common/media/VideoContainer.js"
import { ffmpegFile, type Rgb, rawInput, solidFrames } from "../../../support/videos.js"

/**
 * Video containers the test makes with ffmpeg itself from frames it generates (a solid colour per
 * frame), decoded back; and the refusals, which must come from the probe, before any frame is
 * decoded.
 */

const width = 32
const height = 24
const colours: ReadonlyArray<Rgb> = [
  [255, 0, 0],
  [0, 255, 0],
  [0, 0, 255],
  [255, 255, 0],
  [0, 255, 255],
  [255, 0, 255],
  [128, 64, 32],
  [32, 160, 96]
]

/** The frames at 8 frames per second, encoded with `codec` into `format`. */
const encode = (frames: ReadonlyArray<Rgb>, format: string, codec: ReadonlyArray<string>) =>
  ffmpegFile([...rawInput(width, height, 8), ...codec], format, solidFrames(frames, width, height))

/** An mp4 (h264, lossless in RGB). */
const mp4 = (frames: ReadonlyArray<Rgb>) => encode(frames, "mp4", ["-c:v", "libx264rgb", "-qp", "0"])

const nativeSize = { width, height, kernel: "nearest" } as const

const expectColours = (
  frames: ReadonlyArray<{ readonly data: Uint8Array }>,
  expected: ReadonlyArray<Rgb>,
  tolerance: number
) => {
  expect(frames).toHaveLength(expected.length)
  frames.forEach((frame, index) => {
    expect(frame.data.length).toBe(width * height * 3)
    let worst = 0
    for (let at = 0; at < frame.data.length; at++)
      worst = Math.max(worst, Math.abs(frame.data[at]! - expected[index]![at % 3]!))
    expect(worst, `frame ${index}`).toBeLessThanOrEqual(tolerance)
  })
}

/** The colours of the frames decodeVideoFrames samples, at most 4, from the eight. */
const sampled = sampleFrameIndices(colours.length, 4).map((index) => colours[index]!)

const withLimits = (limits: Partial<MediaLimits>): MediaLimits => ({ ...defaultMediaLimits, ...limits })

/** Decodes through the probe, recording whether it got as far as sampling (the step before decoding). */
const probeOnly = async (bytes: Buffer, limits: MediaLimits) => {
  let sampledFrames = false
  const error = await decodeContainerFrames(
    bytes,
    containerDemuxerOf(bytes)!,
    limits,
    (video) => {
      sampledFrames = true
      return [video.frameCount - 1]
    },
    async (frame) => frame
  ).then(
    () => undefined,
    (failure: unknown) => failure as { readonly _tag: string; readonly message: string }
  )
  return { error, sampledFrames }
}

const ourTempDirs = async () => (await readdir(tmpdir())).filter((name) => name.startsWith("cornserve-video-"))

describe("video containers, decoded with ffmpeg", () => {
  it("tells containers from images by their first bytes", async () => {
    const gif = await sharp({ create: { width: 2, height: 2, channels: 3, background: "red" } })
      .gif()
      .toBuffer()
    expect(containerDemuxerOf(gif)).toBeUndefined()
    expect(containerDemuxerOf(await mp4(colours.slice(0, 1)))).toBe("mov")
    expect(containerDemuxerOf(await encode(colours.slice(0, 1), "webm", ["-c:v", "libvpx"]))).toBe("matroska")
    const avif = Buffer.concat([Buffer.from([0, 0, 0, 28]), Buffer.from("ftypavif"), Buffer.alloc(20)])
    expect(containerDemuxerOf(avif)).toBeUndefined()
  })

  it("decodes the sampled frames of an mp4 (h264) exactly, and leaves no temporary file", async () => {
    const before = await ourTempDirs()
    const frames = await decodeVideoFrames(await mp4(colours), nativeSize, 4)
    expectColours(frames, sampled, 0)
    expect(await ourTempDirs()).toEqual(before)
  })

  it("decodes a mov (QuickTime animation, lossless RGB)", async () => {
    const frames = await decodeVideoFrames(await encode(colours, "mov", ["-c:v", "qtrle"]), nativeSize, 4)
    expectColours(frames, sampled, 0)
  })

  it("decodes a webm, VP9 lossless and VP8 lossy, within the codec's colour error", async () => {
    const vp9 = await encode(colours, "webm", ["-c:v", "libvpx-vp9", "-lossless", "1", "-pix_fmt", "yuv444p"])
    expectColours(await decodeVideoFrames(vp9, nativeSize, 4), sampled, 4)
    const vp8 = await encode(colours, "webm", ["-c:v", "libvpx", "-b:v", "1M", "-auto-alt-ref", "0"])
    expectColours(await decodeVideoFrames(vp8, nativeSize, 4), sampled, 24)
  })

  it("takes every frame when there are no more than the budget, and resizes each to the target", async () => {
    const frames = await decodeVideoFrames(
      await mp4(colours.slice(0, 3)),
      { width: 4, height: 4, kernel: "linear" },
      32
    )
    expect(frames.map((frame) => [frame.width, frame.height, Array.from(frame.data.slice(0, 3))])).toEqual([
      [4, 4, [255, 0, 0]],
      [4, 4, [0, 255, 0]],
      [4, 4, [0, 0, 255]]
    ])
  })

  it("refuses, from the probe and before decoding, a video too long, of too many frames or too many pixels", async () => {
    const video = await mp4(colours)
    const tooLong = await probeOnly(video, withLimits({ maxVideoSeconds: 0.5 }))
    expect(tooLong).toEqual({
      sampledFrames: false,
      error: expect.objectContaining({
        _tag: "MediaTooLarge",
        message: "the video lasts 1.0 s, longer than the limit of 0.5 s"
      })
    })
    const tooManyFrames = await probeOnly(video, withLimits({ maxVideoFrames: 7 }))
    expect(tooManyFrames).toEqual({
      sampledFrames: false,
      error: expect.objectContaining({
        _tag: "MediaTooLarge",
        message: "the video has 8 frames, more than the limit of 7"
      })
    })
    const tooManyPixels = await probeOnly(video, withLimits({ maxImagePixels: 700 }))
    expect(tooManyPixels).toEqual({
      sampledFrames: false,
      error: expect.objectContaining({
        _tag: "MediaTooLarge",
        message: "the video's frames are 32×24, more than the limit of 700 pixels"
      })
    })
    expect((await probeOnly(video, defaultMediaLimits)).sampledFrames).toBe(true)
  })

  it("refuses an audio-only file, a truncated mp4 and random bytes behind a container's signature as MediaError", async () => {
    const audio = await ffmpegFile(["-f", "lavfi", "-i", "sine=duration=0.5", "-c:a", "aac"], "mp4")
    expect(await probeOnly(audio, defaultMediaLimits)).toEqual({
      sampledFrames: false,
      error: expect.objectContaining({ _tag: "MediaError", message: expect.stringMatching(/has no video stream$/) })
    })
    const whole = await mp4(colours)
    const truncated = await probeOnly(whole.subarray(0, Math.floor(whole.length / 2)), defaultMediaLimits)
    expect(truncated).toEqual({
      sampledFrames: false,
      error: expect.objectContaining({
        _tag: "MediaError",
        message: expect.stringMatching(/^the video could not be read: .*moov atom not found/)
      })
    })
    for (const signature of [
      Buffer.from([0, 0, 0, 24, 0x66, 0x74, 0x79, 0x70]),
      Buffer.from([0x1a, 0x45, 0xdf, 0xa3])
    ]) {
      const garbage = Buffer.concat([signature, randomBytes(4096)])
      const { error } = await probeOnly(garbage, defaultMediaLimits)
      expect(error).toMatchObject({
        _tag: "MediaError",
        message: expect.stringMatching(/^the video could not be read/)
      })
    }
  })

  it("refuses random bytes with no container's signature as an undecodable video", async () => {
    await expect(decodeVideoFrames(randomBytes(4096), nativeSize, 4)).rejects.toMatchObject({
      _tag: "MediaError",
      message: expect.stringMatching(/could not be decoded/)
    })
  })

  it("refuses an mp4 cut short inside its frames, without naming the executor's files", async () => {
    // An mp4 with its index first, cut short: its header reads, its frames run out.
    const whole = await encode(colours, "mp4", ["-c:v", "libx264rgb", "-qp", "0", "-g", "1", "-movflags", "faststart"])
    const cut = whole.subarray(0, whole.length - 200)
    const failure = await decodeVideoFrames(cut, nativeSize, 8).then(
      () => undefined,
      (error: unknown) => error as { readonly _tag: string; readonly message: string }
    )
    expect(failure).toMatchObject({
      _tag: "MediaError",
      message: expect.stringMatching(/^the video could not be decoded: it ended after \d+ of the \d+ frames/)
    })
    expect(failure!.message).not.toContain(tmpdir())
  })
})
