import { causalMask, groupedCacheAttention, type KvCache } from "../onnx/Attention.js"
import { type Dim, Graph, type Value } from "../onnx/Graph.js"
import { linear, matrixWeight } from "../onnx/Layers.js"
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
 * A Qwen2 decoder in the split layout (decoder_model_merged: inputs_embeds, attention_mask,
 * position_ids, past_key_values.N.key/value → logits, present.N.key/value): q/k/v with biases,
 * grouped queries over the cache, SwiGLU; or a Qwen3's, whose queries and keys are normed per
 * head before they rotate. `positions` says position_ids' shape and how they become
 * the rotary tables: M-RoPE's [3, batch, sequence] (Qwen2-VL) or plain [batch, sequence]
 * (LLaVA-OneVision's Qwen2).
 */
export const qwen2DecoderGraph = (
  w: Qwen2TextWeights,
  positions: {
    readonly dims: ReadonlyArray<Dim>
    readonly rotary: (g: Graph, positionIds: Value, headDim: number) => { readonly cos: Value; readonly sin: Value }
  }
): Graph => {
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
  w.layers.forEach((layer, i) => {
    g.scope(`model.layers.${i}`, () => {
      const normed = norm(x, "input_layernorm.weight", layer.inputNorm)
      const attention = g.scope("self_attn", () => {
        const query = heads_(linear(g, normed, layer.q, "q_proj"), heads, "q_norm.weight", layer.qNorm)
        const newKey = heads_(linear(g, normed, layer.k, "k_proj"), kvHeads, "k_norm.weight", layer.kNorm)
        const newValue = g.op(
          "Transpose",
          [g.op("Reshape", [linear(g, normed, layer.v, "v_proj"), g.int64s([0, 0, kvHeads, headDim])])],
          { perm: [0, 2, 1, 3] }
        )
        const { merged, present } = groupedCacheAttention(g, { query, newKey, newValue }, pasts[i]!, mask, {
          heads,
          kvHeads,
          headDim,
          scale: 1 / Math.sqrt(headDim)
        })
        presents.push(present)
        return linear(g, merged, layer.o, "o_proj")
      })
      const afterAttention = g.op("Add", [x, attention])
      const normed2 = norm(afterAttention, "post_attention_layernorm.weight", layer.postNorm)
      const mlp = g.scope("mlp", () => {
        const gate = linear(g, normed2, layer.gate, "gate_proj")
        const silu = g.op("Mul", [gate, g.op("Sigmoid", [gate])])
        return linear(g, g.op("Mul", [silu, linear(g, normed2, layer.up, "up_proj")]), layer.down, "down_proj")
      })
      x = g.op("Add", [afterAttention, mlp])
    })
  })
  const logits = g.op("MatMul", [norm(x, "model.norm.weight", w.norm), matrixWeight(g, "lm_head.weight", w.lmHead)])
  g.output(logits, "logits", "float32", ["batch_size", "sequence_length", config.vocabSize])
  presents.forEach((present, i) => {
    g.output(present.key, presentName(i, "key"), "float32", cacheShape("total_sequence_length"))
    g.output(present.value, presentName(i, "value"), "float32", cacheShape("total_sequence_length"))
  })
  return g
}
