import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { type AutomaticSpeechRecognitionPipeline, pipeline, Tensor } from "@huggingface/transformers"
import { Tokenizer } from "@huggingface/tokenizers"
import { Either } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { SpeechRecognizer } from "../../../src/executors/eric/SpeechRecognizer.js"
import { loadModelDirectory, type ModelDirectory } from "../../../src/models/ModelDirectory.js"
import { Random } from "../../../src/models/Random.js"
import { randomWhisperFiles } from "../../../src/models/recipes/RandomWhisper.js"
import {
  type WhisperFeatureExtractor,
  whisperFeatureExtractor,
  whisperFeatures
} from "../../../src/models/WhisperFeatures.js"
import {
  audioWindows,
  decodeWindows,
  type WhisperRequestOptions,
  whisperPrompt
} from "../../../src/models/WhisperGeneration.js"
import { mergeWhisperChunks, whisperVocabulary } from "../../../src/models/WhisperTranscript.js"
import { writeModelFiles } from "../../models/support/SmolVlmFixture.js"
import { session } from "../../models/support/Ort.js"
import { offline } from "../../models/support/TransformersJs.js"

/**
 * Whisper speech recognition against transformers.js's: a random Whisper in the community's layout
 * (encoder_model + decoder_model_merged with its cross-attention cache), decoded by the platform's
 * SpeechRecognizer, batched in lockstep, under WhisperGeneration's rules and seek, stitched by
 * WhisperTranscript, gives the tokens of transformers.js's `generate` and the text and segments of
 * its ASR pipeline, with and without timestamps, for short clips and long ones cut in windows.
 */

let root: string
let modelDir: string
let model: ModelDirectory
let recognizer: SpeechRecognizer
let extractor: WhisperFeatureExtractor
let asr: AutomaticSpeechRecognitionPipeline
const fixture = randomWhisperFiles({ seed: 3 })

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "whisper-"))
  modelDir = join(root, "whisper-tiny")
  await writeModelFiles(modelDir, fixture.files)
  model = await loadModelDirectory(modelDir)
  recognizer = await SpeechRecognizer.open(model, "cpu", 1)
  extractor = whisperFeatureExtractor(model.preprocessorConfig)
  asr = (await pipeline("automatic-speech-recognition", offline(modelDir), {
    dtype: "fp32"
  })) as AutomaticSpeechRecognitionPipeline
  // transformers.js fails on decoding no ids (a segment with no text, which a random model
  // writes); Python transformers, and the platform, read it as "" (see whisperTranscript.test.ts).
  const decode = asr.tokenizer.decode.bind(asr.tokenizer)
  asr.tokenizer.decode = ((ids: Array<number>, args?: object) => (ids.length === 0 ? "" : decode(ids, args))) as never
}, 60_000)

afterAll(async () => {
  await recognizer?.release()
  await asr?.dispose()
  await rm(root, { recursive: true, force: true })
})

/** Tones that glide and change every second, over noise: content the random model answers differently to. */
const speechLike = (seconds: number, seed: number): Float32Array => {
  const random = new Random(seed)
  const pitches = Array.from({ length: Math.ceil(seconds) + 1 }, () => 120 + random.below(600))
  return random.normals(Math.round(seconds * 16000), 0.05).map((v, i) => {
    const t = i / 16000
    return v + 0.4 * Math.sin(2 * Math.PI * pitches[Math.floor(t)]! * t)
  })
}

/** The platform's transcription of a clip, as the executor's router runs it. */
const ours = async (
  clip: Float32Array,
  options: WhisperRequestOptions & { readonly chunkSeconds?: number; readonly strideSeconds?: number }
) => {
  const prompt = Either.getOrThrow(whisperPrompt(recognizer.settings, options))
  const windows = audioWindows(clip.length, 16000, options.chunkSeconds ?? 0, options.strideSeconds).map((window) => {
    const part = clip.subarray(window.from, window.to)
    return {
      features: whisperFeatures(extractor, part).data,
      melBins: 80,
      stride: [part.length / 16000, window.strideLeft / 16000, window.strideRight / 16000] as const
    }
  })
  let passes = 0
  const windowCount = windows.length
  const tokens = await decodeWindows(recognizer.settings, prompt, options.timestamps === true, windows, (batch) => {
    passes += batch.length
    return recognizer.decode(batch)
  })
  const vocabulary = whisperVocabulary(new Tokenizer(model.tokenizer!.json, model.tokenizer!.rawConfig))
  const transcript = mergeWhisperChunks(
    tokens.map((ids, index) => ({ tokens: ids, stride: windows[index]!.stride })),
    vocabulary,
    { timePrecision: 0.02, returnTimestamps: options.timestamps === true }
  )
  return { tokens, transcript, passes, windowCount }
}

