import { selfAttention } from "../onnx/Attention.js"
import { elementType, Graph, type Value } from "../onnx/Graph.js"
import { gelu, layerNorm, linear, matrixWeight } from "../onnx/Layers.js"
import type { AttentionWeights, LayerNormWeights, LinearWeights, Matrix } from "../Weights.js"

/**
 * A BERT encoder (post-norm blocks, learned absolute positions, token types: BERT, MiniLM, BGE,
 * E5) as onnx/model.onnx with the names of the community's sentence-embedding exports:
 * input_ids, attention_mask, token_type_ids [batch, sequence] (int64) → last_hidden_state
 * [batch, sequence, hidden], what transformers.js's BertModel runs for `feature-extraction`.
 */

/** One block: x = norm(x + attention(x)), then x = norm(x + down(GELU(up(x)))). */
export interface BertLayerWeights {
  readonly attention: AttentionWeights
  readonly attentionNorm: LayerNormWeights
  readonly intermediate: LinearWeights
  readonly output: LinearWeights
  readonly outputNorm: LayerNormWeights
}

export interface BertWeights {
  /** [vocab, hidden]. */
  readonly wordEmbeddings: Matrix
  /** [maxPositions, hidden]. */
  readonly positionEmbeddings: Matrix
  /** [typeVocab, hidden]. */
  readonly tokenTypeEmbeddings: Matrix
  readonly embeddingNorm: LayerNormWeights
  readonly layers: ReadonlyArray<BertLayerWeights>
}

export interface BertConfig {
  readonly hiddenSize: number
  readonly intermediateSize: number
  readonly layers: number
  readonly heads: number
  readonly vocabSize: number
  readonly maxPositions: number
  readonly typeVocabSize: number
  readonly layerNormEps: number
}

/** config.json in transformers' BertConfig fields. */
export const bertConfigJson = (config: BertConfig, extra: Record<string, unknown> = {}) => ({
  architectures: ["BertModel"],
  model_type: "bert",
  hidden_size: config.hiddenSize,
  intermediate_size: config.intermediateSize,
  num_hidden_layers: config.layers,
  num_attention_heads: config.heads,
  vocab_size: config.vocabSize,
  max_position_embeddings: config.maxPositions,
  type_vocab_size: config.typeVocabSize,
  layer_norm_eps: config.layerNormEps,
  hidden_act: "gelu",
  position_embedding_type: "absolute",
  pad_token_id: 0,
  torch_dtype: "float32",
  ...extra
})

export const bertGraph = (w: BertWeights): Graph => {
  const g = new Graph("model")
  const hidden = w.wordEmbeddings.cols
  const inputIds = g.input("input_ids", "int64", ["batch_size", "sequence_length"])
  const attentionMask = g.input("attention_mask", "int64", ["batch_size", "sequence_length"])
  const tokenTypeIds = g.input("token_type_ids", "int64", ["batch_size", "sequence_length"])
  const embedded = g.scope("embeddings", () => {
    const length = g.op("Gather", [g.op("Shape", [inputIds]), g.int64Scalar(1)], { axis: 0 })
    const positions = g.op("Range", [g.int64Scalar(0), length, g.int64Scalar(1)])
    const words = g.op("Gather", [matrixWeight(g, "word_embeddings", w.wordEmbeddings), inputIds], { axis: 0 })
    const types = g.op("Gather", [matrixWeight(g, "token_type_embeddings", w.tokenTypeEmbeddings), tokenTypeIds], {
      axis: 0
    })
    const places = g.op("Gather", [matrixWeight(g, "position_embeddings", w.positionEmbeddings), positions], {
      axis: 0
    })
    return layerNorm(g, g.op("Add", [g.op("Add", [words, types]), places]), w.embeddingNorm, "LayerNorm")
  })
  // Keys a query may attend to: every real token of its own sequence, [batch, 1, 1, keys].
  const mask = g.op("Unsqueeze", [g.op("Cast", [attentionMask], { to: elementType("bool") }), g.int64s([1, 2])])
  let x: Value = embedded
  w.layers.forEach((layer, i) => {
    x = g.scope(`encoder.layer.${i}`, () => {
      const attention = selfAttention(g, x, layer.attention, { mask }, "attention").output
      const attended = layerNorm(g, g.op("Add", [x, attention]), layer.attentionNorm, "attention.output.LayerNorm")
      const up = gelu(g, linear(g, attended, layer.intermediate, "intermediate.dense"))
      const down = linear(g, up, layer.output, "output.dense")
      return layerNorm(g, g.op("Add", [attended, down]), layer.outputNorm, "output.LayerNorm")
    })
  })
  g.output(x, "last_hidden_state", "float32", ["batch_size", "sequence_length", hidden])
  return g
}
