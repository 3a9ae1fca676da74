import { causalMask, groupedCacheAttention, type KvCache } from "../onnx/Attention.js"
import { type Dim, Graph, type Value } from "../onnx/Graph.js"
import { type LinearWriter, linear, matrixWeight } from "../onnx/Layers.js"
import type { LinearWeights, Matrix } from "../Weights.js"
import { pastName, presentName, rmsNorm, rotary } from "./Llama.js"

/**
 * The Qwen2 language model of the split-layout VLMs (Qwen2-VL's, LLaVA-OneVision's) and Qwen3-VL's
 * Qwen3, one decoder graph whatever positions it rotates by.
 */

/** A Qwen2 (or Qwen3) language model's geometry; `headDim` when it is not hidden ÷ heads (Qwen3). */
export interface Qwen2TextConfig {
  readonly hiddenSize: number
  readonly intermediateSize: number
  readonly layers: number
  readonly heads: number
  readonly kvHeads: number
  readonly headDim?: number
  readonly vocabSize: number
  readonly maxPositions: number
  readonly ropeTheta: number
  readonly rmsNormEps: number
  readonly tieWordEmbeddings: boolean
}

export interface Qwen2DecoderLayerWeights {
  readonly inputNorm: Float32Array
  readonly q: LinearWeights
  readonly k: LinearWeights
  readonly v: LinearWeights
  readonly o: LinearWeights
  readonly postNorm: Float32Array
  readonly gate: LinearWeights
  readonly up: LinearWeights
  readonly down: LinearWeights
}

/**
 * A Qwen2 language model's weights, whatever positions it rotates by; a Qwen3's too: its layers
 * norm each head's query and key (qNorm, kNorm) and its config gives its own head_dim.
 */
export interface Qwen2TextWeights {
  readonly config: Qwen2TextConfig
  readonly embedTokens: Matrix
  readonly layers: ReadonlyArray<
    Qwen2DecoderLayerWeights & { readonly qNorm?: Float32Array | undefined; readonly kNorm?: Float32Array | undefined }
  >
  readonly norm: Float32Array
  readonly lmHead: Matrix
}

/**
 * What the decoder graph reads of a model's weights: its layers may come one at a time (a model of
 * gigabytes drawn layer by layer, each released once its graph holds it in its own precision).
 */
export type Qwen2DecoderWeights = Omit<Qwen2TextWeights, "layers"> & {
  readonly layers: Iterable<Qwen2TextWeights["layers"][number]>
}

/**
 * A Qwen2 decoder in the split layout (decoder_model_merged: inputs_embeds, attention_mask,
 * position_ids, past_key_values.N.key/value → logits, present.N.key/value): q/k/v with biases,
 * grouped queries over the cache, SwiGLU; or a Qwen3's, whose queries and keys are normed per
 * head before they rotate. `positions` says position_ids' shape and how they become
 * the rotary tables: M-RoPE's [3, batch, sequence] (Qwen2-VL) or plain [batch, sequence]
 * (LLaVA-OneVision's Qwen2). `quantized` writes every linear layer, the lm_head's included, in
 * its own precision (a 4-bit export's MatMulNBits); by default they are fp32 MatMuls.
 */
