import { mkdtemp, rm, symlink, writeFile } from "node:fs/promises"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { pathToFileURL } from "node:url"
import sharp from "sharp"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  decodeAudio,
  decodeImage,
  decodeVideoFrames,
  sampleFrameIndices
} from "../../../../src/executors/common/media/MediaDecoder.js"
import { MediaError, MediaTooLarge } from "../../../../src/executors/common/media/errors.js"
import { defaultMediaLimits, type MediaLimits } from "../../../../src/executors/common/media/MediaLimits.js"
import { type MediaSourceOptions, readMedia } from "../../../../src/executors/common/media/MediaSource.js"
import type { ResizeTarget } from "../../../../src/models/ImageProcessor.js"

const solidPng = (r: number, g: number, b: number, size = 8) =>
  sharp({ create: { width: size, height: size, channels: 3, background: { r, g, b } } })
    .png()
    .toBuffer()

const wav16 = (samples: ReadonlyArray<ReadonlyArray<number>>, sampleRate: number): Buffer => {
  const channels = samples.length
  const frames = samples[0]!.length
  const data = Buffer.alloc(frames * channels * 2)
  for (let frame = 0; frame < frames; frame++) {
    for (let channel = 0; channel < channels; channel++) {
      data.writeInt16LE(Math.round(samples[channel]![frame]! * 32767), (frame * channels + channel) * 2)
    }
  }
  const header = Buffer.alloc(44)
  header.write("RIFF", 0, "ascii")
  header.writeUInt32LE(36 + data.length, 4)
  header.write("WAVEfmt ", 8, "ascii")
  header.writeUInt32LE(16, 16)
  header.writeUInt16LE(1, 20)
  header.writeUInt16LE(channels, 22)
  header.writeUInt32LE(sampleRate, 24)
  header.writeUInt32LE(sampleRate * channels * 2, 28)
  header.writeUInt16LE(channels * 2, 32)
  header.writeUInt16LE(16, 34)
  header.write("data", 36, "ascii")
  header.writeUInt32LE(data.length, 40)
  return Buffer.concat([header, data])
}

/** Refused media fails with MediaError (answered 400) or, over a limit, MediaTooLarge (413). */
const expectMediaError = async (
  promise: Promise<unknown>,
  failure: typeof MediaError | typeof MediaTooLarge,
  message: RegExp
) => {
  const error = await promise.then(
    () => undefined,
    (reason: unknown) => reason
  )
  expect(error).toBeInstanceOf(failure)
  expect((error as MediaError | MediaTooLarge).message).toMatch(message)
}

