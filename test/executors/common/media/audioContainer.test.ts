import { execFileSync } from "node:child_process"
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { audioDemuxerOf } from "../../../../src/executors/common/media/AudioContainer.js"
import { MediaError, MediaTooLarge } from "../../../../src/executors/common/media/errors.js"
import { decodeAudio } from "../../../../src/executors/common/media/MediaDecoder.js"
import { defaultMediaLimits } from "../../../../src/executors/common/media/MediaLimits.js"
import { resample } from "../../../../src/executors/common/media/Resampler.js"
import { ffmpegFile } from "../../../support/videos.js"

/**
 * Audio as browsers and phones record it, decoded through ffmpeg (mp3, AAC in m4a, ogg with
 * Vorbis and Opus, flac, webm), from files the test makes with ffmpeg; and the band-limited
 * resampler, against sox's and against first principles (a tone keeps its frequency, content above
 * the new Nyquist does not fold back).
 */

const rate = 44_100
const seconds = 1.5

/** A two-tone clip: 440 Hz and 1 kHz. */
const tones = (sampleRate: number, length: number, phaseOffset = 0): Float32Array =>
  Float32Array.from({ length }, (_, i) => {
    const t = (i + phaseOffset) / sampleRate
    return 0.4 * Math.sin(2 * Math.PI * 440 * t) + 0.3 * Math.sin(2 * Math.PI * 1000 * t)
  })

/** A WAV of 32-bit float samples. */
const floatWav = (samples: Float32Array, sampleRate: number, channels = 1): Buffer => {
  const data = Buffer.alloc(samples.length * 4 * channels)
  samples.forEach((value, i) => {
    for (let c = 0; c < channels; c++) data.writeFloatLE(value, (i * channels + c) * 4)
  })
  const header = Buffer.alloc(44)
  header.write("RIFF", 0, "ascii")
  header.writeUInt32LE(36 + data.length, 4)
  header.write("WAVEfmt ", 8, "ascii")
  header.writeUInt32LE(16, 16)
  header.writeUInt16LE(3, 20)
  header.writeUInt16LE(channels, 22)
  header.writeUInt32LE(sampleRate, 24)
  header.writeUInt32LE(sampleRate * 4 * channels, 28)
  header.writeUInt16LE(4 * channels, 32)
  header.writeUInt16LE(32, 34)
  header.write("data", 36, "ascii")
  header.writeUInt32LE(data.length, 40)
  return Buffer.concat([header, data])
}

/** The amplitude of `frequency` in `samples` at `sampleRate` (a single-bin DFT). */
const amplitudeAt = (samples: Float32Array, sampleRate: number, frequency: number): number => {
  let re = 0
  let im = 0
  samples.forEach((value, i) => {
    re += value * Math.cos((2 * Math.PI * frequency * i) / sampleRate)
    im -= value * Math.sin((2 * Math.PI * frequency * i) / sampleRate)
  })
  return (2 * Math.hypot(re, im)) / samples.length
}

const interior = (samples: Float32Array, margin: number) => samples.subarray(margin, samples.length - margin)

