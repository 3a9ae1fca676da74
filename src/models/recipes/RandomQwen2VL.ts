import {
  type Qwen2VLConfig,
  type Qwen2VLTextConfig,
  type Qwen2VLTextWeights,
  type Qwen2VLVisionConfig,
  type Qwen2VLVisionWeights,
  qwen2VLConfigJson,
  qwen2VLGraphs,
  qwen2VLTextConfigJson
} from "../architectures/Qwen2VL.js"
import type { Qwen2DecoderLayerWeights, Qwen2TextWeights } from "../architectures/Qwen2Decoder.js"
import { type ByteLevelBpe, byteLevelBpe } from "../ByteLevelBpe.js"
import { Random } from "../Random.js"
import { matrix } from "../Weights.js"
import { jsonFile, type ModelFiles } from "./Recipe.js"
import { WeightDraw } from "./RandomWeights.js"

/**
 * Model directories of a random-weight Qwen2-VL in the community's split layout
 * (onnx/vision_encoder.onnx, onnx/embed_tokens.onnx, onnx/decoder_model_merged.onnx, fp32) with
 * the config, preprocessor config, generation config, tokenizer and chat template that
 * transformers.js's Qwen2VLForConditionalGeneration and Qwen2VLProcessor read.
 */

/** Qwen2's special tokens, in the order (and so the relative ids) of the real vocabulary. */
export const qwen2VLSpecialTokens = {
  endOfText: "<|endoftext|>",
  imStart: "<|im_start|>",
  imEnd: "<|im_end|>",
  objectRefStart: "<|object_ref_start|>",
  objectRefEnd: "<|object_ref_end|>",
  boxStart: "<|box_start|>",
  boxEnd: "<|box_end|>",
  quadStart: "<|quad_start|>",
  quadEnd: "<|quad_end|>",
  visionStart: "<|vision_start|>",
  visionEnd: "<|vision_end|>",
  visionPad: "<|vision_pad|>",
  imagePad: "<|image_pad|>",
  videoPad: "<|video_pad|>"
} as const

/** Qwen2-VL-Instruct's chat template: image parts become <|vision_start|><|image_pad|><|vision_end|>. */
export const qwen2VLChatTemplate =
  "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"

/**
 * A small byte-level BPE with single tokens for the chat template's words and Qwen2's special
 * tokens, then `extraSpecialTokens` (a model's own, such as LLaVA-OneVision's <image>).
 */
export const qwen2VLVocabulary = (extraSpecialTokens: ReadonlyArray<string> = []): ByteLevelBpe =>
  byteLevelBpe({
    words: [
      "system",
      "user",
      "assistant",
      "You",
      " are",
      " a",
      " helpful",
      " assistant",
      "What",
      " is",
      " in",
      " this",
      " image",
      "Describe",
      " the",
      " picture",
      "Hello"
    ],
    specialTokens: [...Object.values(qwen2VLSpecialTokens), ...extraSpecialTokens]
  })

/** tokenizer_config.json of the Qwen-VL recipes (Qwen3-VL's with its own chat template), the vocabulary's extra special tokens included. */
export const qwen2VLTokenizerConfig = (
  vocabulary: ByteLevelBpe,
  modelMaxLength: number,
  chatTemplate: string = qwen2VLChatTemplate,
  extraSpecialTokens: ReadonlyArray<string> = []
) => ({
  tokenizer_class: "Qwen2Tokenizer",
  add_prefix_space: false,
  bos_token: null,
  eos_token: qwen2VLSpecialTokens.imEnd,
  pad_token: qwen2VLSpecialTokens.endOfText,
  unk_token: null,
  errors: "replace",
  clean_up_tokenization_spaces: false,
  model_max_length: modelMaxLength,
  split_special_tokens: false,
  chat_template: chatTemplate,
  additional_special_tokens: [...Object.values(qwen2VLSpecialTokens).slice(1), ...extraSpecialTokens],
  added_tokens_decoder: Object.fromEntries(
    [...Object.values(qwen2VLSpecialTokens), ...extraSpecialTokens].map((content) => [
      String(vocabulary.tokenId(content)),
      { content, lstrip: false, normalized: false, rstrip: false, single_word: false, special: true }
    ])
  )
})

/**
 * A geometry small enough for tests: two vision blocks of width 32, two decoder layers of width 64.
 * The embeddings are not tied (Qwen2-VL-2B ties them): a random model whose logits are its own
 * embeddings repeats the last token, which would make greedy comparisons say little.
 */
export const tinyQwen2VLConfig = (vocabSize: number): Qwen2VLConfig => ({
  vision: {
    depth: 2,
    embedDim: 32,
    heads: 2,
    mlpRatio: 2,
    inChannels: 3,
    patchSize: 14,
    temporalPatchSize: 2,
    spatialMergeSize: 2
  },
  text: {
    hiddenSize: 64,
    intermediateSize: 128,
    layers: 2,
    heads: 4,
    kvHeads: 2,
    vocabSize,
    maxPositions: 4096,
    ropeTheta: 1000000,
    rmsNormEps: 1e-6,
    mropeSection: [2, 3, 3],
    tieWordEmbeddings: false
  }
})

