import {
  type WhisperDecoderLayer,
  whisperDecoderGraph,
  whisperEncoderGraph,
  type WhisperSize,
  type WhisperWeights
} from "../architectures/Whisper.js"
import { type ByteLevelBpe, byteLevelBpe } from "../ByteLevelBpe.js"
import { Random } from "../Random.js"
import { type AttentionWeights, type LinearWeights, matrix } from "../Weights.js"
import { jsonFile, type ModelFiles, type ModelRecipe, recipeStamp } from "./Recipe.js"
import { unitLayerNorm } from "./RandomWeights.js"

/**
 * A random-weight Whisper in the community's export layout (onnx/encoder_model.onnx,
 * onnx/decoder_model_merged.onnx), with Whisper's config.json, generation_config.json (language
 * and task ids, <|notimestamps|>, suppressed tokens), preprocessor_config.json (80 mel bins,
 * 30 s) and a byte-level BPE tokenizer holding Whisper's special tokens in Whisper's order:
 * <|endoftext|>, <|startoftranscript|>, the languages, <|translate|>, <|transcribe|>,
 * <|startoflm|>, <|startofprev|>, <|nocaptions|>, <|notimestamps|>, then the 1501 timestamps
 * <|0.00|> … <|30.00|>.
 */

/** A few of Whisper's languages, in Whisper's order (its ids follow <|startoftranscript|>). */
export const whisperLanguages = ["en", "zh", "de", "es", "ru", "ko", "fr"] as const

const timestampTokens = Array.from({ length: 1501 }, (_, i) => `<|${(i * 0.02).toFixed(2)}|>`)

export const whisperSpecialTokens = [
  "<|endoftext|>",
  "<|startoftranscript|>",
  ...whisperLanguages.map((code) => `<|${code}|>`),
  "<|translate|>",
  "<|transcribe|>",
  "<|startoflm|>",
  "<|startofprev|>",
  "<|nocaptions|>",
  "<|notimestamps|>",
  ...timestampTokens
]

const words = [
  " the",
  " a",
  " and",
  " is",
  " in",
  " of",
  " to",
  " it",
  " red",
  " green",
  " blue",
  " light",
  " sound",
  " hello",
  " world",
  " speech",
  " music",
  " morning",
  " quiet",
  " loud",
  "The",
  "Hello",
  "It",
  ".",
  ",",
  "?"
]

/** The fixture's vocabulary; `vocabSize` pads it with unused tokens before the special ones (51865 is Whisper's). */
export const randomWhisperVocabulary = (vocabSize?: number): ByteLevelBpe =>
  byteLevelBpe({ words, specialTokens: whisperSpecialTokens, ...(vocabSize === undefined ? {} : { vocabSize }) })

/** preprocessor_config.json of Whisper's feature extractor (16 kHz, 30 s windows), as the exports write it. */
export const whisperPreprocessorConfig = (processorClass: string, melBins: number) => ({
  feature_extractor_type: "WhisperFeatureExtractor",
  processor_class: processorClass,
  feature_size: melBins,
  sampling_rate: 16000,
  hop_length: 160,
  chunk_length: 30,
  n_fft: 400,
  n_samples: 480000,
  nb_max_frames: 3000,
  padding_side: "right",
  padding_value: 0,
  return_attention_mask: false
})

/** Whisper's timestamp tokens are added tokens but not special ones: its tokenizers keep them apart from text by id. */
const withTextTimestamps = (tokenizerJson: Record<string, unknown>): Record<string, unknown> => ({
  ...tokenizerJson,
  added_tokens: (tokenizerJson.added_tokens as ReadonlyArray<{ readonly content: string }>).map((token) =>
    timestampTokens.includes(token.content) ? { ...token, special: false } : token
  )
})

export interface RandomWhisperOptions {
  readonly seed?: number
  readonly dModel?: number
  readonly heads?: number
  readonly encoderLayers?: number
  readonly decoderLayers?: number
  /** generation_config.json's max_length: the longest a chunk's tokens get, prompt tokens included. */
  readonly maxLength?: number
  /** Scale of the output projection (and so of the logits): larger answers more decisively. */
  readonly embeddingStd?: number
  /** The vocabulary's size, padded with unused tokens (Whisper's is 51865); by default just what the fixture uses. */
  readonly vocabSize?: number
  /** More fields for config.json (a built-in recipe's stamp). */
  readonly config?: Readonly<Record<string, unknown>>
}

export interface RandomWhisper {
  readonly files: ModelFiles
  readonly tokenId: (text: string) => number
  readonly size: WhisperSize
}

