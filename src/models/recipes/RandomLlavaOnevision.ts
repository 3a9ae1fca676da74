import {
  type LlavaOnevisionConfig,
  type LlavaOnevisionTextWeights,
  type LlavaOnevisionTokenIds,
  type LlavaOnevisionVisionWeights,
  llavaOnevisionConfigJson,
  llavaOnevisionGraphs,
  llavaOnevisionImageTokens
} from "../architectures/LlavaOnevision.js"
import { Random } from "../Random.js"
import { randomSiglipTower } from "./RandomGemma3.js"
import {
  qwen2VLSpecialTokens,
  qwen2VLTokenizerConfig,
  qwen2VLVocabulary,
  randomQwen2VLTextWeights
} from "./RandomQwen2VL.js"
import { jsonFile, type ModelFiles } from "./Recipe.js"
import { WeightDraw } from "./RandomWeights.js"

/**
 * Model directories of a random-weight LLaVA-OneVision (SigLIP tower, two-layer GELU projector,
 * Qwen2) in the community's split layout (onnx/vision_encoder.onnx, onnx/embed_tokens.onnx,
 * onnx/decoder_model_merged.onnx, fp32) with the files llava-hf/llava-onevision-qwen2-0.5b-ov-hf
 * ships, in its fields: config.json, generation_config.json, preprocessor_config.json,
 * processor_config.json, and a Qwen2 tokenizer with <image> and <video> added as special tokens
 * and LLaVA-OneVision's chat template.
 */

export const llavaOnevisionSpecialTokens = {
  image: "<image>",
  video: "<video>"
} as const

/**
 * LLaVA-OneVision's chat template (transformers' convert_llava_onevision_weights_to_hf.py): each
 * message's images first, each `<image>` and a newline, then its videos, then its texts.
 */
export const llavaOnevisionChatTemplate =
  "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n'}}{# Render all images first #}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\\n' }}{% endfor %}{# Render all video then #}{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}{{ '<video>\\n' }}{% endfor %}{# Render all text next #}{% if message['role'] != 'assistant' %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] }}{% endfor %}{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{% generation %}{{ content['text'] }}{% endgeneration %}{% endfor %}{% endif %}{{'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

/** The any-resolution grids of llava-onevision: 1 to 6 tiles of `side` pixels down and across. */
export const llavaOnevisionGridPinpoints = (side: number): ReadonlyArray<readonly [number, number]> =>
  Array.from({ length: 36 }, (_, i) => [side * (Math.floor(i / 6) + 1), side * ((i % 6) + 1)] as const)

/**
 * A geometry small enough for tests: 56-pixel images of 14-pixel patches (16 image tokens), two
 * SigLIP layers of width 32, two Qwen2 layers of width 64 with 4 query heads over 2 KV heads. The
 * embeddings are not tied (the 0.5B model ties them): a random model whose logits are its own
 * embeddings repeats the last token, which would make greedy comparisons say little.
 */
export const tinyLlavaOnevisionConfig = (vocabSize: number): LlavaOnevisionConfig => ({
  vision: {
    hiddenSize: 32,
    intermediateSize: 48,
    layers: 2,
    heads: 2,
    imageSize: 56,
    patchSize: 14,
    layerNormEps: 1e-6
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
    tieWordEmbeddings: false
  },
  imageGridPinpoints: llavaOnevisionGridPinpoints(56),
  visionAspectRatio: "anyres_max_9"
})

/** The weights of one seed: the vision tower's and projector's drawn first, then the language model's. */
export const randomLlavaOnevisionWeights = (
  config: LlavaOnevisionConfig,
  seed: number
): { readonly vision: LlavaOnevisionVisionWeights; readonly text: LlavaOnevisionTextWeights } => {
  const random = new Random(seed)
  const tower = randomSiglipTower(config.vision, random)
  const draw = new WeightDraw(random)
  const vision: LlavaOnevisionVisionWeights = {
    config: config.vision,
    ...tower,
    linear1: draw.linear(config.vision.hiddenSize, config.text.hiddenSize, true),
    linear2: draw.linear(config.text.hiddenSize, config.text.hiddenSize, true)
  }
  return { vision, text: randomQwen2VLTextWeights(config.text, random) }
}

