import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import sharp from "sharp"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { startExecutor } from "../../support/executors.js"
import { ffmpegFile, type Rgb, rawInput, solidFrames } from "../../support/videos.js"
import { authorized, secretEnv } from "../executorSecret.js"

/**
 * The built-in VLM's video path through a real Eric executor (the built binary): a video container
 * sent as a `data:` URL is embedded as its frames, exactly as the same frames sent as an animated
 * GIF are (the containers here are lossless); a file that is no video, or too long, is refused.
 */

const size = 40
const colours: ReadonlyArray<Rgb> = [
  [255, 0, 0],
  [0, 255, 0],
  [0, 0, 255],
  [255, 255, 255]
]

const dataUrl = (mime: string, bytes: Buffer) => `data:${mime};base64,${bytes.toString("base64")}`

const frames = solidFrames(colours, size, size)
const input = rawInput(size, size, 4)

interface Answer {
  readonly items: ReadonlyArray<{ id: string; shape: [number, number]; embedding: Array<number> }>
}

describe("Eric: video containers on the built-in VLM's video path", () => {
  let root: string
  let eric: Awaited<ReturnType<typeof startExecutor>>

  const embed = (id: string, url: string) =>
    fetch(`${eric.url}/embeddings`, {
      method: "POST",
      headers: { ...authorized, "content-type": "application/json" },
      body: JSON.stringify({ items: [{ id, modality: "video", url }], return: "inline" })
    })

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-eric-video-"))
    eric = await startExecutor(["--kind", "eric", "--model", "cornserve/tiny-color-vlm", "--devices", "cpu:0"], {
      CORNSERVE_MODEL_DIR: join(root, "models"),
      ...secretEnv
    })
  })

  afterAll(async () => {
    await eric?.stop()
    await rm(root, { recursive: true, force: true })
  })

  it("embeds an mp4, a mov and a Matroska (webm's container) file as the same frames sent as an animated GIF", async () => {
    const pngs = await Promise.all(
      colours.map(([r, g, b]) =>
        sharp({ create: { width: size, height: size, channels: 3, background: { r, g, b } } })
          .png()
          .toBuffer()
      )
    )
    const gif = await sharp(pngs, { join: { animated: true } })
      .gif()
      .toBuffer()
    const reference = await embed("gif", dataUrl("image/gif", gif))
    expect(reference.status).toBe(200)
    const [expected] = ((await reference.json()) as Answer).items
    const containers = {
      "video/mp4": await ffmpegFile([...input, "-c:v", "libx264rgb", "-qp", "0"], "mp4", frames),
      "video/quicktime": await ffmpegFile([...input, "-c:v", "qtrle"], "mov", frames),
      "video/x-matroska": await ffmpegFile([...input, "-c:v", "ffv1"], "matroska", frames)
    }
    for (const [mime, bytes] of Object.entries(containers)) {
      const response = await embed(mime.replace("/", "."), dataUrl(mime, bytes))
      expect(response.status, mime).toBe(200)
      const [item] = ((await response.json()) as Answer).items
      expect(item!.shape, mime).toEqual(expected!.shape)
      expect(item!.embedding, mime).toEqual(expected!.embedding)
    }
  })

  it("refuses an audio-only mp4 (400) and one longer than the limit (413), with the reason", async () => {
    const audio = await ffmpegFile(["-f", "lavfi", "-i", "sine=duration=0.5", "-c:a", "aac"], "mp4")
    const noVideo = await embed("audio", dataUrl("video/mp4", audio))
    expect(noVideo.status).toBe(400)
    expect(JSON.stringify(await noVideo.json())).toMatch(/has no video stream/)
    const long = await ffmpegFile(
      ["-f", "lavfi", "-i", `color=c=red:s=16x16:r=1:d=${10 * 60 + 5}`, "-c:v", "libx264", "-preset", "ultrafast"],
      "mp4"
    )
    const tooLong = await embed("long", dataUrl("video/mp4", long))
    expect(tooLong.status).toBe(413)
    expect(JSON.stringify(await tooLong.json())).toMatch(/the video lasts 605\.0 s, longer than the limit of 600 s/)
  })
})