export const randomQwen2VLVisionWeights = (
  config: Qwen2VLVisionConfig,
  textHidden: number,
  random: Random
): Qwen2VLVisionWeights => {
  const draw = new WeightDraw(random)
  const { embedDim } = config
  const patchWidth = config.inChannels * config.temporalPatchSize * config.patchSize ** 2
  const mergedWidth = embedDim * config.spatialMergeSize ** 2
  const mlpWidth = embedDim * config.mlpRatio
  return {
    config,
    patchEmbed: draw.linear(patchWidth, embedDim, false).weight,
    blocks: Array.from({ length: config.depth }, () => ({
      norm1: draw.layerNorm(embedDim),
      qkv: draw.linear(embedDim, 3 * embedDim, true),
      proj: draw.linear(embedDim, embedDim, true),
      norm2: draw.layerNorm(embedDim),
      fc1: draw.linear(embedDim, mlpWidth, true),
      fc2: draw.linear(mlpWidth, embedDim, true)
    })),
    merger: {
      norm: draw.layerNorm(embedDim),
      fc1: draw.linear(mergedWidth, mergedWidth, true),
      fc2: draw.linear(mergedWidth, textHidden, true)
    }
  }
}

/** A Qwen2 language model's random weights (Qwen2-VL's, LLaVA-OneVision's), drawn in one order. */
export const randomQwen2VLTextWeights = <C extends Qwen2TextWeights["config"] = Qwen2VLTextConfig>(
  config: C,
  random: Random
): Qwen2TextWeights & { readonly config: C } => {
  const draw = new WeightDraw(random)
  const { hiddenSize: hidden, vocabSize, intermediateSize } = config
  const headDim = hidden / config.heads
  const embedTokens = matrix(vocabSize, hidden, random.normals(vocabSize * hidden, 1))
  const layers = Array.from(
    { length: config.layers },
    (): Qwen2DecoderLayerWeights => ({
      inputNorm: draw.scales(hidden),
      ...draw.attention(hidden, config.heads, config.kvHeads, headDim, true),
      postNorm: draw.scales(hidden),
      ...draw.gatedMlp(hidden, intermediateSize)
    })
  )
  const norm = draw.scales(hidden)
  return { config, embedTokens, layers, norm, lmHead: draw.lmHead(embedTokens, config.tieWordEmbeddings) }
}

/** The weights of one seed: the vision tower's drawn first, then the language model's. */
export const randomQwen2VLWeights = (
  config: Qwen2VLConfig,
  seed: number
): { readonly vision: Qwen2VLVisionWeights; readonly text: Qwen2VLTextWeights } => {
  const random = new Random(seed)
  const vision = randomQwen2VLVisionWeights(config.vision, config.text.hiddenSize, random)
  return { vision, text: randomQwen2VLTextWeights(config.text, random) }
}

export interface RandomQwen2VLOptions {
  /** The geometry; by default `tinyQwen2VLConfig` at the vocabulary's size. */
  readonly config?: Qwen2VLConfig
  readonly seed?: number
  /** preprocessor_config.json's pixel bounds; small by default so that images stay a few patches. */
  readonly minPixels?: number
  readonly maxPixels?: number
  /** Fields added to config.json. */
  readonly extraConfig?: Record<string, unknown>
  /**
   * The export to name things as: Qwen2-VL's (the default) or Qwen2.5-VL's, whose config.json says
   * qwen2_5_vl and whose vision encoder takes image_grid_thw. The vision tower stays Qwen2-VL's
   * (Qwen2.5-VL's window attention and gated MLP are inside its graph, which the platform runs as
   * it is).
   */
  readonly family?: "qwen2_vl" | "qwen2_5_vl"
  /**
   * A real tokenizer (tokenizer.json and tokenizer_config.json, e.g. the Qwen3 vocabulary, which
   * has Qwen2-VL's special tokens at the same ids) in place of the small one; its chat template is
   * replaced by Qwen2-VL's.
   */
  readonly tokenizer?: { readonly json: TokenizerJson; readonly config: Record<string, unknown> }
}

/** The part of a tokenizer.json read here. */
export interface TokenizerJson {
  readonly model: { readonly vocab: Readonly<Record<string, number>> }
  readonly added_tokens: ReadonlyArray<{ readonly id: number; readonly content: string }>
}

export interface RandomQwen2VL {
  readonly files: ModelFiles
  readonly config: Qwen2VLConfig
  /** The id of a token given as text ("<|image_pad|>"). */
  readonly tokenId: (text: string) => number
}

interface FixtureTokenizer {
  readonly json: unknown
  readonly config: unknown
  readonly vocabSize: number
  readonly tokenId: (text: string) => number
}