/** llava-hf/llava-onevision-qwen2-0.5b-ov-hf's preprocessor_config.json at the tower's size. */
export const llavaOnevisionPreprocessorConfig = (config: LlavaOnevisionConfig) => ({
  do_convert_rgb: true,
  do_normalize: true,
  do_pad: true,
  do_rescale: true,
  do_resize: true,
  image_grid_pinpoints: config.imageGridPinpoints,
  image_mean: [0.5, 0.5, 0.5],
  image_processor_type: "LlavaOnevisionImageProcessor",
  image_std: [0.5, 0.5, 0.5],
  processor_class: "LlavaOnevisionProcessor",
  resample: 3,
  rescale_factor: 0.00392156862745098,
  size: { height: config.vision.imageSize, width: config.vision.imageSize }
})

export interface RandomLlavaOnevisionOptions {
  readonly seed?: number
  /** The geometry; by default `tinyLlavaOnevisionConfig` at the vocabulary's size. */
  readonly config?: LlavaOnevisionConfig
}

export interface RandomLlavaOnevision {
  readonly files: ModelFiles
  readonly config: LlavaOnevisionConfig
  readonly vision: LlavaOnevisionVisionWeights
  readonly text: LlavaOnevisionTextWeights
  /** The id of a token given as text ("<image>"). */
  readonly tokenId: (text: string) => number
}

export const randomLlavaOnevision = (options: RandomLlavaOnevisionOptions = {}): RandomLlavaOnevision => {
  const extraSpecialTokens = Object.values(llavaOnevisionSpecialTokens)
  const vocabulary = qwen2VLVocabulary(extraSpecialTokens)
  const config = options.config ?? tinyLlavaOnevisionConfig(vocabulary.vocabSize)
  if (config.text.vocabSize < vocabulary.vocabSize) {
    throw new Error(`a vocabulary of ${config.text.vocabSize} is smaller than the tokenizer's ${vocabulary.vocabSize}`)
  }
  const id = vocabulary.tokenId
  const endOfText = id(qwen2VLSpecialTokens.endOfText)
  const imEnd = id(qwen2VLSpecialTokens.imEnd)
  const tokens: LlavaOnevisionTokenIds = {
    imageTokenIndex: id(llavaOnevisionSpecialTokens.image),
    videoTokenIndex: id(llavaOnevisionSpecialTokens.video),
    bosTokenId: endOfText,
    eosTokenId: imEnd,
    padTokenId: endOfText
  }
  const { vision, text } = randomLlavaOnevisionWeights(config, options.seed ?? 1)
  const files = new Map<string, Uint8Array>([
    ["config.json", jsonFile(llavaOnevisionConfigJson(config, tokens))],
    [
      "generation_config.json",
      jsonFile({ bos_token_id: endOfText, pad_token_id: endOfText, eos_token_id: [imEnd, endOfText], do_sample: false })
    ],
    ["preprocessor_config.json", jsonFile(llavaOnevisionPreprocessorConfig(config))],
    [
      "processor_config.json",
      jsonFile({
        image_token: llavaOnevisionSpecialTokens.image,
        num_image_tokens: llavaOnevisionImageTokens(config.vision),
        processor_class: "LlavaOnevisionProcessor",
        video_token: llavaOnevisionSpecialTokens.video,
        vision_aspect_ratio: config.visionAspectRatio,
        vision_feature_select_strategy: "full"
      })
    ],
    ["tokenizer.json", jsonFile(vocabulary.tokenizerJson)],
    [
      "tokenizer_config.json",
      jsonFile({
        ...qwen2VLTokenizerConfig(vocabulary, config.text.maxPositions, llavaOnevisionChatTemplate, extraSpecialTokens),
        processor_class: "LlavaOnevisionProcessor"
      })
    ]
  ])
  for (const [stem, graph] of llavaOnevisionGraphs(vision, text)) files.set(`onnx/${stem}.onnx`, graph.toBytes())
  return { files, config, vision, text, tokenId: id }
}
