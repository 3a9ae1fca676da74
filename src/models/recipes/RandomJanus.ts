import { type JanusConfig, janusGraphs, janusImageSize } from "../architectures/Janus.js"
import { llamaConfigJson } from "../architectures/Llama.js"
import { type ByteLevelBpe, byteLevelBpe } from "../ByteLevelBpe.js"
import { jsonFile, type ModelFiles, type ModelRecipe, recipeStamp } from "./Recipe.js"

/**
 * A random-weight Janus-Pro in the layout of onnx-community/Janus-Pro-1B-ONNX: config.json
 * (multi_modality, with a llama language_config), generation_config.json with the guidance scale
 * and pad token transformers.js's image generation reads, preprocessor_config.json
 * (VLMImageProcessor) and processor_config.json (VLChatProcessor and its image tags), a byte-level
 * BPE tokenizer with DeepSeek's special tokens and two named chat templates ("default" for
 * conversations, "text_to_image" for image prompts), and the six graphs of Janus.ts under onnx/.
 */

export const janusTokens = {
  beginOfSentence: "<｜begin▁of▁sentence｜>",
  endOfSentence: "<｜end▁of▁sentence｜>",
  pad: "<｜▁pad▁｜>",
  imagePlaceholder: "<image_placeholder>",
  beginOfImage: "<begin_of_image>",
  endOfImage: "<end_of_image>",
  user: "<|User|>",
  assistant: "<|Assistant|>"
} as const

const promptWords = [
  "A",
  " a",
  " an",
  " the",
  " of",
  " in",
  " on",
  " and",
  " with",
  " red",
  " blue",
  " green",
  " fox",
  " cat",
  " house",
  " tree",
  " sky",
  " picture",
  " image",
  "What",
  " is",
  " this",
  "Describe"
]

/**
 * The fixture's vocabulary; `vocabSize` pads it with unused tokens before the special ones, which
 * a codebook as large as Janus-Pro's (16384) must stay below.
 */
export const janusVocabulary = (vocabSize?: number): ByteLevelBpe =>
  byteLevelBpe({
    words: promptWords,
    specialTokens: Object.values(janusTokens),
    ...(vocabSize === undefined ? {} : { vocabSize })
  })

/**
 * Janus's "deepseek" conversation format: "ROLE: content" turns separated by a blank line, an
 * assistant turn closed by the end of sentence, the prompt ending "<|Assistant|>:". The tokenizer
 * adds no beginning of sentence (VLChatProcessor encodes without special tokens), so the template
 * writes it, as Janus's own encode does.
 */
const defaultTemplate = [
  "{{ bos_token }}",
  "{% for message in messages %}",
  "{% if message['role'] == 'system' %}{{ message['content'] }}{{ '\\n\\n' }}",
  "{% else %}{{ message['role'] }}: {{ message['content'] | trim }}",
  // The blank line as an expression: chat templates render with trim_blocks, which eats a newline after a tag.
  `{% if message['role'] == '${janusTokens.assistant}' %}{{ eos_token }}{% else %}{{ '\\n\\n' }}{% endif %}`,
  "{% endif %}",
  "{% endfor %}",
  `{% if add_generation_prompt %}${janusTokens.assistant}:{% endif %}`
].join("")

/** Janus's image generation prompt: the conversation without a system prompt, then the assistant opening an image. */
const textToImageTemplate = [
  "{{ bos_token }}",
  "{% for message in messages %}{{ message['role'] }}: {{ message['content'] | trim }}{{ '\\n\\n' }}{% endfor %}",
  `${janusTokens.assistant}:${janusTokens.beginOfImage}`
].join("")

export interface RandomJanusOptions {
  readonly seed?: number
  /** Replaces parts of the default geometry (a 2-layer, 64-wide model, 16 image tokens of a 256-entry codebook, 64-pixel images). */
  readonly geometry?: Partial<Omit<JanusConfig, "language">> & { readonly language?: Partial<JanusConfig["language"]> }
  /** generation_config.json's guidance_scale (Janus's cfg_weight is 5). */
  readonly guidanceScale?: number
  /** Fields added to config.json. */
  readonly extraConfig?: Record<string, unknown>
  /** The vocabulary's size, padded with unused tokens (see janusVocabulary); by default just what the fixture uses. */
  readonly vocabSize?: number
}

export interface RandomJanus {
  readonly files: ModelFiles
  readonly config: JanusConfig
  readonly tokenId: (text: string) => number
}

