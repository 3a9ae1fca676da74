import {
  type Qwen3DecoderLayerWeights,
  type Qwen3VLConfig,
  type Qwen3VLTextConfig,
  type Qwen3VLTextWeights,
  type Qwen3VLVisionConfig,
  type Qwen3VLVisionWeights,
  qwen3VLConfigJson,
  qwen3VLGraphs
} from "../architectures/Qwen3VL.js"
import { Random } from "../Random.js"
import { matrix } from "../Weights.js"
import { jsonFile, type ModelFiles } from "./Recipe.js"
import { WeightDraw } from "./RandomWeights.js"
import { qwen2VLSpecialTokens, qwen2VLTokenizerConfig, qwen2VLVocabulary } from "./RandomQwen2VL.js"

/**
 * Model directories of a random-weight Qwen3-VL in the community's split layout
 * (onnx/vision_encoder.onnx, onnx/embed_tokens.onnx, onnx/decoder_model_merged.onnx, fp32) with
 * the config, preprocessor config, generation config, tokenizer and chat template that
 * transformers.js's Qwen3VLForConditionalGeneration and Qwen3VLProcessor read. The tokenizer is
 * Qwen2-VL's small one: Qwen3-VL keeps Qwen2's special tokens.
 */

/**
 * Qwen3-VL-Instruct's chat template without its tool calls: no default system message, a system
 * message's text first, image parts as <|vision_start|><|image_pad|><|vision_end|>, video parts as
 * <|vision_start|><|video_pad|><|vision_end|>.
 */
export const qwen3VLChatTemplate =
  "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['content'] is string %}{{- messages[0]['content'] }}{%- else %}{%- for content in messages[0]['content'] %}{%- if 'text' in content %}{{- content['text'] }}{%- endif %}{%- endfor %}{%- endif %}{{- '<|im_end|>\\n' }}{%- endif %}{%- set image_count = namespace(value=0) %}{%- set video_count = namespace(value=0) %}{%- for message in messages %}{%- if message['role'] == 'user' or message['role'] == 'assistant' %}{{- '<|im_start|>' + message['role'] + '\\n' }}{%- if message['content'] is string %}{{- message['content'] }}{%- else %}{%- for content in message['content'] %}{%- if content['type'] == 'image' or 'image' in content or 'image_url' in content %}{%- set image_count.value = image_count.value + 1 %}{%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}<|vision_start|><|image_pad|><|vision_end|>{%- elif content['type'] == 'video' or 'video' in content %}{%- set video_count.value = video_count.value + 1 %}{%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}<|vision_start|><|video_pad|><|vision_end|>{%- elif 'text' in content %}{{- content['text'] }}{%- endif %}{%- endfor %}{%- endif %}{{- '<|im_end|>\\n' }}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"

/**
 * A geometry small enough for tests: two vision blocks of width 32 over a 6 × 6 grid of learned
 * positions (so that images of most grids interpolate between them), two decoder layers of width
 * 64 with a head_dim (24) of their own, whose 12 rotary frequencies interleave t, h and w as
 * Qwen3-VL's 64 do ([24, 20, 20]: the last frequencies all t). The embeddings are not tied
 * (Qwen3-VL-2B ties them): a random model whose logits are its own embeddings repeats the last
 * token, which would make greedy comparisons say little.
 */
export const tinyQwen3VLConfig = (vocabSize: number): Qwen3VLConfig => ({
  vision: {
    depth: 2,
    hiddenSize: 32,
    heads: 2,
    intermediateSize: 64,
    inChannels: 3,
    patchSize: 16,
    temporalPatchSize: 2,
    spatialMergeSize: 2,
    outHiddenSize: 64,
    numPositionEmbeddings: 36
  },
  text: {
    hiddenSize: 64,
    intermediateSize: 128,
    layers: 2,
    heads: 4,
    kvHeads: 2,
    headDim: 24,
    vocabSize,
    maxPositions: 4096,
    ropeTheta: 5000000,
    rmsNormEps: 1e-6,
    mropeSection: [6, 3, 3],
    tieWordEmbeddings: false
  }
})

const randomVisionWeights = (config: Qwen3VLVisionConfig, random: Random): Qwen3VLVisionWeights => {
  const draw = new WeightDraw(random)
  const { hiddenSize: hidden } = config
  const patchWidth = config.inChannels * config.temporalPatchSize * config.patchSize ** 2
  const mergedWidth = hidden * config.spatialMergeSize ** 2
  return {
    config,
    patchEmbed: draw.linear(patchWidth, hidden, true),
    posEmbed: matrix(config.numPositionEmbeddings, hidden, random.normals(config.numPositionEmbeddings * hidden, 1)),
    blocks: Array.from({ length: config.depth }, () => ({
      norm1: draw.layerNorm(hidden),
      qkv: draw.linear(hidden, 3 * hidden, true),
      proj: draw.linear(hidden, hidden, true),
      norm2: draw.layerNorm(hidden),
      fc1: draw.linear(hidden, config.intermediateSize, true),
      fc2: draw.linear(config.intermediateSize, hidden, true)
    })),
    merger: {
      norm: draw.layerNorm(hidden),
      fc1: draw.linear(mergedWidth, mergedWidth, true),
      fc2: draw.linear(mergedWidth, config.outHiddenSize, true)
    }
  }
}

