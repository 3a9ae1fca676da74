import { describe, expect, it } from "vitest"
import { audioWindows, maxSpeechWindows, WhisperRequestError } from "../../src/models/WhisperGeneration.js"

/**
 * Long audio cut in windows: windows that would not move on are refused rather than cut forever,
 * a clip is never more windows than four per chunk of its length, and no request, whatever its
 * windows, holds more windows' features than the longest clip cut in whole windows.
 */

const rate = 16000

describe("audioWindows", () => {
  it("cuts as the pipeline does: 30 s windows, 5 s strides by default", () => {
    const windows = audioWindows(47 * rate, rate, 30)
    expect(windows.map((window) => [window.from / rate, window.to / rate])).toEqual([
      [0, 30],
      [20, 47]
    ])
    expect(windows.map((window) => [window.strideLeft / rate, window.strideRight / rate])).toEqual([
      [0, 5],
      [5, 0]
    ])
    expect(audioWindows(47 * rate, rate, 0)).toEqual([{ from: 0, to: 47 * rate, strideLeft: 0, strideRight: 0 }])
  })

  it.each([
    [1, 0.5, /stride_length_s: 0.5 is too long for chunk_length_s 1.*at most 0.375/],
    [1, 0.4, /stride_length_s: 0.4 is too long/],
    [10, 6, /stride_length_s: 6 is too long.*at most 3.75/],
    [30, 15, /stride_length_s/],
    [0.01, 0, /chunk_length_s: must be from 1 to 30 seconds, got 0.01/],
    [-2, 0, /chunk_length_s/],
    [45, 5, /chunk_length_s: must be from 1 to 30/],
    [5, -1, /stride_length_s: must be 0 seconds or more/],
    [Number.NaN, 1, /chunk_length_s/],
    [5, Number.POSITIVE_INFINITY, /stride_length_s/]
  ])("refuses windows of %f s overlapping by %f s, naming the field", (chunk, stride, message) => {
    const cut = () => audioWindows(2 * rate, rate, chunk, stride)
    expect(cut).toThrow(WhisperRequestError)
    expect(cut).toThrow(message)
  })

  it("takes the densest windows allowed, each a quarter of a window after the one before", () => {
    const windows = audioWindows(3 * rate, rate, 1, 0.375)
    expect(windows.map((window) => window.from / rate)).toEqual([0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2])
    expect(windows.at(-1)!.to).toBe(3 * rate)
  })

  it("cuts a clip of d seconds in at most 1 + 4·d / chunk windows, for every chunk and stride allowed", () => {
    for (const chunk of [1, 1.3, 2, 5, 7.7, 10, 29.9, 30]) {
      for (const share of [0, 0.05, 1 / 6, 0.25, 0.3, 0.375]) {
        const stride = Number((chunk * share).toFixed(6))
        for (const seconds of [0.2, 1, 2, 9.5, 61, 600]) {
          const count = audioWindows(Math.round(seconds * rate), rate, chunk, stride).length
          expect(count, `${seconds} s in ${chunk} s windows, ${stride} s strides`).toBeLessThanOrEqual(
            1 + Math.ceil((4 * seconds) / chunk)
          )
        }
      }
    }
  })
})

describe("maxSpeechWindows", () => {
  it("is the windows of the longest clip cut in whole windows as close as they may be", () => {
    expect(maxSpeechWindows(600, 30)).toBe(77)
    expect(maxSpeechWindows(600, 30)).toBe(audioWindows(600 * rate, rate, 30, 11.25).length)
    expect(maxSpeechWindows(20, 30)).toBe(1)
    expect(maxSpeechWindows(3600, 30)).toBe(audioWindows(3600 * rate, rate, 30, 11.25).length)
  })

  it("never refuses whole windows on a clip within the limit, and holds the features of a request to it", () => {
    const most = maxSpeechWindows(600, 30)
    for (const stride of [0, 5, 7.5, 11.25]) {
      for (const seconds of [29, 31, 59.99, 300, 599.5, 600]) {
        expect(audioWindows(Math.round(seconds * rate), rate, 30, stride).length).toBeLessThanOrEqual(most)
      }
    }
    // A whole 30 s window's features (80 mel bins × 3000 frames, float32) per window, whatever the chunk.
    expect(most * 80 * 3000 * 4).toBeLessThan(80 * 1024 * 1024)
    // The windows of 1 s chunks that made a 2 s clip hundreds of windows are now a handful; on a
    // 600 s clip they are more than a request may hold, and refused before any feature is made.
    expect(audioWindows(2 * rate, rate, 1, 0.375).length).toBe(5)
    expect(audioWindows(600 * rate, rate, 1, 0.375).length).toBeGreaterThan(most)
  })
})
