import { idefics3ImageSeqLen, idefics3VisionGraph } from "../../../src/models/architectures/Idefics3Vision.js"
import { type ByteLevelBpe, byteLevelBpe } from "../../../src/models/ByteLevelBpe.js"
import { idefics3Tokens } from "../../../src/models/Idefics3Processor.js"
import { Random } from "../../../src/models/Random.js"
import { unitLayerNorm } from "../../../src/models/recipes/RandomWeights.js"
import { jsonFile, type ModelBuild, type ModelFiles, writeModelBuild } from "../../../src/models/recipes/Recipe.js"
import { matrix } from "../../../src/models/Weights.js"

/**
 * A tiny SmolVLM model directory in the layout onnx-community publishes for transformers.js:
 * config.json (idefics3, a llama text_config), preprocessor_config.json and processor_config.json
 * with the fields of SmolVLM-256M-Instruct, a byte-level BPE tokenizer with the Idefics3 special
 * tokens and SmolVLM's chat template, and onnx/vision_encoder.onnx with seeded random weights.
 * The language model files (onnx/embed_tokens.onnx, onnx/decoder_model_merged.onnx) come from the
 * caller through `extraFiles`.
 */

export interface SmolVlmGeometry {
  /** max_image_size.longest_edge and vision_config.image_size: the tile edge. */
  readonly tile: number
  /** size.longest_edge: images are first resized to this longest edge. */
  readonly longestEdge: number
  readonly patchSize: number
  readonly scaleFactor: number
}

/** The geometry of SmolVLM-256M-Instruct (512-pixel tiles of 16-pixel patches, 64 tokens per tile). */
export const smolVlm256mGeometry: SmolVlmGeometry = { tile: 512, longestEdge: 2048, patchSize: 16, scaleFactor: 4 }

/** A small geometry with the same proportions of resize to tile (4 tiles a side at most). */
export const tinyGeometry: SmolVlmGeometry = { tile: 32, longestEdge: 128, patchSize: 4, scaleFactor: 2 }

export interface SmolVlmFixtureOptions {
  readonly geometry?: SmolVlmGeometry
  readonly doImageSplitting?: boolean
  /** PIL resample code; SmolVLM uses 1 (Lanczos). */
  readonly resample?: number
  readonly visionHidden?: number
  readonly textHidden?: number
  readonly seed?: number
  /** Replaces or adds fields of preprocessor_config.json. */
  readonly preprocessorOverrides?: Readonly<Record<string, unknown>>
  /** More files (the language model's ONNX files), by path in the directory. */
  readonly extraFiles?: ModelFiles
}

export const smolVlmSpecialTokens = [
  "<|endoftext|>",
  "<|im_start|>",
  "<|im_end|>",
  idefics3Tokens.fakeTokenAroundImage,
  idefics3Tokens.image,
  idefics3Tokens.globalImage,
  ...Array.from({ length: 36 }, (_, i) => idefics3Tokens.tilePosition(Math.floor(i / 6) + 1, (i % 6) + 1)),
  "<end_of_utterance>"
]

/** SmolVLM-256M-Instruct's chat template (its tokenizer_config.json). */
export const smolVlmChatTemplate =
  "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"

export const smolVlmVocabulary = (): ByteLevelBpe =>
  byteLevelBpe({
    words: ["User", "Assistant", " What", " is", " in", " this", " image", " Compare", " these", " two", " images"],
    specialTokens: smolVlmSpecialTokens
  })

const tokenizerConfig = (vocabulary: ByteLevelBpe) => ({
  tokenizer_class: "GPT2Tokenizer",
  add_prefix_space: false,
  bos_token: "<|im_start|>",
  eos_token: "<end_of_utterance>",
  pad_token: "<|im_end|>",
  unk_token: "<|endoftext|>",
  additional_special_tokens: [idefics3Tokens.fakeTokenAroundImage, idefics3Tokens.image, "<end_of_utterance>"],
  clean_up_tokenization_spaces: false,
  model_max_length: 8192,
  chat_template: smolVlmChatTemplate,
  added_tokens_decoder: Object.fromEntries(
    smolVlmSpecialTokens.map((content) => [
      String(vocabulary.tokenId(content)),
      { content, lstrip: false, normalized: false, rstrip: false, single_word: false, special: true }
    ])
  )
})

export interface SmolVlmFixture {
  readonly files: ModelFiles
  readonly vocabulary: ByteLevelBpe
  readonly imageSeqLen: number
  readonly textHidden: number
}

