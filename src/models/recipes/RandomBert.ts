import { type BertConfig, bertConfigJson, bertGraph, type BertWeights } from "../architectures/Bert.js"
import { Random } from "../Random.js"
import type { Pooling } from "../TextEmbedding.js"
import { matrix } from "../Weights.js"
import { randomBlocks, unitLayerNorm } from "./RandomWeights.js"
import { jsonFile, type ModelFiles, type ModelRecipe, recipeStamp } from "./Recipe.js"
import { wordPieceTokenizerConfig, wordPieceTokenizerJson, wordPieceVocabulary } from "./WordPieceVocabulary.js"

/**
 * Model directories of a random-weight BERT sentence-embedding model in the community's layout
 * (Xenova/all-MiniLM-L6-v2, bge-small-en-v1.5): config.json, tokenizer.json (uncased WordPiece
 * with [CLS] … [SEP]), onnx/model.onnx, and the sentence-transformers files that say how to pool
 * (modules.json, 1_Pooling/config.json, a Normalize module, sentence_bert_config.json).
 *
 * Word embeddings are drawn wider than positions and types and every other weight is small, so
 * each token's output is close to its word's embedding, layer-normed: the mean over a text is
 * near a bag of its words, and texts that share words have similar vectors.
 */

export interface RandomBertOptions {
  readonly config: BertConfig
  readonly seed: number
  /** The sentence-transformers files; absent: none, as in exports that ship only the transformer. */
  readonly sentenceTransformers?: {
    readonly pooling: Pooling
    readonly normalize: boolean
  }
  /** Fields added to config.json (`matryoshka_dimensions`, a recipe stamp). */
  readonly extraConfig?: Record<string, unknown>
}

const layerNormEps = 1e-12

export const randomBertWeights = (config: BertConfig, seed: number): BertWeights => {
  const random = new Random(seed)
  const { hiddenSize: hidden } = config
  const table = (rows: number, std: number) => matrix(rows, hidden, random.normals(rows * hidden, std))
  return {
    wordEmbeddings: table(config.vocabSize, 1),
    positionEmbeddings: table(config.maxPositions, 0.1),
    tokenTypeEmbeddings: table(config.typeVocabSize, 0.1),
    embeddingNorm: unitLayerNorm(hidden, config.layerNormEps),
    layers: randomBlocks(
      random,
      { hidden, layers: config.layers, heads: config.heads, intermediate: config.intermediateSize },
      config.layerNormEps
    ).map((block) => ({
      attention: block.attention,
      attentionNorm: block.norm1,
      intermediate: block.mlp.up,
      output: block.mlp.down,
      outputNorm: block.norm2
    }))
  }
}

const poolingFields: Readonly<Record<Pooling, string>> = {
  mean: "pooling_mode_mean_tokens",
  cls: "pooling_mode_cls_token",
  last: "pooling_mode_lasttoken"
}

/** modules.json and the Pooling module's config, as sentence-transformers saves a model. */
export const sentenceTransformersFiles = (
  hiddenSize: number,
  maxSeqLength: number,
  pooling: Pooling,
  normalize: boolean
): ModelFiles => {
  const modules = [
    { idx: 0, name: "0", path: "", type: "sentence_transformers.models.Transformer" },
    { idx: 1, name: "1", path: "1_Pooling", type: "sentence_transformers.models.Pooling" },
    ...(normalize ? [{ idx: 2, name: "2", path: "2_Normalize", type: "sentence_transformers.models.Normalize" }] : [])
  ]
  return new Map([
    ["modules.json", jsonFile(modules)],
    [
      "1_Pooling/config.json",
      jsonFile({
        word_embedding_dimension: hiddenSize,
        pooling_mode_cls_token: false,
        pooling_mode_mean_tokens: false,
        pooling_mode_max_tokens: false,
        pooling_mode_mean_sqrt_len_tokens: false,
        pooling_mode_weightedmean_tokens: false,
        pooling_mode_lasttoken: false,
        [poolingFields[pooling]]: true,
        include_prompt: true
      })
    ],
    ["sentence_bert_config.json", jsonFile({ max_seq_length: maxSeqLength, do_lower_case: false })]
  ])
}

export const randomBertFiles = (options: RandomBertOptions): ModelFiles => {
  const { config } = options
  const vocabulary = wordPieceVocabulary()
  if (vocabulary.length > config.vocabSize) {
    throw new Error(
      `the WordPiece vocabulary has ${vocabulary.length} tokens, more than vocab_size ${config.vocabSize}`
    )
  }
  const files = new Map<string, Uint8Array>([
    ["config.json", jsonFile(bertConfigJson(config, options.extraConfig))],
    ["tokenizer.json", jsonFile(wordPieceTokenizerJson(vocabulary))],
    ["tokenizer_config.json", jsonFile(wordPieceTokenizerConfig(config.maxPositions))],
    ["onnx/model.onnx", bertGraph(randomBertWeights(config, options.seed)).toBytes()]
  ])
  const st = options.sentenceTransformers
  if (st !== undefined) {
    for (const [path, bytes] of sentenceTransformersFiles(
      config.hiddenSize,
      config.maxPositions,
      st.pooling,
      st.normalize
    ))
      files.set(path, bytes)
  }
  return files
}

/** A recipe of a random BERT embedder, mean-pooled and normalized as all-MiniLM-L6-v2 is. */
const bertEmbedderRecipe = (
  name: string,
  version: number,
  config: BertConfig,
  seed: number,
  extraConfig: Record<string, unknown> = {}
): ModelRecipe => ({
  name,
  version,
  build: () =>
    randomBertFiles({
      config,
      seed,
      sentenceTransformers: { pooling: "mean", normalize: true },
      extraConfig: { cornserve: recipeStamp({ name, version }), ...extraConfig }
    })
})

/**
 * cornserve/tiny-text-embedder: a 2-layer BERT (hidden 64) over the small WordPiece vocabulary,
 * 128 tokens at most. Its vectors may be cut to 32 or 16 dimensions (`dimensions`): a cut of
 * these near-random features keeps their similarities roughly, as a random projection does.
 */
export const tinyTextEmbedder = bertEmbedderRecipe(
  "cornserve/tiny-text-embedder",
  1,
  {
    hiddenSize: 64,
    intermediateSize: 128,
    layers: 2,
    heads: 4,
    vocabSize: wordPieceVocabulary().length,
    maxPositions: 128,
    typeVocabSize: 2,
    layerNormEps
  },
  7,
  { matryoshka_dimensions: [64, 32, 16] }
)

/** all-MiniLM-L6-v2's geometry: 6 layers, hidden 384, 12 heads, MLP 1536, vocabulary 30522, 512 positions. */
export const miniLmL6Geometry: BertConfig = {
  hiddenSize: 384,
  intermediateSize: 1536,
  layers: 6,
  heads: 12,
  vocabSize: 30522,
  maxPositions: 512,
  typeVocabSize: 2,
  layerNormEps
}

/** bench/minilm-l6: random weights at all-MiniLM-L6-v2's size (~90 MB), for the embeddings bench. */
export const benchMiniLmL6 = bertEmbedderRecipe("bench/minilm-l6", 1, miniLmL6Geometry, 6)