describe("readMedia", () => {
  let root: string
  let outside: string
  let server: Http.Server
  let base: string
  const options = (overrides: Partial<MediaSourceOptions> = {}): MediaSourceOptions => ({
    allowedRoot: root,
    allowPrivateHosts: false,
    maxBytes: 1024,
    timeoutMs: 2_000,
    ...overrides
  })

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-media-"))
    outside = await mkdtemp(join(tmpdir(), "cornserve-outside-"))
    await writeFile(join(root, "inside.bin"), "inside")
    await writeFile(join(outside, "secret.bin"), "secret")
    await symlink(join(outside, "secret.bin"), join(root, "escape.bin"))
    server = Http.createServer((request, response) => {
      if (request.url === "/small") response.end("hello")
      else if (request.url === "/big") response.end(Buffer.alloc(4096))
      else if (request.url === "/chunked") {
        response.write(Buffer.alloc(800))
        response.end(Buffer.alloc(800))
      } else if (request.url === "/redirect") response.writeHead(302, { location: "/small" }).end()
      else if (request.url === "/to-file") response.writeHead(302, { location: "file:///etc/passwd" }).end()
      else if (request.url === "/to-data") response.writeHead(301, { location: "data:text/plain,planted" }).end()
      else if (request.url === "/to-ftp") response.writeHead(307, { location: "ftp://example.com/a.png" }).end()
      else if (request.url === "/to-nowhere") response.writeHead(302, { location: "http://[::1" }).end()
      else if (request.url === "/slow") setTimeout(() => response.end("late"), 3_000)
      else response.writeHead(404).end()
    })
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  })

  afterAll(async () => {
    server.closeAllConnections()
    server.close()
    await rm(root, { recursive: true, force: true })
    await rm(outside, { recursive: true, force: true })
  })

  it("decodes base64 and percent-encoded data: URLs", async () => {
    const media = await readMedia(`data:image/png;base64,${Buffer.from("png bytes").toString("base64")}`, options())
    expect(media.bytes.toString()).toBe("png bytes")
    expect(media.mimeType).toBe("image/png")
    expect((await readMedia("data:text/plain,a%20b", options())).bytes.toString()).toBe("a b")
  })

  it("takes a scheme in any case, as the embedding cache's key does", async () => {
    const upper = await readMedia(`DATA:audio/PCM16;base64,${Buffer.from("pcm").toString("base64")}`, options())
    expect(upper).toEqual({ bytes: Buffer.from("pcm"), mimeType: "audio/pcm16" })
    const file = pathToFileURL(join(root, "inside.bin")).href.replace(/^file:/, "FILE:")
    expect((await readMedia(file, options())).bytes.toString()).toBe("inside")
  })

  it("refuses a data: URL over the size limit (413)", async () => {
    await expectMediaError(
      readMedia(`data:;base64,${Buffer.alloc(2048).toString("base64")}`, options()),
      MediaTooLarge,
      /larger than the limit/
    )
  })

  it("reads files under the allowed root, and refuses any other (400)", async () => {
    expect((await readMedia(pathToFileURL(join(root, "inside.bin")).href, options())).bytes.toString()).toBe("inside")
    await expectMediaError(
      readMedia(pathToFileURL(join(outside, "secret.bin")).href, options()),
      MediaError,
      /outside the allowed media root/
    )
    await expectMediaError(
      readMedia(pathToFileURL(join(root, "escape.bin")).href, options()),
      MediaError,
      /outside the allowed media root/
    )
    await expectMediaError(
      readMedia(pathToFileURL(join(root, "inside.bin")).href, options({ allowedRoot: undefined })),
      MediaError,
      /no media root/
    )
  })

  it("refuses http URLs to private addresses unless allowed", async () => {
    await expectMediaError(readMedia(`${base}/small`, options()), MediaError, /not a public address/)
    const port = new URL(base).port
    await expectMediaError(readMedia(`http://localhost:${port}/small`, options()), MediaError, /not a public address/)
    expect((await readMedia(`${base}/small`, options({ allowPrivateHosts: true }))).bytes.toString()).toBe("hello")
  })

  it("follows redirects, caps the size (413) and times out (400)", async () => {
    const allowed = options({ allowPrivateHosts: true, timeoutMs: 300 })
    expect((await readMedia(`${base}/redirect`, allowed)).bytes.toString()).toBe("hello")
    await expectMediaError(readMedia(`${base}/big`, allowed), MediaTooLarge, /larger than the limit/)
    await expectMediaError(readMedia(`${base}/chunked`, allowed), MediaTooLarge, /larger than the limit/)
    await expectMediaError(readMedia(`${base}/slow`, allowed), MediaError, /took longer than 300 ms/)
    await expectMediaError(readMedia(`${base}/missing`, allowed), MediaError, /HTTP 404/)
  })

  it("follows a redirect only to http(s), with a MediaError (400) naming the scheme otherwise", async () => {
    // Even where file: URLs may be read (the root is /), a server's redirect may not lead to one.
    const allowed = options({ allowPrivateHosts: true, allowedRoot: "/" })
    await expectMediaError(
      readMedia(`${base}/to-file`, allowed),
      MediaError,
      /redirects to a file: URL; only redirects to http: and https: are followed/
    )
    await expectMediaError(readMedia(`${base}/to-data`, allowed), MediaError, /redirects to a data: URL/)
    await expectMediaError(readMedia(`${base}/to-ftp`, allowed), MediaError, /redirects to a ftp: URL/)
    await expectMediaError(
      readMedia(`${base}/to-nowhere`, allowed),
      MediaError,
      /redirects to something that is not a URL/
    )
  })

  it("refuses other schemes and things that are not URLs", async () => {
    await expectMediaError(readMedia("ftp://example.com/a.png", options()), MediaError, /not accepted/)
    await expectMediaError(readMedia("just text", options()), MediaError, /not a URL/)
  })

  it("refuses http URLs whose host is a non-public address in any of its written forms", async () => {
    const port = new URL(base).port
    for (const host of [
      "[::127.0.0.1]",
      "[::ffff:127.0.0.1]",
      "[::ffff:7f00:1]",
      "[64:ff9b::7f00:1]",
      "[2002:7f00:1::]",
      "2130706433",
      "0x7f.1",
      "198.18.0.1",
      "192.0.0.1",
      "[fec0::1]"
    ]) {
      await expectMediaError(readMedia(`http://${host}:${port}/small`, options()), MediaError, /a private address/)
    }
  })
})

