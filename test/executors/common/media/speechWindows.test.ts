import { describe, expect, it } from "vitest"
import { BadRequest } from "../../../../src/executors/common/errors.js"
import { defaultMediaLimits, type MediaLimits } from "../../../../src/executors/common/media/MediaLimits.js"
import { speechWindows } from "../../../../src/executors/common/media/preprocess.js"
import { wavFile } from "../../../../src/executors/common/media/Wav.js"
import { whisperPreprocessorConfig } from "../../../../src/models/recipes/RandomWhisper.js"
import { maxSpeechWindows } from "../../../../src/models/WhisperGeneration.js"

/**
 * The clip Eric's preprocessing thread cuts in windows for Whisper, called as the router calls it:
 * windows that would not move on are refused before the audio is decoded, a request whose windows
 * would hold more features than the longest clip in whole windows is refused before any feature is
 * made, and what is cut holds at most that.
 */

const preprocessorConfig = whisperPreprocessorConfig("WhisperProcessor", 80)
/** One window's features: 80 mel bins × 3000 frames of float32, whatever the window's length. */
const windowBytes = 80 * 3000 * 4

const tone = (seconds: number) =>
  wavFile(
    [Int16Array.from({ length: Math.round(seconds * 16000) }, (_, i) => Math.round(8000 * Math.sin(i / 7)))],
    16000
  )

const cut = (bytes: Uint8Array, settings: { chunkSeconds?: number; strideSeconds?: number }, limits?: MediaLimits) =>
  speechWindows({ bytes, mimeType: "audio/wav", preprocessorConfig, ...settings, ...(limits ? { limits } : {}) })

describe("speechWindows", () => {
  it("refuses windows that would not move on before it decodes the audio, naming the fields", async () => {
    const notAudio = new TextEncoder().encode("not audio at all")
    for (const [chunkSeconds, strideSeconds, field] of [
      [1, 0.5, "stride_length_s"],
      [30, 15, "stride_length_s"],
      [0.05, 0, "chunk_length_s"],
      [5, -1, "stride_length_s"]
    ] as const) {
      const refused = cut(notAudio, { chunkSeconds, strideSeconds })
      await expect(refused).rejects.toBeInstanceOf(BadRequest)
      await expect(refused).rejects.toThrow(new RegExp(`^${field}: `))
    }
    await expect(cut(notAudio, { strideSeconds: 12 })).rejects.toThrow(/default chunk_length_s of 30/)
  })

  it("cuts a 2 s clip in 1 s windows a quarter apart: a handful of windows", async () => {
    const clip = await cut(tone(2), { chunkSeconds: 1, strideSeconds: 0.375 })
    expect(clip.duration).toBeCloseTo(2, 5)
    expect(clip.windows).toHaveLength(5)
    expect(clip.windows.map((window) => window.features.byteLength)).toEqual(Array(5).fill(windowBytes))
  })

  it("refuses more windows than the longest clip in whole windows, before making features", async () => {
    const limits = { ...defaultMediaLimits, maxAudioSeconds: 60 }
    const most = maxSpeechWindows(60, 30)
    expect(most).toBe(5)
    const refused = cut(tone(10), { chunkSeconds: 1, strideSeconds: 0.375 }, limits)
    await expect(refused).rejects.toBeInstanceOf(BadRequest)
    await expect(refused).rejects.toThrow(
      /^chunk_length_s 1 and stride_length_s 0.375 cut this 10.0 s clip in 37 windows, and a request may have at most 5/
    )
    // The longest clip the limits take, in 30 s windows as close as they may be, fits.
    const longest = await cut(tone(60), { chunkSeconds: 30, strideSeconds: 11.25 }, limits)
    expect(longest.windows).toHaveLength(most)
    const features = longest.windows.reduce((sum, window) => sum + window.features.byteLength, 0)
    expect(features).toBeLessThanOrEqual(most * windowBytes)
  })
})