describe("audio containers, decoded with ffmpeg", () => {
  const source = floatWav(tones(rate, rate * seconds), rate, 2)
  const encodings = {
    mp3: ["-c:a", "libmp3lame", "-b:a", "192k", "mp3"],
    m4a: ["-c:a", "aac", "-b:a", "192k", "ipod"],
    ogg: ["-c:a", "libvorbis", "-q:a", "6", "ogg"],
    opus: ["-c:a", "libopus", "-b:a", "128k", "ogg"],
    flac: ["-c:a", "flac", "flac"],
    webm: ["-c:a", "libopus", "-b:a", "128k", "webm"]
  } as const
  const files = new Map<string, Buffer>()

  beforeAll(async () => {
    for (const [name, args] of Object.entries(encodings)) {
      const format = args.at(-1)!
      files.set(name, await ffmpegFile(["-f", "wav", "-i", "pipe:0", ...args.slice(0, -1)], format, source))
    }
  })

  it("tells each format by its first bytes", () => {
    expect(Object.fromEntries([...files].map(([name, bytes]) => [name, audioDemuxerOf(bytes)]))).toEqual({
      mp3: "mp3",
      m4a: "mov",
      ogg: "ogg",
      opus: "ogg",
      flac: "flac",
      webm: "matroska"
    })
    expect(audioDemuxerOf(source)).toBe("wav")
    expect(audioDemuxerOf(Buffer.from("hello world"))).toBeUndefined()
  })

  it.each(Object.keys(encodings))("decodes %s to mono at the model's rate, its tones where they were", async (name) => {
    const decoded = await decodeAudio(files.get(name)!, undefined, 16_000)
    // Codecs pad the start and end by a few milliseconds.
    expect(Math.abs(decoded.length / 16_000 - seconds)).toBeLessThan(0.08)
    const middle = interior(decoded, 2000)
    expect(amplitudeAt(middle, 16_000, 440)).toBeCloseTo(0.4, 1)
    expect(amplitudeAt(middle, 16_000, 1000)).toBeCloseTo(0.3, 1)
    expect(amplitudeAt(middle, 16_000, 2500)).toBeLessThan(0.01)
  })

  it("decodes flac, which is lossless, to the samples it was made from; resampled, within 2e-3 of the WAV path", async () => {
    // At the file's own rate nothing is resampled: the flac holds the clip's samples as 16 bits.
    const fromFlac = await decodeAudio(files.get("flac")!, undefined, rate)
    const quantised = tones(rate, rate * seconds).map((v) => Math.round(v * 32767) / 32768)
    expect(fromFlac.length).toBe(quantised.length)
    let worst = 0
    fromFlac.forEach((value, i) => (worst = Math.max(worst, Math.abs(value - quantised[i]!))))
    expect(worst).toBeLessThan(1e-4)
    // At 16 kHz, ffmpeg's resampler and the WAV path's agree within the band.
    const flac16 = await decodeAudio(files.get("flac")!, undefined, 16_000)
    const wav16 = await decodeAudio(floatWav(quantised, rate), undefined, 16_000)
    expect(Math.abs(flac16.length - wav16.length)).toBeLessThanOrEqual(1)
    let apart = 0
    for (let i = 200; i < Math.min(flac16.length, wav16.length) - 200; i++)
      apart = Math.max(apart, Math.abs(flac16[i]! - wav16[i]!))
    expect(apart).toBeLessThan(2e-3)
  })

  it("refuses, from its header, a clip longer than the limit, and corrupt files as MediaError", async () => {
    const short = { ...defaultMediaLimits, maxAudioSeconds: 1 }
    await expect(decodeAudio(files.get("mp3")!, undefined, 16_000, short)).rejects.toThrow(MediaTooLarge)
    await expect(decodeAudio(files.get("ogg")!, undefined, 16_000, short)).rejects.toThrow(
      /lasts 1\.5 s, longer than the limit of 1 s/
    )
    const noise = Buffer.concat([Buffer.from("OggS"), Buffer.alloc(3000, 0x5a)])
    await expect(decodeAudio(noise, undefined, 16_000)).rejects.toThrow(MediaError)
    const flac = files.get("flac")!
    await expect(decodeAudio(flac.subarray(0, 40), undefined, 16_000)).rejects.toThrow(MediaError)
    const truncatedM4a = files.get("m4a")!.subarray(0, 600)
    await expect(decodeAudio(truncatedM4a, undefined, 16_000)).rejects.toThrow(/audio could not be/)
  })
})

describe("the band-limited resampler", () => {
  let root: string
  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-resample-"))
  })
  afterAll(async () => {
    await rm(root, { recursive: true, force: true })
  })

  /** sox's resampling of `samples` (its default, high quality), as float32. */
  const sox = async (samples: Float32Array, from: number, to: number): Promise<Float32Array> => {
    const input = join(root, `in-${from}.wav`)
    const output = join(root, `out-${from}-${to}.wav`)
    await writeFile(input, floatWav(samples, from))
    execFileSync("sox", [input, "-e", "floating-point", "-b", "32", output, "rate", String(to)])
    const wav = await readFile(output)
    const data = wav.indexOf("data", 12, "ascii") + 8
    return Float32Array.from({ length: (wav.length - data) / 4 }, (_, i) => wav.readFloatLE(data + i * 4))
  }

  it.each([
    [44_100, 16_000],
    [48_000, 16_000],
    [22_050, 16_000],
    [8_000, 16_000]
  ])("gives sox's output within 2e-3 for in-band tones, %i Hz → %i Hz", async (from, to) => {
    const input = tones(from, from)
    const ours = resample(input, from, to)
    const theirs = await sox(input, from, to)
    expect(Math.abs(ours.length - theirs.length)).toBeLessThanOrEqual(1)
    // Away from the clip's two ends, where each filter meets the silence outside it differently.
    const margin = 200
    let worst = 0
    for (let i = margin; i < Math.min(ours.length, theirs.length) - margin; i++)
      worst = Math.max(worst, Math.abs(ours[i]! - theirs[i]!))
    expect(worst).toBeLessThan(2e-3)
    // And the tones are the ones sampled at the new rate.
    const exact = tones(to, ours.length)
    let error = 0
    for (let i = margin; i < ours.length - margin; i++) error = Math.max(error, Math.abs(ours[i]! - exact[i]!))
    expect(error).toBeLessThan(2e-3)
  })

  it("removes what lies above the new Nyquist frequency instead of folding it back", () => {
    // 9 kHz at 44.1 kHz: at 16 kHz, linear interpolation would leave it as a 7 kHz alias.
    const high = Float32Array.from({ length: 44_100 }, (_, i) => 0.5 * Math.sin((2 * Math.PI * 9000 * i) / 44_100))
    const out = interior(resample(high, 44_100, 16_000), 400)
    expect(amplitudeAt(out, 16_000, 7000)).toBeLessThan(1e-3)
    let peak = 0
    for (const value of out) peak = Math.max(peak, Math.abs(value))
    expect(peak).toBeLessThan(2e-3)
  })
})
