import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import {
  AutoTokenizer,
  type PreTrainedTokenizer,
  SpeechT5ForTextToSpeech,
  SpeechT5HifiGan,
  Tensor
} from "@huggingface/transformers"
import * as ort from "onnxruntime-node"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  nextChunkFrames,
  readVoices,
  SpeechSynthesizer,
  vocoderWindow
} from "../../../src/executors/geri/SpeechSynthesizer.js"
import { hifiGanContextFrames } from "../../../src/models/architectures/SpeechT5.js"
import { loadModelDirectory } from "../../../src/models/ModelDirectory.js"
import { type RandomSpeechT5, randomSpeechT5Files } from "../../../src/models/recipes/RandomSpeechT5.js"
import { TextTokenizer } from "../../../src/models/TextTokenizer.js"
import { writeModelFiles } from "../../models/support/SmolVlmFixture.js"
import { offline } from "../../models/support/TransformersJs.js"

/**
 * SpeechT5 text to speech on the community's export layout (Xenova/speecht5_tts with
 * Xenova/speecht5_hifigan), against transformers.js's `generate_speech` on the same files: the
 * spectrogram equal, the streamed waveform equal to one vocoder run over the whole spectrogram
 * within float rounding, whatever the chunks; the first chunk out while the decoder is still writing.
 */

/** Float rounding of convolutions over windows of other lengths: the samples are within [-1, 1]. */
const chunkTolerance = 1e-5

const texts = [
  "Hello, my dog is cute.",
  "The quick brown fox jumps over the lazy dog, twice: once at dawn and once at dusk.",
  "A."
]

