import {
  type Conv1dWeights,
  type HifiGanSize,
  type HifiGanWeights,
  hifiGanChannels,
  hifiGanGraph,
  hifiGanHop,
  type SpeechT5DecoderLayer,
  speechT5DecoderGraph,
  speechT5EncoderGraph,
  type SpeechT5Size,
  type SpeechT5Weights
} from "../architectures/SpeechT5.js"
import { Random } from "../Random.js"
import { type AttentionWeights, type LinearWeights, matrix } from "../Weights.js"
import { jsonFile, type ModelFiles, type ModelRecipe, recipeStamp } from "./Recipe.js"
import { unitLayerNorm } from "./RandomWeights.js"

/**
 * A random-weight SpeechT5 text-to-speech model in the community's export layout
 * (Xenova/speecht5_tts: onnx/encoder_model.onnx, onnx/decoder_model_merged.onnx, SpeechT5's
 * config.json, a character tokenizer as SpeechT5's sentencepiece one converts to), with a random
 * HiFi-GAN vocoder in the layout of Xenova/speecht5_hifigan in its `vocoder/` folder and speaker
 * embeddings in `voices/NAME.bin` (little-endian float32, SpeechT5's x-vector size).
 */

const specialTokens = ["<s>", "<pad>", "</s>", "<unk>"]
const characters = [..."▁etaonihsrdlumwcfgypbvk'.,?!-xjqz0123456789ETAONIHSRDLUMWCFGYPBVKXJQZ"]

/**
 * SpeechT5's tokenizer.json as the converter writes a character sentencepiece model: a Unigram model
 * over single characters (with ▁ for the spaces Metaspace puts before words), </s> after the text.
 */
export const speechT5TokenizerJson = () => ({
  version: "1.0",
  truncation: null,
  padding: null,
  added_tokens: specialTokens.map((content, id) => ({
    id,
    content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: true
  })),
  normalizer: null,
  pre_tokenizer: { type: "Metaspace", replacement: "▁", prepend_scheme: "always", split: true },
  post_processor: {
    type: "TemplateProcessing",
    single: [{ Sequence: { id: "A", type_id: 0 } }, { SpecialToken: { id: "</s>", type_id: 0 } }],
    pair: [
      { Sequence: { id: "A", type_id: 0 } },
      { Sequence: { id: "B", type_id: 0 } },
      { SpecialToken: { id: "</s>", type_id: 0 } }
    ],
    special_tokens: { "</s>": { id: "</s>", ids: [2], tokens: ["</s>"] } }
  },
  decoder: { type: "Metaspace", replacement: "▁", prepend_scheme: "always", split: true },
  model: {
    type: "Unigram",
    unk_id: 3,
    vocab: [
      ...specialTokens.map((token) => [token, 0]),
      ...characters.map((character, index) => [character, -1 - index / characters.length])
    ],
    byte_fallback: false
  }
})

export const speechT5VocabSize = specialTokens.length + characters.length

export interface RandomSpeechT5Options {
  readonly seed?: number
  readonly hidden?: number
  readonly heads?: number
  readonly encoderLayers?: number
  readonly decoderLayers?: number
  readonly ffn?: number
  readonly speakerDim?: number
  readonly prenetUnits?: number
  /** The stop logit's growth a step (see SpeechT5Weights.stop). */
  readonly stopSlope?: number
  readonly stepsPerToken?: number
  readonly vocoder?: Partial<HifiGanSize>
  /** Names of the voices written in voices/ (random speaker embeddings). */
  readonly voices?: ReadonlyArray<string>
  /** More fields for config.json (a built-in recipe's stamp). */
  readonly config?: Readonly<Record<string, unknown>>
}

export interface RandomSpeechT5 {
  readonly files: ModelFiles
  readonly size: SpeechT5Size
  readonly vocoder: HifiGanSize
  readonly voices: ReadonlyMap<string, Float32Array>
}

const randomLinear = (random: Random, inputs: number, outputs: number, std = 1 / Math.sqrt(inputs)): LinearWeights => ({
  weight: matrix(inputs, outputs, random.normals(inputs * outputs, std)),
  bias: random.normals(outputs, 0.05)
})

const randomAttention = (random: Random, hidden: number, heads: number): AttentionWeights => ({
  heads,
  query: randomLinear(random, hidden, hidden),
  key: randomLinear(random, hidden, hidden),
  value: randomLinear(random, hidden, hidden),
  output: randomLinear(random, hidden, hidden)
})

const randomConv = (random: Random, outputs: number, inputs: number, kernel: number, gain = 1): Conv1dWeights => ({
  kernel: random.normals(outputs * inputs * kernel, gain / Math.sqrt(inputs * kernel)),
  bias: random.normals(outputs, 0.01)
})

