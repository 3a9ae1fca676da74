import { mkdtemp, readFile, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { MimiDecoderModel, Tensor } from "@huggingface/transformers"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  CodecDecoder,
  type CodecPlan,
  codecWindows,
  defaultContextFrames
} from "../../../src/executors/geri/CodecDecoder.js"
import { mimiExactContextFrames, mimiHop } from "../../../src/models/architectures/Mimi.js"
import { onnxInputDims } from "../../../src/models/onnx/Graph.js"
import { type RandomMimi, randomMimiFiles } from "../../../src/models/recipes/RandomMimi.js"
import { writeModelFiles } from "../../models/support/SmolVlmFixture.js"
import { offline } from "../../models/support/TransformersJs.js"

/**
 * Mimi's decoder on the community's export layout (onnx-community/kyutai-mimi-ONNX's
 * decoder_model: audio_codes → audio_values), against transformers.js's MimiDecoderModel on the
 * same files: whole-sequence decoding equal, and the streamed chunks (each decoded from a window
 * with the decoder's whole reach of left context) equal to whole decoding within float rounding,
 * whatever the chunks.
 */

/** Float rounding of convolutions and attention over windows of other lengths and positions; the samples are within about [-1, 1]. */
const chunkTolerance = 1e-5

const largestDifference = (a: Float32Array, b: Float32Array) => {
  expect(a.length).toBe(b.length)
  let most = 0
  for (let i = 0; i < a.length; i++) most = Math.max(most, Math.abs(a[i]! - b[i]!))
  return most
}

/** Codes [quantizers, frames], row after row, drawn from `seed`. */
const codesOf = (quantizers: number, frames: number, codebookSize: number, seed: number) =>
  BigInt64Array.from({ length: quantizers * frames }, (_, i) => BigInt((i * 7919 + seed * 104729) % codebookSize))