export const randomJanusFiles = (options: RandomJanusOptions = {}): RandomJanus => {
  const vocabulary = janusVocabulary(options.vocabSize)
  const id = vocabulary.tokenId
  const config: JanusConfig = {
    visionHidden: 32,
    codebookSize: 256,
    codebookDim: 8,
    imageTokens: 16,
    upsamplings: 4,
    decoderChannels: 16,
    ...options.geometry,
    language: {
      hiddenSize: 64,
      intermediateSize: 128,
      layers: 2,
      heads: 4,
      kvHeads: 4,
      headDim: 16,
      vocabSize: vocabulary.vocabSize,
      maxPositions: 1024,
      ropeTheta: 10000,
      rmsNormEps: 1e-6,
      ...options.geometry?.language
    }
  }
  const endOfSentence = id(janusTokens.endOfSentence)
  // The generation loop stops on the end of sentence whatever head chose it: no image token may share its id.
  if (config.codebookSize > endOfSentence) {
    throw new Error(`a codebook of ${config.codebookSize} reaches the end of sentence token ${endOfSentence}`)
  }
  const specialIds = {
    bos_token_id: id(janusTokens.beginOfSentence),
    eos_token_id: endOfSentence,
    pad_token_id: id(janusTokens.pad)
  }
  const mlpProjector = (modelType: string, inputDim: number) => ({
    cls: "MlpProjector",
    model_type: modelType,
    params: { depth: 2, input_dim: inputDim, n_embed: config.language.hiddenSize, projector_type: "mlp_gelu" }
  })

  const files = new Map<string, Uint8Array>([
    [
      "config.json",
      jsonFile({
        architectures: ["MultiModalityCausalLM"],
        model_type: "multi_modality",
        aligner_config: mlpProjector("aligner", config.visionHidden),
        gen_aligner_config: mlpProjector("gen_aligner", config.codebookDim),
        gen_head_config: {
          cls: "vision_head",
          model_type: "gen_head",
          params: {
            image_token_embed: config.language.hiddenSize,
            image_token_size: config.codebookSize,
            n_embed: config.language.hiddenSize
          }
        },
        gen_vision_config: {
          cls: "VQ-16",
          model_type: "gen_vision",
          params: { image_token_size: config.codebookSize, n_embed: config.codebookDim }
        },
        language_config: llamaConfigJson(config.language),
        vision_config: {
          cls: "CLIPVisionTower",
          model_type: "vision",
          params: {
            image_size: janusImageSize,
            model_name: "siglip_large_patch16_384",
            select_feature: "same",
            select_layer: -1
          }
        },
        torch_dtype: "float32",
        ...options.extraConfig
      })
    ],
    ["generation_config.json", jsonFile({ ...specialIds, guidance_scale: options.guidanceScale ?? 5 })],
    [
      "preprocessor_config.json",
      jsonFile({
        background_color: [127, 127, 127],
        do_normalize: true,
        image_mean: [0.5, 0.5, 0.5],
        image_processor_type: "VLMImageProcessor",
        image_size: janusImageSize,
        image_std: [0.5, 0.5, 0.5],
        min_size: 14,
        processor_class: "VLChatProcessor",
        rescale_factor: 1 / 255
      })
    ],
    [
      "processor_config.json",
      jsonFile({
        add_special_token: false,
        ignore_id: -100,
        image_end_tag: janusTokens.endOfImage,
        image_start_tag: janusTokens.beginOfImage,
        image_tag: janusTokens.imagePlaceholder,
        mask_prompt: true,
        num_image_tokens: config.imageTokens,
        pad_tag: janusTokens.pad,
        processor_class: "VLChatProcessor",
        sft_format: "deepseek"
      })
    ],
    ["tokenizer.json", jsonFile(vocabulary.tokenizerJson)],
    [
      "tokenizer_config.json",
      jsonFile({
        tokenizer_class: "LlamaTokenizerFast",
        add_bos_token: false,
        add_eos_token: false,
        bos_token: janusTokens.beginOfSentence,
        eos_token: janusTokens.endOfSentence,
        pad_token: janusTokens.pad,
        unk_token: null,
        additional_special_tokens: [
          janusTokens.imagePlaceholder,
          janusTokens.beginOfImage,
          janusTokens.endOfImage,
          janusTokens.user,
          janusTokens.assistant
        ],
        clean_up_tokenization_spaces: false,
        model_max_length: config.language.maxPositions,
        // Named templates: VLChatProcessor asks for "default", image prompts for "text_to_image".
        chat_template: [
          { name: "default", template: defaultTemplate },
          { name: "text_to_image", template: textToImageTemplate }
        ],
        added_tokens_decoder: Object.fromEntries(
          Object.values(janusTokens).map((content) => [
            String(id(content)),
            { content, lstrip: false, normalized: false, rstrip: false, single_word: false, special: true }
          ])
        )
      })
    ]
  ])
  for (const [stem, graph] of janusGraphs(config, options.seed ?? 1)) files.set(`onnx/${stem}.onnx`, graph.toBytes())
  return { files, config, tokenId: id }
}

/**
 * cornserve/tiny-janus: the random Janus-Pro above (2 layers at 64 wide; 16 image tokens of a
 * 256-entry codebook decoded to 64 × 64 pixels), the built-in text-to-image model. Its images
 * depend on the prompt but show nothing; for real pictures, name onnx-community/Janus-Pro-1B-ONNX.
 */
export const tinyJanus: ModelRecipe = {
  name: "cornserve/tiny-janus",
  version: 1,
  build: () =>
    randomJanusFiles({
      seed: 5,
      extraConfig: { cornserve: recipeStamp({ name: "cornserve/tiny-janus", version: 1 }) }
    }).files
}