export const smolVlmFixture = (options: SmolVlmFixtureOptions = {}): SmolVlmFixture => {
  const { tile, longestEdge, patchSize, scaleFactor } = options.geometry ?? tinyGeometry
  const visionHidden = options.visionHidden ?? 8
  const textHidden = options.textHidden ?? 16
  const random = new Random(options.seed ?? 3)
  const vocabulary = smolVlmVocabulary()
  const imageSeqLen = idefics3ImageSeqLen(tile, patchSize, scaleFactor)
  const patches = (tile / patchSize) ** 2

  const vision = idefics3VisionGraph({
    imageSize: tile,
    patch: {
      channels: 3,
      hidden: visionHidden,
      patchSize,
      kernel: random.normals(visionHidden * 3 * patchSize * patchSize, 0.3),
      bias: random.normals(visionHidden, 0.3)
    },
    positions: matrix(patches, visionHidden, random.normals(patches * visionHidden, 0.3)),
    postLayerNorm: unitLayerNorm(visionHidden, 1e-6),
    scaleFactor,
    projection: matrix(
      visionHidden * scaleFactor ** 2,
      textHidden,
      random.normals(visionHidden * scaleFactor ** 2 * textHidden, 0.3)
    )
  })

  const config = {
    architectures: ["Idefics3ForConditionalGeneration"],
    model_type: "idefics3",
    image_token_id: vocabulary.tokenId(idefics3Tokens.image),
    scale_factor: scaleFactor,
    eos_token_id: vocabulary.tokenId("<end_of_utterance>"),
    pad_token_id: vocabulary.tokenId("<|im_end|>"),
    tie_word_embeddings: false,
    vocab_size: vocabulary.vocabSize,
    text_config: {
      model_type: "llama",
      architectures: ["VLlama3ForCausalLM"],
      vocab_size: vocabulary.vocabSize,
      hidden_size: textHidden,
      intermediate_size: textHidden * 2,
      num_hidden_layers: 1,
      num_attention_heads: 2,
      num_key_value_heads: 1,
      head_dim: textHidden / 2,
      hidden_act: "silu",
      max_position_embeddings: 8192,
      rms_norm_eps: 1e-5,
      rope_theta: 100000,
      tie_word_embeddings: false,
      bos_token_id: vocabulary.tokenId("<|im_start|>"),
      eos_token_id: vocabulary.tokenId("<end_of_utterance>"),
      pad_token_id: vocabulary.tokenId("<|im_end|>")
    },
    vision_config: {
      model_type: "idefics3_vision",
      hidden_size: visionHidden,
      image_size: tile,
      patch_size: patchSize,
      num_channels: 3,
      num_hidden_layers: 0,
      num_attention_heads: 1,
      intermediate_size: visionHidden * 4,
      layer_norm_eps: 1e-6
    }
  }
  const preprocessorConfig = {
    do_convert_rgb: true,
    do_image_splitting: options.doImageSplitting ?? true,
    do_normalize: true,
    do_pad: true,
    do_rescale: true,
    do_resize: true,
    image_mean: [0.5, 0.5, 0.5],
    image_processor_type: "Idefics3ImageProcessor",
    image_std: [0.5, 0.5, 0.5],
    max_image_size: { longest_edge: tile },
    processor_class: "Idefics3Processor",
    resample: options.resample ?? 1,
    rescale_factor: 0.00392156862745098,
    size: { longest_edge: longestEdge },
    ...options.preprocessorOverrides
  }

  const files = new Map<string, Uint8Array>([
    ["config.json", jsonFile(config)],
    [
      "generation_config.json",
      jsonFile({ bos_token_id: config.text_config.bos_token_id, eos_token_id: config.eos_token_id })
    ],
    ["preprocessor_config.json", jsonFile(preprocessorConfig)],
    ["processor_config.json", jsonFile({ image_seq_len: imageSeqLen, processor_class: "Idefics3Processor" })],
    ["tokenizer.json", jsonFile(vocabulary.tokenizerJson)],
    ["tokenizer_config.json", jsonFile(tokenizerConfig(vocabulary))],
    ["onnx/vision_encoder.onnx", vision.toBytes()]
  ])
  for (const [path, bytes] of options.extraFiles ?? []) files.set(path, bytes)
  return { files, vocabulary, imageSeqLen, textHidden }
}

export const writeModelFiles = (dir: string, files: ModelBuild): Promise<void> => writeModelBuild(dir, files)