export const qwen2DecoderGraph = (
  w: Qwen2DecoderWeights,
  positions: {
    readonly dims: ReadonlyArray<Dim>
    readonly rotary: (g: Graph, positionIds: Value, headDim: number) => { readonly cos: Value; readonly sin: Value }
  },
  quantized?: LinearWriter
): Graph => {
  const linearOf = quantized ?? linear
  const { config } = w
  const { hiddenSize: hidden, heads, kvHeads, layers } = config
  const headDim = config.headDim ?? hidden / heads
  const g = new Graph("decoder_model_merged")
  const inputsEmbeds = g.input("inputs_embeds", "float32", ["batch_size", "sequence_length", hidden])
  const attentionMask = g.input("attention_mask", "int64", ["batch_size", "total_sequence_length"])
  const positionIds = g.input("position_ids", "int64", positions.dims)
  // Head count and head size are numbers: transformers.js sizes the first step's empty cache from them.
  const cacheShape = (length: string): ReadonlyArray<Dim> => ["batch_size", kvHeads, length, headDim]
  const pasts = Array.from({ length: layers }, (_, i) => ({
    key: g.input(pastName("past_key_values", i, "key"), "float32", cacheShape("past_sequence_length")),
    value: g.input(pastName("past_key_values", i, "value"), "float32", cacheShape("past_sequence_length"))
  }))
  // [batch, 1 (kv head), 1 (group), sequence, total]
  const mask = g.op("Unsqueeze", [causalMask(g, inputsEmbeds, pasts[0]!.key, attentionMask), g.int64s([1])])
  const { cos, sin } = positions.rotary(g, positionIds, headDim)
  const norm = (x: Value, name: string, weight: Float32Array) =>
    rmsNorm(g, x, g.weight(name, "float32", [weight.length], weight), config.rmsNormEps)
  /** Heads [batch, count, sequence, headDim], normed per head (Qwen3) and rotated. */
  const heads_ = (value: Value, count: number, name: string, weight: Float32Array | undefined) => {
    const split = g.op("Transpose", [g.op("Reshape", [value, g.int64s([0, 0, count, headDim])])], {
      perm: [0, 2, 1, 3]
    })
    return rotary(g, weight === undefined ? split : norm(split, name, weight), cos, sin, headDim)
  }
  const presents: Array<KvCache> = []

  let x = inputsEmbeds
  let i = 0
  for (const layer of w.layers) {
    g.scope(`model.layers.${i}`, () => {
      const normed = norm(x, "input_layernorm.weight", layer.inputNorm)
      const attention = g.scope("self_attn", () => {
        const query = heads_(linearOf(g, normed, layer.q, "q_proj"), heads, "q_norm.weight", layer.qNorm)
        const newKey = heads_(linearOf(g, normed, layer.k, "k_proj"), kvHeads, "k_norm.weight", layer.kNorm)
        const newValue = g.op(
          "Transpose",
          [g.op("Reshape", [linearOf(g, normed, layer.v, "v_proj"), g.int64s([0, 0, kvHeads, headDim])])],
          { perm: [0, 2, 1, 3] }
        )
        const { merged, present } = groupedCacheAttention(g, { query, newKey, newValue }, pasts[i]!, mask, {
          heads,
          kvHeads,
          headDim,
          scale: 1 / Math.sqrt(headDim)
        })
        presents.push(present)
        return linearOf(g, merged, layer.o, "o_proj")
      })
      const afterAttention = g.op("Add", [x, attention])
      const normed2 = norm(afterAttention, "post_attention_layernorm.weight", layer.postNorm)
      const mlp = g.scope("mlp", () => {
        const gate = linearOf(g, normed2, layer.gate, "gate_proj")
        const silu = g.op("Mul", [gate, g.op("Sigmoid", [gate])])
        return linearOf(g, g.op("Mul", [silu, linearOf(g, normed2, layer.up, "up_proj")]), layer.down, "down_proj")
      })
      x = g.op("Add", [afterAttention, mlp])
    })
    i++
  }
  if (i !== layers) throw new Error(`the decoder's config has ${layers} layers, its weights ${i}`)
  const final = norm(x, "model.norm.weight", w.norm)
  const logits =
    quantized === undefined
      ? g.op("MatMul", [final, matrixWeight(g, "lm_head.weight", w.lmHead)])
      : quantized(g, final, { weight: w.lmHead }, "lm_head")
  g.output(logits, "logits", "float32", ["batch_size", "sequence_length", config.vocabSize])
  presents.forEach((present, i) => {
    g.output(present.key, presentName(i, "key"), "float32", cacheShape("total_sequence_length"))
    g.output(present.value, presentName(i, "value"), "float32", cacheShape("total_sequence_length"))
  })
  return g
}