const smallTokenizer = (maxPositions: number): FixtureTokenizer => {
  const vocabulary = qwen2VLVocabulary()
  return {
    json: vocabulary.tokenizerJson,
    config: qwen2VLTokenizerConfig(vocabulary, maxPositions),
    vocabSize: vocabulary.vocabSize,
    tokenId: vocabulary.tokenId
  }
}

const givenTokenizer = (given: NonNullable<RandomQwen2VLOptions["tokenizer"]>): FixtureTokenizer => {
  const ids = new Map(Object.entries(given.json.model.vocab))
  for (const token of given.json.added_tokens) ids.set(token.content, token.id)
  return {
    json: given.json,
    config: { ...given.config, chat_template: qwen2VLChatTemplate },
    vocabSize: [...ids.values()].reduce((a, b) => Math.max(a, b), 0) + 1,
    tokenId: (text) => {
      const id = ids.get(text)
      if (id === undefined) throw new Error(`the tokenizer has no token ${JSON.stringify(text)}`)
      return id
    }
  }
}

/**
 * Everything of a random Qwen2-VL's directory but its graphs: config.json, the generation and
 * preprocessor configs and the tokenizer's files, with the geometry they describe.
 */
export const randomQwen2VLMetadata = (options: Omit<RandomQwen2VLOptions, "seed"> = {}): RandomQwen2VL => {
  const maxPositions = options.config?.text.maxPositions ?? 4096
  const tokenizer = options.tokenizer === undefined ? smallTokenizer(maxPositions) : givenTokenizer(options.tokenizer)
  const config = options.config ?? tinyQwen2VLConfig(tokenizer.vocabSize)
  if (config.text.vocabSize < tokenizer.vocabSize) {
    throw new Error(`a vocabulary of ${config.text.vocabSize} is smaller than the tokenizer's ${tokenizer.vocabSize}`)
  }
  const id = tokenizer.tokenId
  const special = qwen2VLSpecialTokens
  const eos = id(special.imEnd)
  const endOfText = id(special.endOfText)
  const qwen25 = options.family === "qwen2_5_vl"
  const family = qwen25
    ? {
        model_type: "qwen2_5_vl",
        architectures: ["Qwen2_5_VLForConditionalGeneration"],
        // Newer Qwen2.5-VL configs hold the language model's fields in text_config, which transformers.js reads.
        text_config: { model_type: "qwen2_5_vl_text", ...qwen2VLTextConfigJson(config.text) }
      }
    : {}
  const preprocessorConfig = {
    min_pixels: options.minPixels ?? 3136,
    max_pixels: options.maxPixels ?? 28 * 28 * 64,
    patch_size: config.vision.patchSize,
    temporal_patch_size: config.vision.temporalPatchSize,
    merge_size: config.vision.spatialMergeSize,
    image_mean: [0.48145466, 0.4578275, 0.40821073],
    image_std: [0.26862954, 0.26130258, 0.27577711],
    // transformers (Python) does these by default; transformers.js only when the file says so.
    do_resize: true,
    resample: 3,
    do_rescale: true,
    rescale_factor: 1 / 255,
    do_normalize: true,
    do_convert_rgb: true,
    image_processor_type: "Qwen2VLImageProcessor",
    processor_class: qwen25 ? "Qwen2_5_VLProcessor" : "Qwen2VLProcessor"
  }
  const files = new Map<string, Uint8Array>([
    [
      "config.json",
      jsonFile(
        qwen2VLConfigJson(
          config,
          {
            imageTokenId: id(special.imagePad),
            videoTokenId: id(special.videoPad),
            visionStartTokenId: id(special.visionStart),
            visionEndTokenId: id(special.visionEnd),
            visionTokenId: id(special.visionPad),
            bosTokenId: endOfText,
            eosTokenId: eos
          },
          { ...family, ...options.extraConfig }
        )
      )
    ],
    [
      "generation_config.json",
      jsonFile({ bos_token_id: endOfText, pad_token_id: endOfText, eos_token_id: [eos, endOfText], do_sample: false })
    ],
    ["preprocessor_config.json", jsonFile(preprocessorConfig)],
    ["tokenizer.json", jsonFile(tokenizer.json)],
    ["tokenizer_config.json", jsonFile(tokenizer.config)]
  ])
  return { files, config, tokenId: id }
}

export const randomQwen2VLFiles = (options: RandomQwen2VLOptions = {}): RandomQwen2VL => {
  const metadata = randomQwen2VLMetadata(options)
  const { vision, text } = randomQwen2VLWeights(metadata.config, options.seed ?? 1)
  const files = new Map(metadata.files)
  const gridInput = options.family === "qwen2_5_vl" ? "image_grid_thw" : "grid_thw"
  for (const [stem, graph] of qwen2VLGraphs(vision, text, gridInput)) files.set(`onnx/${stem}.onnx`, graph.toBytes())
  return { ...metadata, files }
}