const randomSpeechT5Weights = (random: Random, size: SpeechT5Size, stop: SpeechT5Weights["stop"]): SpeechT5Weights => {
  const epsilon = 1e-5
  const mlp = () => ({
    up: randomLinear(random, size.hidden, size.ffn),
    down: randomLinear(random, size.ffn, size.hidden)
  })
  return {
    embedTokens: matrix(size.vocabSize, size.hidden, random.normals(size.vocabSize * size.hidden, 1)),
    textAlpha: 1,
    speechAlpha: 1,
    encoderLayers: Array.from({ length: size.encoderLayers }, () => ({
      norm1: unitLayerNorm(size.hidden, epsilon),
      attention: randomAttention(random, size.hidden, size.heads),
      norm2: unitLayerNorm(size.hidden, epsilon),
      mlp: mlp()
    })),
    encoderNorm: unitLayerNorm(size.hidden, epsilon),
    prenet: Array.from({ length: size.prenetLayers }, (_, index) =>
      randomLinear(random, index === 0 ? size.melBins : size.prenetUnits, size.prenetUnits)
    ),
    prenetOut: randomLinear(random, size.prenetUnits, size.hidden),
    speakerProjection: randomLinear(random, size.hidden + size.speakerDim, size.hidden),
    decoderLayers: Array.from(
      { length: size.decoderLayers },
      (): SpeechT5DecoderLayer => ({
        selfNorm: unitLayerNorm(size.hidden, epsilon),
        self: randomAttention(random, size.hidden, size.heads),
        crossNorm: unitLayerNorm(size.hidden, epsilon),
        cross: randomAttention(random, size.hidden, size.heads),
        mlpNorm: unitLayerNorm(size.hidden, epsilon),
        mlp: mlp()
      })
    ),
    decoderNorm: unitLayerNorm(size.hidden, epsilon),
    featOut: randomLinear(random, size.hidden, size.reductionFactor * size.melBins),
    probOut: randomLinear(random, size.hidden, size.reductionFactor, 0.1 / Math.sqrt(size.hidden)),
    stop
  }
}

const randomHifiGanWeights = (random: Random, size: HifiGanSize): HifiGanWeights => ({
  mean: random.normals(size.melBins, 0.1),
  scale: Float32Array.from({ length: size.melBins }, () => 1 + random.uniform()),
  convPre: randomConv(random, size.upsampleInitialChannel, size.melBins, 7),
  upsamplers: size.upsampleRates.map((_, stage) => {
    const inputs = stage === 0 ? size.upsampleInitialChannel : hifiGanChannels(size, stage - 1)
    const kernel = size.upsampleKernelSizes[stage]!
    // A ConvTranspose kernel is [in, out, kernel]; its fan-in per output is in × kernel / stride.
    return randomConv(random, hifiGanChannels(size, stage), inputs, kernel, Math.sqrt(size.upsampleRates[stage]!))
  }),
  resblocks: size.upsampleRates.map((_, stage) => {
    const channels = hifiGanChannels(size, stage)
    return size.resblockKernelSizes.map((kernel, k) =>
      size.resblockDilationSizes[k]!.map(() => ({
        dilated: randomConv(random, channels, channels, kernel, 0.5),
        plain: randomConv(random, channels, channels, kernel, 0.5)
      }))
    )
  }),
  convPost: randomConv(random, 1, hifiGanChannels(size, size.upsampleRates.length - 1), 7)
})

/** The voices' speaker embeddings: x-vectors are unit-scale vectors, normalised by the prenet anyway. */
const randomVoice = (random: Random, dim: number) => random.normals(dim, 0.05)

