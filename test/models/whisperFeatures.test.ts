import { type Tensor, WhisperFeatureExtractor } from "@huggingface/transformers"
import { describe, expect, it } from "vitest"
import { Random } from "../../src/models/Random.js"
import { whisperPreprocessorConfig } from "../../src/models/recipes/RandomWhisper.js"
import {
  periodicHann,
  RealFft,
  slaneyMelFilters,
  whisperFeatureExtractor,
  whisperFeatures
} from "../../src/models/WhisperFeatures.js"

/**
 * Whisper's log-mel features against transformers.js's WhisperFeatureExtractor, the reference
 * the platform's audio models are checked against: within 1e-4 for clips shorter and longer than
 * 30 s, 80 and 128 mel bands, filters given in the config, and without padding.
 */

/** A clip of a few tones and noise, as speech-like content at 16 kHz. */
const clip = (seconds: number, seed: number): Float32Array => {
  const random = new Random(seed)
  const noise = random.normals(Math.round(seconds * 16000), 0.05)
  return noise.map((value, i) => {
    const t = i / 16000
    return value + 0.3 * Math.sin(2 * Math.PI * 220 * t) + 0.2 * Math.sin(2 * Math.PI * 1375 * t * (1 + t / 10))
  })
}

const whisperConfig = (featureSize: number) => whisperPreprocessorConfig("WhisperProcessor", featureSize)

const reference = async (config: Record<string, unknown>, audio: Float32Array, maxLength?: number) => {
  const extractor = new WhisperFeatureExtractor(config)
  const { input_features: features } = (await extractor(
    audio,
    maxLength === undefined ? {} : { max_length: maxLength }
  )) as {
    input_features: Tensor
  }
  return { data: features.data as Float32Array, dims: features.dims }
}

const largestDifference = (a: Float32Array, b: Float32Array): number => {
  expect(a.length).toBe(b.length)
  let worst = 0
  for (let i = 0; i < a.length; i++) worst = Math.max(worst, Math.abs(a[i]! - b[i]!))
  return worst
}

describe("Whisper log-mel features, against transformers.js", () => {
  it.each([
    ["a 3 s clip, padded to 30 s, 80 bands", 3, 80],
    ["a 41 s clip, cut to 30 s, 80 bands", 41, 80],
    ["a 7 s clip, 128 bands (large-v3)", 7, 128]
  ])("%s", async (_, seconds, featureSize) => {
    const config = whisperConfig(featureSize)
    const audio = clip(seconds, featureSize + seconds)
    const expected = await reference(config, audio)
    const ours = whisperFeatures(whisperFeatureExtractor(config), audio)
    expect(expected.dims).toEqual([1, featureSize, 3000])
    expect(ours.frames).toBe(3000)
    expect(largestDifference(ours.data, expected.data)).toBeLessThan(1e-4)
  })

  it("takes mel_filters from the config, in either orientation", async () => {
    const filters = slaneyMelFilters(201, 80, 0, 8000, 16000)
    // A different bank: every filter's weights squared, so that a fallback to the default would show.
    const rows = Array.from({ length: 80 }, (_, mel) =>
      Array.from(filters.subarray(mel * 201, (mel + 1) * 201), (v) => v * v * 1000)
    )
    const config = { ...whisperConfig(80), mel_filters: rows }
    const audio = clip(2, 5)
    const expected = await reference(config, audio)
    expect(largestDifference(whisperFeatures(whisperFeatureExtractor(config), audio).data, expected.data)).toBeLessThan(
      1e-4
    )
    const transposed = { ...config, mel_filters: Array.from({ length: 201 }, (_, bin) => rows.map((row) => row[bin]!)) }
    expect(
      largestDifference(whisperFeatures(whisperFeatureExtractor(transposed), audio).data, expected.data)
    ).toBeLessThan(1e-4)
    expect(() => whisperFeatureExtractor({ ...config, mel_filters: [[1, 2, 3]] })).toThrow(/mel_filters/)
  })

  it("without padding to 30 s gives one frame per hop (as max_length = the clip's length does)", async () => {
    const audio = clip(4.3, 9)
    const config = whisperConfig(80)
    const expected = await reference(config, audio, audio.length)
    const ours = whisperFeatures(whisperFeatureExtractor(config), audio, { pad: false })
    expect(ours.frames).toBe(Math.floor(audio.length / 160))
    expect(expected.dims).toEqual([1, 80, ours.frames])
    expect(largestDifference(ours.data, expected.data)).toBeLessThan(1e-4)
  })
})

describe("the mixed-radix FFT", () => {
  it.each([400, 512, 97, 360])("gives the DFT's power for n = %i", (n) => {
    const random = new Random(n)
    const frame = Float64Array.from(random.normals(n, 1))
    const power = new Float32Array(Math.floor(n / 2) + 1)
    new RealFft(n).power(frame, power)
    for (let k = 0; k < power.length; k++) {
      let re = 0
      let im = 0
      for (let j = 0; j < n; j++) {
        re += frame[j]! * Math.cos((2 * Math.PI * j * k) / n)
        im -= frame[j]! * Math.sin((2 * Math.PI * j * k) / n)
      }
      expect(power[k]).toBeCloseTo(Math.fround(re * re + im * im), 2)
    }
  })

  it("windows with the periodic Hann window", () => {
    const window = periodicHann(8)
    expect(Array.from(window, (v) => Number(v.toFixed(6)))).toEqual([
      0, 0.146447, 0.5, 0.853553, 1, 0.853553, 0.5, 0.146447
    ])
  })
})