describe("Mimi codec decoding", () => {
  let root: string
  let modelDir: string
  let built: RandomMimi
  let reference: MimiDecoderModel
  let decoder: CodecDecoder

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-mimi-"))
    modelDir = join(root, "mimi")
    built = randomMimiFiles({ seed: 21 })
    await writeModelFiles(modelDir, built.files)
    reference = (await MimiDecoderModel.from_pretrained(offline(modelDir), { dtype: "fp32" })) as MimiDecoderModel
    decoder = await CodecDecoder.load(modelDir, "cpu", 1)
  })

  afterAll(async () => {
    await decoder?.release()
    await reference?.dispose()
    await rm(root, { recursive: true, force: true })
  })

  const referenceAudio = async (codes: BigInt64Array, quantizers: number) => {
    const frames = codes.length / quantizers
    const output = (await reference({ audio_codes: new Tensor("int64", codes, [1, quantizers, frames]) })) as {
      audio_values: Tensor
    }
    expect(output.audio_values.dims).toEqual([1, 1, frames * mimiHop(built.size)])
    return output.audio_values.data as Float32Array
  }

  it("has the export's input and output, and transformers.js decodes it as the platform does", async () => {
    const bytes = await readFile(join(modelDir, "onnx", "decoder_model.onnx"))
    expect(onnxInputDims(bytes, "audio_codes")).toEqual(["batch_size", built.size.numQuantizers, "codes_length"])
    expect(decoder.fixedQuantizers).toBe(built.size.numQuantizers)
    expect(decoder.spec).toMatchObject({ sampleRate: 24000, frameRate: 12.5, hop: 1920, codebookSize: 64 })
    const quantizers = built.size.numQuantizers
    const codes = codesOf(quantizers, 40, 64, 1)
    const whole = await decoder.decodeWindow(codes, quantizers, 40, 0, 40)
    // One graph on two sessions of other thread counts: equal but for the order of float sums.
    expect(largestDifference(whole, await referenceAudio(codes, quantizers))).toBeLessThan(1e-6)
    // Not silence, and not clipped everywhere: the random decoder's samples are mostly within [-1, 1].
    const rms = Math.sqrt(whole.reduce((sum, sample) => sum + sample * sample, 0) / whole.length)
    expect(rms).toBeGreaterThan(0.05)
    expect(rms).toBeLessThan(1)
  })

  it("cuts a sequence into windows that keep every frame once, in order, each with its left context", () => {
    const plan: CodecPlan = { firstChunkFrames: 5, chunkFrames: 10, maxChunkFrames: 40, contextFrames: 20 }
    const windows = codecWindows(123, plan)
    // The last 8 frames are fewer than the context: the chunk before takes them.
    expect(windows.map((w) => w.keepTo - w.keepFrom)).toEqual([5, 10, 20, 40, 48])
    windows.forEach((window, index) => {
      expect(window.keepFrom).toBe(index === 0 ? 0 : windows[index - 1]!.keepTo)
      expect(window.from).toBe(Math.max(0, window.keepFrom - 20))
    })
    expect(windows.at(-1)!.keepTo).toBe(123)
    expect(codecWindows(3, plan)).toEqual([{ from: 0, keepFrom: 0, keepTo: 3 }])
  })

  it("streams chunks that equal whole-sequence decoding within float rounding, whatever the chunks", async () => {
    const quantizers = built.size.numQuantizers
    const exact = mimiExactContextFrames(built.size)
    expect(defaultContextFrames(decoder.spec)).toBe(exact)
    let worst = 0
    for (const [frames, seed] of [
      [90, 2],
      [37, 3]
    ] as const) {
      const codes = codesOf(quantizers, frames, 64, seed)
      const whole = await referenceAudio(codes, quantizers)
      for (const plan of [
        { firstChunkFrames: 5, chunkFrames: 25, maxChunkFrames: 200 },
        { firstChunkFrames: 1, chunkFrames: 1, maxChunkFrames: 1 },
        { firstChunkFrames: 7, chunkFrames: 3, maxChunkFrames: 50 },
        { firstChunkFrames: 64, chunkFrames: 64, maxChunkFrames: 64 }
      ]) {
        const chunks: Array<Float32Array> = []
        const sent = await decoder.decode(
          codes,
          quantizers,
          { plan: { ...plan, contextFrames: exact } },
          (samples, chunk) => {
            expect(chunk).toBe(chunks.length)
            chunks.push(samples.slice())
          }
        )
        expect(sent).toBe(frames * 1920)
        expect(chunks[0]!.length).toBe(Math.min(frames, plan.firstChunkFrames) * 1920)
        const streamed = new Float32Array(sent)
        let at = 0
        for (const chunk of chunks) {
          streamed.set(chunk, at)
          at += chunk.length
        }
        worst = Math.max(worst, largestDifference(streamed, whole))
      }
    }
    expect(worst).toBeLessThan(chunkTolerance)
  })

  it("needs its left context: without it a chunk's first samples differ from whole decoding", async () => {
    const quantizers = built.size.numQuantizers
    const codes = codesOf(quantizers, 60, 64, 4)
    const whole = await referenceAudio(codes, quantizers)
    const plan = { firstChunkFrames: 20, chunkFrames: 20, maxChunkFrames: 20 }
    for (const contextFrames of [0, 3]) {
      const chunks: Array<Float32Array> = []
      await decoder.decode(codes, quantizers, { plan: { ...plan, contextFrames } }, (samples) =>
        chunks.push(samples.slice())
      )
      // The first chunk starts where the sequence does; the second lacks what came before its window.
      expect(largestDifference(chunks[0]!, whole.subarray(0, 20 * 1920))).toBeLessThan(chunkTolerance)
      expect(largestDifference(chunks[1]!, whole.subarray(20 * 1920, 40 * 1920))).toBeGreaterThan(1e-2)
    }
  })

  it("sends the first chunk before decoding the rest, and stops at the next window when cancelled", async () => {
    const quantizers = built.size.numQuantizers
    const codes = codesOf(quantizers, 120, 64, 5)
    const plan: CodecPlan = { firstChunkFrames: 4, chunkFrames: 8, maxChunkFrames: 8, contextFrames: 10 }
    const windowsDecoded: Array<number> = []
    const original = decoder.decodeWindow.bind(decoder)
    decoder.decodeWindow = async (...args) => {
      windowsDecoded.push(args[4] - args[3])
      return original(...args)
    }
    try {
      let cancelled = false
      const chunks: Array<number> = []
      const sent = await decoder.decode(codes, quantizers, { plan, cancelled: () => cancelled }, (samples, chunk) => {
        // The first chunk: one window of its 4 frames decoded, nothing more.
        if (chunk === 0) expect(windowsDecoded).toEqual([4])
        chunks.push(samples.length)
        if (chunk === 2) cancelled = true
      })
      expect(chunks).toEqual([4 * 1920, 8 * 1920, 8 * 1920])
      expect(sent).toBe(20 * 1920)
      expect(windowsDecoded).toEqual([4, 8 + 4, 8 + 10])
    } finally {
      decoder.decodeWindow = original
    }
  })
})