export const randomSpeechT5Files = (options: RandomSpeechT5Options = {}): RandomSpeechT5 => {
  const random = new Random(options.seed ?? 1)
  const hidden = options.hidden ?? 64
  const size: SpeechT5Size = {
    hidden,
    heads: options.heads ?? 2,
    encoderLayers: options.encoderLayers ?? 2,
    decoderLayers: options.decoderLayers ?? 2,
    ffn: options.ffn ?? hidden * 4,
    vocabSize: speechT5VocabSize,
    melBins: 80,
    reductionFactor: 2,
    speakerDim: options.speakerDim ?? 512,
    prenetUnits: options.prenetUnits ?? 64,
    prenetLayers: 2,
    maxTextPositions: 600,
    maxSpeechPositions: 4000
  }
  const vocoder: HifiGanSize = {
    melBins: 80,
    upsampleInitialChannel: 32,
    upsampleRates: [4, 4, 4, 4],
    upsampleKernelSizes: [8, 8, 8, 8],
    resblockKernelSizes: [3, 7],
    resblockDilationSizes: [
      [1, 3, 5],
      [1, 3, 5]
    ],
    leakyReluSlope: 0.1,
    ...options.vocoder
  }
  const weights = randomSpeechT5Weights(random, size, {
    slope: options.stopSlope ?? 0.5,
    stepsPerToken: options.stepsPerToken ?? 2
  })
  const vocoderWeights = randomHifiGanWeights(random, vocoder)
  const voices = new Map(
    (options.voices ?? ["alloy", "echo", "nova"]).map((name) => [name, randomVoice(random, size.speakerDim)])
  )
  const files = new Map<string, Uint8Array>([
    [
      "config.json",
      jsonFile({
        architectures: ["SpeechT5ForTextToSpeech"],
        model_type: "speecht5",
        is_encoder_decoder: true,
        hidden_size: size.hidden,
        encoder_layers: size.encoderLayers,
        decoder_layers: size.decoderLayers,
        encoder_attention_heads: size.heads,
        decoder_attention_heads: size.heads,
        encoder_ffn_dim: size.ffn,
        decoder_ffn_dim: size.ffn,
        vocab_size: size.vocabSize,
        num_mel_bins: size.melBins,
        reduction_factor: size.reductionFactor,
        speaker_embedding_dim: size.speakerDim,
        speech_decoder_prenet_units: size.prenetUnits,
        speech_decoder_prenet_layers: size.prenetLayers,
        max_text_positions: size.maxTextPositions,
        max_speech_positions: size.maxSpeechPositions,
        bos_token_id: 0,
        pad_token_id: 1,
        eos_token_id: 2,
        decoder_start_token_id: 2,
        use_cache: true,
        ...options.config
      })
    ],
    [
      "generation_config.json",
      jsonFile({ bos_token_id: 0, decoder_start_token_id: 2, eos_token_id: 2, pad_token_id: 1, max_length: 1876 })
    ],
    [
      "preprocessor_config.json",
      jsonFile({
        feature_extractor_type: "SpeechT5FeatureExtractor",
        processor_class: "SpeechT5Processor",
        feature_size: 1,
        num_mel_bins: size.melBins,
        sampling_rate: 16000,
        hop_length: 16,
        win_length: 64,
        fmin: 80,
        fmax: 7600,
        padding_value: 0,
        do_normalize: false,
        return_attention_mask: true
      })
    ],
    ["tokenizer.json", jsonFile(speechT5TokenizerJson())],
    [
      "tokenizer_config.json",
      jsonFile({
        tokenizer_class: "SpeechT5Tokenizer",
        bos_token: "<s>",
        eos_token: "</s>",
        unk_token: "<unk>",
        pad_token: "<pad>",
        model_max_length: 600,
        normalize: false
      })
    ],
    ["onnx/encoder_model.onnx", speechT5EncoderGraph(size, weights).toBytes()],
    ["onnx/decoder_model_merged.onnx", speechT5DecoderGraph(size, weights).toBytes()],
    [
      "vocoder/config.json",
      jsonFile({
        architectures: ["SpeechT5HifiGan"],
        model_type: "hifigan",
        model_in_dim: vocoder.melBins,
        sampling_rate: 16000,
        upsample_initial_channel: vocoder.upsampleInitialChannel,
        upsample_rates: vocoder.upsampleRates,
        upsample_kernel_sizes: vocoder.upsampleKernelSizes,
        resblock_kernel_sizes: vocoder.resblockKernelSizes,
        resblock_dilation_sizes: vocoder.resblockDilationSizes,
        leaky_relu_slope: vocoder.leakyReluSlope,
        normalize_before: true
      })
    ],
    ["vocoder/onnx/model.onnx", hifiGanGraph(vocoder, vocoderWeights).toBytes()],
    ...[...voices].map(([name, embedding]): [string, Uint8Array] => [
      `voices/${name}.bin`,
      new Uint8Array(embedding.buffer, embedding.byteOffset, embedding.byteLength)
    ])
  ])
  return { files, size, vocoder, voices }
}

/** Samples per second of the vocoder's waveform and samples per spectrogram frame. */
export const speechT5Rates = (vocoder: HifiGanSize) => ({ sampleRate: 16000, hop: hifiGanHop(vocoder) })

/**
 * cornserve/tiny-speecht5: the random SpeechT5 above (2 + 2 layers at 64 wide, a 32-channel
 * HiFi-GAN), the built-in speech synthesizer the examples use, with the voices alloy, echo and nova.
 * It speaks noise shaped by the text, about 64 ms a character; for real speech, name the community's
 * Xenova/speecht5_tts instead (with Xenova/speecht5_hifigan as its vocoder).
 */
export const tinySpeechT5: ModelRecipe = {
  name: "cornserve/tiny-speecht5",
  version: 1,
  build: () =>
    randomSpeechT5Files({
      seed: 5,
      config: { cornserve: recipeStamp({ name: "cornserve/tiny-speecht5", version: 1 }) }
    }).files
}