const fourByFour: ResizeTarget = { width: 4, height: 4, kernel: "linear" }
const twoByTwo: ResizeTarget = { width: 2, height: 2, kernel: "linear" }

describe("decoding", () => {
  it("decodes an image and resizes it to the size asked", async () => {
    const image = await decodeImage(await solidPng(200, 10, 30, 16), { width: 4, height: 3, kernel: "linear" })
    expect([image.width, image.height, image.data.length]).toEqual([4, 3, 36])
    expect([...image.data.slice(0, 3)]).toEqual([200, 10, 30])
  })

  it("refuses corrupt image bytes (400)", async () => {
    await expectMediaError(
      decodeImage(Buffer.from("definitely not an image"), fourByFour),
      MediaError,
      /could not be decoded/
    )
    const png = await solidPng(1, 2, 3)
    await expectMediaError(decodeImage(png.subarray(0, png.length / 2), fourByFour), MediaError, /could not be decoded/)
  })

  it("samples at most maxFrames evenly spread frames of an animated image", async () => {
    expect(sampleFrameIndices(3, 32)).toEqual([0, 1, 2])
    expect(sampleFrameIndices(10, 4)).toEqual([0, 3, 6, 9])
    const colours = [
      [255, 0, 0],
      [0, 255, 0],
      [0, 0, 255]
    ] as const
    const frames = await Promise.all(colours.map(([r, g, b]) => solidPng(r, g, b)))
    const gif = await sharp(frames, { join: { animated: true } })
      .gif()
      .toBuffer()
    const decoded = await decodeVideoFrames(gif, twoByTwo, 32)
    expect(decoded.map((frame) => [...frame.data.slice(0, 3)])).toEqual(colours.map((colour) => [...colour]))
    expect(await decodeVideoFrames(gif, twoByTwo, 2)).toHaveLength(2)
  })

  it("mixes WAV audio to mono and resamples it", async () => {
    const left = Array.from({ length: 4410 }, () => 0.5)
    const right = Array.from({ length: 4410 }, () => -0.25)
    const mono = await decodeAudio(wav16([left, right], 44_100), "audio/wav", 16_000)
    expect(mono.length).toBe(1600)
    expect(mono[100]).toBeCloseTo(0.125, 3)
    const pcm = Buffer.alloc(4)
    pcm.writeInt16LE(16384, 0)
    pcm.writeInt16LE(-32768, 2)
    expect([...(await decodeAudio(pcm, "audio/pcm16", 16_000))]).toEqual([0.5, -1])
  })

  it("refuses audio in no format it reads (400)", async () => {
    await expect(decodeAudio(Buffer.from("not a wav file at all"), "audio/wav", 16_000)).rejects.toThrow(
      /not in a format this executor reads/
    )
  })
})

