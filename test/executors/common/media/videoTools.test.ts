import { afterAll, describe, expect, it } from "vitest"

/**
 * CORNSERVE_FFMPEG / CORNSERVE_FFPROBE name the binaries; the module reads them once, so this file
 * sets them before it first imports it (vitest gives each test file its own modules).
 */
describe("the ffmpeg binaries a video is decoded with", () => {
  const saved = { ffmpeg: process.env.CORNSERVE_FFMPEG, ffprobe: process.env.CORNSERVE_FFPROBE }
  afterAll(() => {
    for (const [name, value] of [
      ["CORNSERVE_FFMPEG", saved.ffmpeg],
      ["CORNSERVE_FFPROBE", saved.ffprobe]
    ] as const) {
      if (value === undefined) delete process.env[name]
      else process.env[name] = value
    }
  })

  it("are the environment's when it names them, and a missing one is a clear MediaError", async () => {
    process.env.CORNSERVE_FFMPEG = "/nonexistent/ffmpeg"
    process.env.CORNSERVE_FFPROBE = "/nonexistent/ffprobe"
    const { decodeVideoFrames } = await import("../../../../src/executors/common/media/MediaDecoder.js")
    const { videoTools } = await import("../../../../src/executors/common/media/VideoContainer.js")
    expect(videoTools()).toEqual({ ffmpeg: "/nonexistent/ffmpeg", ffprobe: "/nonexistent/ffprobe" })
    const mp4Header = Buffer.concat([Buffer.from([0, 0, 0, 24]), Buffer.from("ftypisom"), Buffer.alloc(16)])
    await expect(decodeVideoFrames(mp4Header, { width: 4, height: 4, kernel: "linear" }, 4)).rejects.toMatchObject({
      _tag: "MediaError",
      message: expect.stringMatching(
        /^video decoding is not available: cannot run \/nonexistent\/ffprobe .*CORNSERVE_FFMPEG/
      )
    })
  })
})