const referenceTokens = async (clip: Float32Array, options: WhisperRequestOptions) => {
  const features = whisperFeatures(extractor, clip)
  const output = (await asr.model.generate({
    inputs: new Tensor("float32", features.data, [1, 80, features.frames]),
    ...(options.language === undefined ? {} : { language: options.language }),
    ...(options.task === undefined ? {} : { task: options.task }),
    return_timestamps: options.timestamps === true
  } as never)) as Tensor
  return Array.from(output.data as BigInt64Array, Number)
}

describe("Whisper speech recognition against transformers.js", () => {
  it("has the names the community's exports have", async () => {
    const encoder = await session(join(modelDir, "onnx", "encoder_model.onnx"))
    expect(encoder.inputNames).toEqual(["input_features"])
    expect(encoder.outputNames).toEqual(["last_hidden_state"])
    const decoder = await session(join(modelDir, "onnx", "decoder_model_merged.onnx"))
    expect(decoder.inputNames).toEqual([
      "input_ids",
      "encoder_hidden_states",
      ...[0, 1].flatMap((layer) =>
        ["decoder.key", "decoder.value", "encoder.key", "encoder.value"].map(
          (name) => `past_key_values.${layer}.${name}`
        )
      ),
      "use_cache_branch"
    ])
    expect(decoder.outputNames).toEqual([
      ...[0, 1].flatMap((layer) =>
        ["decoder.key", "decoder.value", "encoder.key", "encoder.value"].map((name) => `present.${layer}.${name}`)
      ),
      "logits"
    ])
    await encoder.release()
    await decoder.release()
  })

  it.each([
    [{ language: "en" }, 3.2, 1],
    [{ language: "de" }, 5.5, 2],
    [{ language: "french", task: "translate" }, 9.1, 3],
    [{ timestamps: true }, 4.4, 4],
    [{ language: "es", timestamps: true }, 12.7, 5],
    [{ timestamps: true }, 27, 6]
  ] as const)("%j: a %f s clip's tokens equal generate's", async (options, seconds, seed) => {
    const clip = speechLike(seconds, seed)
    const { tokens } = await ours(clip, options)
    expect(tokens).toHaveLength(1)
    expect(tokens[0]).toEqual(await referenceTokens(clip, options))
  })

  it("decodes a batch of clips of different prompts and lengths as each alone", async () => {
    const clips = [1, 2, 3, 4, 5].map((seed) => speechLike(2 + seed * 1.7, seed + 10))
    const prompts = [{ language: "en" }, { language: "de" }, { timestamps: true }, { language: "en" }, {}].map(
      (options) => Either.getOrThrow(whisperPrompt(recognizer.settings, options))
    )
    const passes = clips.map((clip, index) => ({
      features: whisperFeatures(extractor, clip).data,
      prompt: prompts[index]!
    }))
    const batched = await recognizer.decode(passes)
    for (const [index, pass] of passes.entries()) {
      expect(batched[index]).toEqual((await recognizer.decode([pass]))[0])
    }
  })

  it.each([
    [false, 8.3, 7, 0],
    [true, 8.3, 7, 0],
    [false, 71, 12, 30],
    [true, 71, 8, 30],
    [false, 33, 9, 10],
    [true, 33, 9, 10]
  ] as const)(
    "timestamps %s, a %f s clip (seed %d) in windows of %d s: the pipeline's text and segments",
    async (timestamps, seconds, seed, chunkSeconds) => {
      const clip = speechLike(seconds, seed)
      const reference = (await asr(clip, {
        language: "en",
        return_timestamps: timestamps,
        ...(chunkSeconds === 0 ? {} : { chunk_length_s: chunkSeconds })
      } as never)) as { text: string; chunks?: Array<{ timestamp: [number, number | null]; text: string }> }
      const { transcript, passes, windowCount } = await ours(clip, { language: "en", timestamps, chunkSeconds })
      // This clip's windows end mid-segment: they are passed again from their last complete segment.
      if (timestamps && seconds === 33) expect(passes).toBeGreaterThan(windowCount)
      expect(transcript.text.length).toBeGreaterThan(0)
      expect(transcript).toEqual(reference)
    },
    60_000
  )
})