const randomLinear = (random: Random, inputs: number, outputs: number, bias: boolean): LinearWeights => {
  const weight = matrix(inputs, outputs, random.normals(inputs * outputs, 1 / Math.sqrt(inputs)))
  return bias ? { weight, bias: random.normals(outputs, 0.05) } : { weight }
}

const randomAttention = (random: Random, size: WhisperSize): AttentionWeights => ({
  heads: size.heads,
  query: randomLinear(random, size.dModel, size.dModel, true),
  // Whisper's k_proj has no bias.
  key: randomLinear(random, size.dModel, size.dModel, false),
  value: randomLinear(random, size.dModel, size.dModel, true),
  output: randomLinear(random, size.dModel, size.dModel, true)
})

const randomMlp = (random: Random, size: WhisperSize) => ({
  up: randomLinear(random, size.dModel, size.ffn, true),
  down: randomLinear(random, size.ffn, size.dModel, true)
})

/** Whisper's fixed encoder positions: sines over the first half of the width, cosines over the second. */
const sinusoids = (positions: number, width: number): Float32Array => {
  const out = new Float32Array(positions * width)
  const half = width / 2
  const increment = Math.log(10000) / (half - 1)
  for (let p = 0; p < positions; p++) {
    for (let i = 0; i < half; i++) {
      const angle = p * Math.exp(-increment * i)
      out[p * width + i] = Math.sin(angle)
      out[p * width + half + i] = Math.cos(angle)
    }
  }
  return out
}

/**
 * The output projection, untied from the embeddings (a tied random model repeats its last token
 * forever), with the single bytes and the timestamps scaled down: a random model then writes
 * mostly words, as a trained one does, instead of the 1501 timestamps and the control bytes that
 * outnumber them.
 */
const outputProjection = (random: Random, size: WhisperSize, std: number, timestampBegin: number): Float32Array => {
  const data = random.normals(size.vocabSize * size.dModel, std)
  for (let d = 0; d < size.dModel; d++) {
    for (let token = 0; token < size.vocabSize; token++) {
      data[d * size.vocabSize + token]! *= token < 256 ? 0.3 : token >= timestampBegin ? 0.6 : 1
    }
  }
  // Read against the final norm's constant first feature (timeFeature): early timestamps likelier
  // than late ones, so that segments fall inside short clips as a trained model's do.
  // Other tokens do not read that feature.
  for (let token = 0; token < size.vocabSize; token++) {
    data[token]! = token < timestampBegin ? 0 : 1 - (3 * (token - timestampBegin)) / (size.vocabSize - timestampBegin)
  }
  return data
}

/** The decoder's final norm adds this to its first feature, which the timestamps' logits read. */
const timeFeature = 2

const randomWeights = (
  random: Random,
  size: WhisperSize,
  embeddingStd: number,
  timestampBegin: number
): WhisperWeights => {
  const epsilon = 1e-5
  const conv = (inputs: number) => ({
    kernel: random.normals(size.dModel * inputs * 3, 1 / Math.sqrt(inputs * 3)),
    bias: random.normals(size.dModel, 0.05)
  })
  return {
    conv1: conv(size.melBins),
    conv2: conv(size.dModel),
    encoderPositions: matrix(size.sourcePositions, size.dModel, sinusoids(size.sourcePositions, size.dModel)),
    encoderLayers: Array.from({ length: size.encoderLayers }, () => ({
      norm1: unitLayerNorm(size.dModel, epsilon),
      attention: randomAttention(random, size),
      norm2: unitLayerNorm(size.dModel, epsilon),
      mlp: randomMlp(random, size)
    })),
    encoderNorm: unitLayerNorm(size.dModel, epsilon),
    embedTokens: matrix(size.vocabSize, size.dModel, random.normals(size.vocabSize * size.dModel, 1)),
    outputProjection: matrix(size.dModel, size.vocabSize, outputProjection(random, size, embeddingStd, timestampBegin)),
    decoderPositions: matrix(
      size.targetPositions,
      size.dModel,
      random.normals(size.targetPositions * size.dModel, 0.1)
    ),
    decoderLayers: Array.from(
      { length: size.decoderLayers },
      (): WhisperDecoderLayer => ({
        selfNorm: unitLayerNorm(size.dModel, epsilon),
        self: randomAttention(random, size),
        crossNorm: unitLayerNorm(size.dModel, epsilon),
        cross: randomAttention(random, size),
        mlpNorm: unitLayerNorm(size.dModel, epsilon),
        mlp: randomMlp(random, size)
      })
    ),
    decoderNorm: {
      ...unitLayerNorm(size.dModel, epsilon),
      beta: Float32Array.from({ length: size.dModel }, (_, d) => (d === 0 ? timeFeature : 0))
    }
  }
}