describe("decoding bounds", () => {
  const limits = (overrides: Partial<MediaLimits>): MediaLimits => ({ ...defaultMediaLimits, ...overrides })
  const silence = (sampleRate: number, frames: number) => wav16([new Array<number>(frames).fill(0)], sampleRate)

  it("refuses a WAV sample rate outside 8–192 kHz (400), naming the rate and the bounds", async () => {
    for (const rate of [0, 1, 500_000]) {
      const decode = () => decodeAudio(silence(rate, 1600), "audio/wav", 16_000)
      await expect(decode()).rejects.toThrow(MediaError)
      await expect(decode()).rejects.toThrow(`sample rate of ${rate} Hz is outside 8000–192000 Hz`)
    }
    expect(await decodeAudio(silence(8_000, 800), "audio/wav", 16_000)).toHaveLength(1600)
  })

  it("refuses WAV and PCM16 audio longer than the limit (413)", async () => {
    const short = limits({ maxAudioSeconds: 1 })
    const decode = () => decodeAudio(silence(8_000, 16_000), "audio/wav", 16_000, short)
    await expect(decode()).rejects.toThrow(MediaTooLarge)
    await expect(decode()).rejects.toThrow("the audio lasts 2.0 s, longer than the limit of 1 s")
    expect(await decodeAudio(silence(8_000, 8_000), "audio/wav", 16_000, short)).toHaveLength(16_000)
    const pcm = Buffer.alloc(2 * 16_000 * 3)
    await expect(decodeAudio(pcm, "audio/pcm16", 16_000, short)).rejects.toThrow("the audio lasts 3.0 s")
    // Ten minutes by default, read from the header: a 601-second 8-bit WAV of 4.8 MB is refused.
    const long = Buffer.concat([silence(8_000, 0), Buffer.alloc(8_000 * 601, 128)])
    long.writeUInt16LE(8, 34)
    long.writeUInt32LE(8_000 * 601, 40)
    await expect(decodeAudio(long, "audio/wav", 16_000)).rejects.toThrow(
      "the audio lasts 601.0 s, longer than the limit of 600 s"
    )
  })

  it("decodes only the samples a WAV holds, whatever length its header declares", async () => {
    const lying = silence(16_000, 160)
    lying.writeUInt32LE(0xffff_fff0, 40)
    expect(await decodeAudio(lying, "audio/wav", 16_000)).toHaveLength(160)
  })

  it("refuses an image over the pixel limit, and an animation over it in all its frames together (413)", async () => {
    const png = await solidPng(1, 2, 3, 8)
    await expectMediaError(
      decodeImage(png, fourByFour, limits({ maxImagePixels: 63 })),
      MediaTooLarge,
      /more than 63 pixels/
    )
    const frames = await Promise.all([solidPng(255, 0, 0), solidPng(0, 255, 0), solidPng(0, 0, 255)])
    const gif = await sharp(frames, { join: { animated: true } })
      .gif()
      .toBuffer()
    // Each 8×8 frame is under the limit; the three together are not.
    await expectMediaError(
      decodeVideoFrames(gif, twoByTwo, 32, limits({ maxImagePixels: 100 })),
      MediaTooLarge,
      /video \(all its frames together\) has more than 100 pixels/
    )
  })

  it("refuses an animation with more frames than the limit (413) before decoding any", async () => {
    const frames = await Promise.all([solidPng(255, 0, 0), solidPng(0, 255, 0), solidPng(0, 0, 255)])
    const gif = await sharp(frames, { join: { animated: true } })
      .gif()
      .toBuffer()
    await expectMediaError(
      decodeVideoFrames(gif, twoByTwo, 2, limits({ maxAnimationFrames: 2 })),
      MediaTooLarge,
      /the video has 3 frames, more than the limit of 2/
    )
    expect(await decodeVideoFrames(gif, twoByTwo, 2, limits({ maxAnimationFrames: 3 }))).toHaveLength(2)
  })
})