describe("SpeechT5 synthesis", () => {
  let root: string
  let modelDir: string
  let built: RandomSpeechT5
  let tokenizer: PreTrainedTokenizer
  let reference: SpeechT5ForTextToSpeech
  let referenceVocoder: SpeechT5HifiGan
  let synthesizer: SpeechSynthesizer

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-tts-"))
    modelDir = join(root, "speecht5")
    built = randomSpeechT5Files({ seed: 11 })
    await writeModelFiles(modelDir, built.files)
    tokenizer = await AutoTokenizer.from_pretrained(offline(modelDir))
    reference = (await SpeechT5ForTextToSpeech.from_pretrained(offline(modelDir), {
      dtype: "fp32"
    })) as SpeechT5ForTextToSpeech
    referenceVocoder = (await SpeechT5HifiGan.from_pretrained(offline(join(modelDir, "vocoder")), {
      dtype: "fp32"
    })) as SpeechT5HifiGan
    synthesizer = await SpeechSynthesizer.load(modelDir, join(modelDir, "vocoder"), "cpu", 2)
  }, 120_000)

  afterAll(async () => {
    await synthesizer?.release()
    await reference?.dispose()
    await referenceVocoder?.dispose()
    await rm(root, { recursive: true, force: true })
  })

  const referenceSpeech = async (text: string, voice: Float32Array) => {
    const { input_ids } = tokenizer(text)
    const out = (await reference.generate_speech(input_ids, new Tensor("float32", voice, [1, voice.length]), {
      vocoder: referenceVocoder
    })) as { spectrogram: Tensor; waveform: Tensor }
    return { spectrogram: out.spectrogram.data as Float32Array, waveform: out.waveform.data as Float32Array }
  }

  const ours = async (
    tokens: ReadonlyArray<number>,
    voice: Float32Array,
    firstChunkFrames: number,
    maxChunkFrames: number
  ) => {
    const chunks: Array<Float32Array> = []
    let steps = 0
    const stepsAtChunk: Array<number> = []
    const result = await synthesizer.synthesize(
      tokens,
      voice,
      {
        plan: { firstChunkFrames, chunkFrames: firstChunkFrames * 2, maxChunkFrames },
        cancelled: () => {
          steps++
          return false
        }
      },
      (samples) => {
        chunks.push(samples.slice())
        stepsAtChunk.push(steps)
      }
    )
    const waveform = new Float32Array(chunks.reduce((sum, chunk) => sum + chunk.length, 0))
    let at = 0
    for (const chunk of chunks) {
      waveform.set(chunk, at)
      at += chunk.length
    }
    return { ...result, chunks, waveform, steps, stepsAtChunk }
  }

  const maxDifference = (a: Float32Array, b: Float32Array) => {
    let most = 0
    for (let i = 0; i < a.length; i++) most = Math.max(most, Math.abs(a[i]! - b[i]!))
    return most
  }

  it("is laid out as the community's exports are, with SpeechT5's inputs and outputs", async () => {
    const model = await loadModelDirectory(modelDir)
    const decoder = await ort.InferenceSession.create(model.onnx.get("decoder_model_merged")!)
    const encoder = await ort.InferenceSession.create(model.onnx.get("encoder_model")!)
    const vocoder = await ort.InferenceSession.create(join(modelDir, "vocoder", "onnx", "model.onnx"))
    try {
      const caches = (prefix: string) =>
        Array.from({ length: built.size.decoderLayers }, (_, i) =>
          ["decoder.key", "decoder.value", "encoder.key", "encoder.value"].map((part) => `${prefix}.${i}.${part}`)
        ).flat()
      expect(encoder.inputNames).toEqual(["input_ids"])
      expect(encoder.outputNames).toEqual(["encoder_outputs", "encoder_attention_mask"])
      expect([...decoder.inputNames].sort()).toEqual(
        [
          "output_sequence",
          "encoder_hidden_states",
          "encoder_attention_mask",
          "speaker_embeddings",
          "use_cache_branch",
          ...caches("past_key_values")
        ].sort()
      )
      expect([...decoder.outputNames].sort()).toEqual(
        ["output_sequence_out", "spectrum", "prob", ...caches("present")].sort()
      )
      expect(vocoder.inputNames).toEqual(["spectrogram"])
      expect(vocoder.outputNames).toEqual(["waveform"])
    } finally {
      await Promise.all([decoder.release(), encoder.release(), vocoder.release()])
    }
  })

  it("tokenizes as transformers.js does, </s> last", async () => {
    const ours = new TextTokenizer(await loadModelDirectory(modelDir))
    for (const text of [...texts, "Numbers 42 and CAPS, éclair!"]) {
      const expected = Array.from(tokenizer(text).input_ids.data as BigInt64Array, Number)
      expect(ours.encode(text), text).toEqual(expected)
      expect(expected.at(-1)).toBe(2)
    }
  })

  it("speaks as transformers.js's generate_speech: the same spectrogram, the waveform within float rounding", async () => {
    const voices = await readVoices(modelDir, built.size.speakerDim)
    expect([...voices.keys()]).toEqual(["alloy", "echo", "nova"])
    const lengths = new Set<number>()
    for (const text of texts) {
      for (const voice of ["alloy", "nova"]) {
        const speaker = voices.get(voice)!
        const expected = await referenceSpeech(text, speaker)
        const tokens = Array.from(tokenizer(text).input_ids.data as BigInt64Array, Number)
        const got = await ours(tokens, speaker, 16, 256)
        expect(got.frames * 80, `${text} ${voice}`).toBe(expected.spectrogram.length)
        expect(Array.from(got.spectrogram), `${text} ${voice}`).toEqual(Array.from(expected.spectrogram))
        expect(got.waveform.length).toBe(expected.waveform.length)
        expect(maxDifference(got.waveform, expected.waveform), `${text} ${voice}`).toBeLessThan(chunkTolerance)
        lengths.add(got.frames)
      }
    }
    // The stop probability ends utterances of different texts at different lengths.
    expect(lengths.size).toBeGreaterThanOrEqual(3)
  }, 120_000)

  it("streams chunks whose samples equal one vocoder run over the whole, whatever the chunk sizes", async () => {
    const speaker = built.voices.get("echo")!
    const tokens = Array.from(tokenizer(texts[1]!).input_ids.data as BigInt64Array, Number)
    const whole = await ours(tokens, speaker, 1 << 16, 1 << 16)
    expect(whole.chunks).toHaveLength(1)
    const once = await synthesizer.vocode(whole.spectrogram, whole.frames)
    expect(maxDifference(whole.waveform, once)).toBe(0)
    for (const [first, max] of [
      [1, 1],
      [4, 64],
      [16, 256],
      [7, 23]
    ] as const) {
      const streamed = await ours(tokens, speaker, first, max)
      expect(streamed.chunks.length, `${first}/${max}`).toBeGreaterThan(2)
      expect(streamed.chunks[0]!.length).toBe(first * synthesizer.hop)
      expect(streamed.waveform.length).toBe(once.length)
      expect(maxDifference(streamed.waveform, once), `${first}/${max}`).toBeLessThan(chunkTolerance)
      // The first chunk leaves once its frames and their right context are written, long before the end.
      const contextSteps = Math.ceil((first + synthesizer.contextFrames) / 2)
      expect(streamed.stepsAtChunk[0]).toBe(contextSteps)
      expect(streamed.stepsAtChunk[0]!).toBeLessThan(streamed.steps / 2)
    }
  }, 120_000)

  it("vocodes windows as the whole with the context it computes, and not without context", async () => {
    const speaker = built.voices.get("alloy")!
    const tokens = Array.from(tokenizer(texts[1]!).input_ids.data as BigInt64Array, Number)
    const { spectrogram, frames } = await ours(tokens, speaker, 1 << 16, 1 << 16)
    const whole = await synthesizer.vocode(spectrogram, frames)
    const hop = synthesizer.hop
    const differenceWith = async (context: number) => {
      let most = 0
      for (let start = 0; start < frames; start += 32) {
        const window = vocoderWindow(start, Math.min(frames, start + 32), frames, context)
        const samples = await synthesizer.vocode(
          spectrogram.subarray(window.from * 80, window.to * 80),
          window.to - window.from
        )
        const part = samples.subarray((window.keepFrom - window.from) * hop, (window.keepTo - window.from) * hop)
        most = Math.max(most, maxDifference(part, whole.subarray(start * hop, start * hop + part.length)))
      }
      return most
    }
    expect(synthesizer.contextFrames).toBe(hifiGanContextFrames(built.vocoder))
    expect(await differenceWith(synthesizer.contextFrames)).toBeLessThan(chunkTolerance)
    expect(await differenceWith(0)).toBeGreaterThan(1e-3)
  }, 60_000)

  it("stops at the next step once its request is cancelled, vocoding nothing more", async () => {
    const speaker = built.voices.get("nova")!
    const tokens = Array.from(tokenizer(texts[1]!).input_ids.data as BigInt64Array, Number)
    const whole = await ours(tokens, speaker, 8, 8)
    let chunks = 0
    let cancel = false
    const cut = await synthesizer.synthesize(
      tokens,
      speaker,
      { plan: { firstChunkFrames: 8, chunkFrames: 8, maxChunkFrames: 8 }, cancelled: () => cancel },
      () => {
        chunks++
        cancel = chunks === 2
      }
    )
    expect(chunks).toBe(2)
    expect(cut.samples).toBe(16 * synthesizer.hop)
    expect(cut.frames).toBeLessThan(whole.frames / 2)
  })

  it("plans chunks that double up to the cap, with context on each side where there is some", () => {
    expect(
      [0, 1, 2, 3, 4, 5].map((chunk) =>
        nextChunkFrames({ firstChunkFrames: 16, chunkFrames: 32, maxChunkFrames: 100 }, chunk)
      )
    ).toEqual([16, 32, 64, 100, 100, 100])
    expect(vocoderWindow(0, 16, 200, 18)).toEqual({ from: 0, to: 34, keepFrom: 0, keepTo: 16 })
    expect(vocoderWindow(16, 48, 200, 18)).toEqual({ from: 0, to: 66, keepFrom: 16, keepTo: 48 })
    expect(vocoderWindow(100, 190, 190, 18)).toEqual({ from: 82, to: 190, keepFrom: 100, keepTo: 190 })
  })
})