export const randomWhisperFiles = (options: RandomWhisperOptions = {}): RandomWhisper => {
  const vocabulary = randomWhisperVocabulary(options.vocabSize)
  const id = vocabulary.tokenId
  const dModel = options.dModel ?? 64
  const size: WhisperSize = {
    melBins: 80,
    dModel,
    heads: options.heads ?? 2,
    encoderLayers: options.encoderLayers ?? 2,
    decoderLayers: options.decoderLayers ?? 2,
    ffn: dModel * 4,
    vocabSize: vocabulary.vocabSize,
    sourcePositions: 1500,
    targetPositions: 448
  }
  const weights = randomWeights(
    new Random(options.seed ?? 1),
    size,
    options.embeddingStd ?? 0.35,
    id("<|notimestamps|>") + 1
  )
  const endOfText = id("<|endoftext|>")
  const startOfTranscript = id("<|startoftranscript|>")
  const noTimestamps = id("<|notimestamps|>")
  const languageIds = Object.fromEntries(whisperLanguages.map((code) => [`<|${code}|>`, id(`<|${code}|>`)]))
  // As Whisper's: the tokens it never writes (the task and prompt markers), and at the start neither a space nor the end.
  const suppressTokens = ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>"].map(
    id
  )
  const beginSuppressTokens = [id(" "), endOfText]
  const common = {
    decoder_start_token_id: startOfTranscript,
    eos_token_id: endOfText,
    bos_token_id: endOfText,
    pad_token_id: endOfText,
    suppress_tokens: suppressTokens,
    begin_suppress_tokens: beginSuppressTokens
  }
  const files = new Map<string, Uint8Array>([
    [
      "config.json",
      jsonFile({
        architectures: ["WhisperForConditionalGeneration"],
        model_type: "whisper",
        is_encoder_decoder: true,
        d_model: size.dModel,
        encoder_layers: size.encoderLayers,
        decoder_layers: size.decoderLayers,
        encoder_attention_heads: size.heads,
        decoder_attention_heads: size.heads,
        encoder_ffn_dim: size.ffn,
        decoder_ffn_dim: size.ffn,
        num_mel_bins: size.melBins,
        max_source_positions: size.sourcePositions,
        max_target_positions: size.targetPositions,
        vocab_size: size.vocabSize,
        activation_function: "gelu",
        scale_embedding: false,
        use_cache: true,
        ...common,
        ...options.config
      })
    ],
    [
      "generation_config.json",
      jsonFile({
        ...common,
        max_length: options.maxLength ?? 48,
        no_timestamps_token_id: noTimestamps,
        is_multilingual: true,
        lang_to_id: languageIds,
        task_to_id: { transcribe: id("<|transcribe|>"), translate: id("<|translate|>") },
        max_initial_timestamp_index: 50,
        return_timestamps: false,
        alignment_heads: [[size.decoderLayers - 1, 0]]
      })
    ],
    ["preprocessor_config.json", jsonFile(whisperPreprocessorConfig("WhisperProcessor", size.melBins))],
    ["tokenizer.json", jsonFile(withTextTimestamps(vocabulary.tokenizerJson))],
    [
      "tokenizer_config.json",
      jsonFile({
        tokenizer_class: "WhisperTokenizer",
        bos_token: "<|endoftext|>",
        eos_token: "<|endoftext|>",
        unk_token: "<|endoftext|>",
        pad_token: "<|endoftext|>",
        model_max_length: 1024,
        clean_up_tokenization_spaces: true,
        errors: "replace"
      })
    ],
    ["onnx/encoder_model.onnx", whisperEncoderGraph(size, weights).toBytes()],
    ["onnx/decoder_model_merged.onnx", whisperDecoderGraph(size, weights).toBytes()]
  ])
  return { files, tokenId: id, size }
}

/**
 * cornserve/tiny-whisper: the random Whisper above (2 + 2 layers at 64 wide, 48 tokens a window),
 * the built-in speech recognizer the examples use. Its transcripts are words of its small vocabulary
 * that depend on the audio, with segment timestamps; for real speech, name a community export such
 * as onnx-community/whisper-base instead.
 */
export const tinyWhisper: ModelRecipe = {
  name: "cornserve/tiny-whisper",
  version: 1,
  build: () =>
    randomWhisperFiles({ seed: 3, config: { cornserve: recipeStamp({ name: "cornserve/tiny-whisper", version: 1 }) } })
      .files
}