const randomTextWeights = (config: Qwen3VLTextConfig, random: Random): Qwen3VLTextWeights => {
  const draw = new WeightDraw(random)
  const { hiddenSize: hidden, vocabSize, intermediateSize, headDim } = config
  const embedTokens = matrix(vocabSize, hidden, random.normals(vocabSize * hidden, 1))
  const layers = Array.from(
    { length: config.layers },
    (): Qwen3DecoderLayerWeights => ({
      inputNorm: draw.scales(hidden),
      ...draw.attention(hidden, config.heads, config.kvHeads, headDim, false),
      qNorm: draw.scales(headDim),
      kNorm: draw.scales(headDim),
      postNorm: draw.scales(hidden),
      ...draw.gatedMlp(hidden, intermediateSize)
    })
  )
  const norm = draw.scales(hidden)
  return { config, embedTokens, layers, norm, lmHead: draw.lmHead(embedTokens, config.tieWordEmbeddings) }
}

/** The weights of one seed: the vision tower's drawn first, then the language model's. */
export const randomQwen3VLWeights = (
  config: Qwen3VLConfig,
  seed: number
): { readonly vision: Qwen3VLVisionWeights; readonly text: Qwen3VLTextWeights } => {
  if (config.vision.outHiddenSize !== config.text.hiddenSize)
    throw new Error(
      `the merger gives ${config.vision.outHiddenSize} columns; the decoder takes ${config.text.hiddenSize}`
    )
  const random = new Random(seed)
  const vision = randomVisionWeights(config.vision, random)
  return { vision, text: randomTextWeights(config.text, random) }
}

export interface RandomQwen3VLOptions {
  readonly seed?: number
  /** The geometry; by default `tinyQwen3VLConfig`. */
  readonly config?: Qwen3VLConfig
  /** The area bounds an image is resized within; small by default so that images stay a few patches. */
  readonly minPixels?: number
  readonly maxPixels?: number
}

export interface RandomQwen3VL {
  readonly files: ModelFiles
  readonly config: Qwen3VLConfig
  /** The id of a token given as text ("<|image_pad|>"). */
  readonly tokenId: (text: string) => number
}

/**
 * preprocessor_config.json with every field Qwen2VLImageProcessor reads spelled out: Qwen3-VL's own
 * (Qwen2VLImageProcessorFast, the area in size, mean and std 0.5, patch 16) leaves out the steps
 * transformers (Python) takes by default and transformers.js takes only when told (without them it
 * neither resizes nor normalizes, and resamples bilinearly).
 */
export const qwen3VLPreprocessorConfig = (minPixels: number, maxPixels: number, patchSize = 16) => ({
  image_processor_type: "Qwen2VLImageProcessorFast",
  processor_class: "Qwen3VLProcessor",
  size: { shortest_edge: minPixels, longest_edge: maxPixels },
  min_pixels: minPixels,
  max_pixels: maxPixels,
  patch_size: patchSize,
  temporal_patch_size: 2,
  merge_size: 2,
  image_mean: [0.5, 0.5, 0.5],
  image_std: [0.5, 0.5, 0.5],
  do_resize: true,
  resample: 3,
  do_rescale: true,
  rescale_factor: 1 / 255,
  do_normalize: true,
  do_convert_rgb: true
})

export const randomQwen3VLFiles = (options: RandomQwen3VLOptions = {}): RandomQwen3VL => {
  const vocabulary = qwen2VLVocabulary()
  const config = options.config ?? tinyQwen3VLConfig(vocabulary.vocabSize)
  const id = vocabulary.tokenId
  const special = qwen2VLSpecialTokens
  const eos = id(special.imEnd)
  const endOfText = id(special.endOfText)
  const { vision, text } = randomQwen3VLWeights(config, options.seed ?? 1)
  const factor = config.vision.patchSize * config.vision.spatialMergeSize
  const files = new Map<string, Uint8Array>([
    [
      "config.json",
      jsonFile(
        qwen3VLConfigJson(config, {
          imageTokenId: id(special.imagePad),
          videoTokenId: id(special.videoPad),
          visionStartTokenId: id(special.visionStart),
          visionEndTokenId: id(special.visionEnd),
          bosTokenId: endOfText,
          eosTokenId: eos
        })
      )
    ],
    [
      "generation_config.json",
      jsonFile({ bos_token_id: endOfText, pad_token_id: endOfText, eos_token_id: [eos, endOfText], do_sample: false })
    ],
    [
      "preprocessor_config.json",
      jsonFile(
        qwen3VLPreprocessorConfig(
          options.minPixels ?? factor * factor * 4,
          options.maxPixels ?? factor * factor * 24,
          config.vision.patchSize
        )
      )
    ],
    ["tokenizer.json", jsonFile(vocabulary.tokenizerJson)],
    [
      "tokenizer_config.json",
      jsonFile(qwen2VLTokenizerConfig(vocabulary, config.text.maxPositions, qwen3VLChatTemplate))
    ]
  ])
  for (const [stem, graph] of qwen3VLGraphs(vision, text)) files.set(`onnx/${stem}.onnx`, graph.toBytes())
  return { files, config, tokenId: id }
}
