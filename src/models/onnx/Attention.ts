import type { AttentionWeights, TransformerBlockWeights } from "../Weights.js"
import { elementType, type Graph, type Value } from "./Graph.js"
import { layerNorm, linear, mlp } from "./Layers.js"

/** Keys and values of one layer, [batch, heads, positions, headDim] (the transformers.js cache layout). */
export interface KvCache {
  readonly key: Value
  readonly value: Value
}

export interface AttentionContext {
  /** bool [batch or 1, 1, queries, keys]: which keys each query may attend to; absent means all. */
  readonly mask?: Value
  /** Keys and values of earlier positions; when given, the result carries the extended cache. */
  readonly past?: KvCache
}

export interface AttentionResult {
  readonly output: Value
  readonly present?: KvCache
}

/**
 * The score given to keys a query may not see. Masked scores are replaced (not offset), so a row
 * with no visible key is uniform in float32 and float64 alike and the reference stays exact.
 */
export const maskedScore = -1e9

/**
 * Multi-head self-attention over x [batch, sequence, hidden]. With a cache, the new keys and values
 * are appended to the past ones along the position axis, and queries attend to the whole.
 */
export const selfAttention = (
  g: Graph,
  x: Value,
  w: AttentionWeights,
  context: AttentionContext,
  name: string
): AttentionResult =>
  g.scope(name, () => {
    const hidden = w.query.weight.cols
    const headDim = hidden / w.heads
    const splitHeads = (v: Value) =>
      g.op("Transpose", [g.op("Reshape", [v, g.int64s([0, 0, w.heads, headDim])])], { perm: [0, 2, 1, 3] })
    const query = splitHeads(linear(g, x, w.query, "q_proj"))
    const newKey = splitHeads(linear(g, x, w.key, "k_proj"))
    const newValue = splitHeads(linear(g, x, w.value, "v_proj"))
    const key = context.past === undefined ? newKey : g.op("Concat", [context.past.key, newKey], { axis: 2 })
    const value = context.past === undefined ? newValue : g.op("Concat", [context.past.value, newValue], { axis: 2 })

    const keyT = g.op("Transpose", [key], { perm: [0, 1, 3, 2] })
    const raw = g.op("Mul", [g.op("MatMul", [query, keyT]), g.floatScalar(1 / Math.sqrt(headDim))])
    const scores = context.mask === undefined ? raw : g.op("Where", [context.mask, raw, g.floatScalar(maskedScore)])
    const weights = g.op("Softmax", [scores], { axis: -1 })
    const heads = g.op("MatMul", [weights, value])
    const merged = g.op("Reshape", [g.op("Transpose", [heads], { perm: [0, 2, 1, 3] }), g.int64s([0, 0, hidden])])
    const output = linear(g, merged, w.output, "o_proj")
    return context.past === undefined ? { output } : { output, present: { key, value } }
  })

/**
 * The decoder's mask, bool [batch, 1, sequence, past + sequence]: query i (at absolute position
 * past + i) sees key j when j ≤ past + i and attention_mask[j] is 1.
 */
export const causalMask = (g: Graph, inputsEmbeds: Value, pastKey: Value, attentionMask: Value): Value =>
  g.scope("causal_mask", () => {
    const dim = (of: Value, axis: number) => g.op("Gather", [g.op("Shape", [of]), g.int64Scalar(axis)], { axis: 0 })
    const past = dim(pastKey, 2)
    const total = g.op("Add", [past, dim(inputsEmbeds, 1)])
    const queryPositions = g.op("Range", [past, total, g.int64Scalar(1)])
    const keyPositions = g.op("Range", [g.int64Scalar(0), total, g.int64Scalar(1)])
    const causal = g.op("LessOrEqual", [
      g.op("Unsqueeze", [keyPositions, g.int64s([0])]),
      g.op("Unsqueeze", [queryPositions, g.int64s([1])])
    ])
    const padding = g.op("Unsqueeze", [g.op("Cast", [attentionMask], { to: elementType("bool") }), g.int64s([1, 2])])
    return g.op("And", [g.op("Unsqueeze", [causal, g.int64s([0, 1])]), padding])
  })

/**
 * Attention of queries over keys and values already split into heads, [batch, heads, positions,
 * headDim], merged and projected by `w.output` (named out_proj); `mask` is bool, broadcast to the scores.
 */
export const attendHeads = (
  g: Graph,
  query: Value,
  key: Value,
  value: Value,
  w: AttentionWeights,
  mask: Value | undefined
) => {
  const hidden = w.query.weight.cols
  const headDim = hidden / w.heads
  const raw = g.op("Mul", [
    g.op("MatMul", [query, g.op("Transpose", [key], { perm: [0, 1, 3, 2] })]),
    g.floatScalar(1 / Math.sqrt(headDim))
  ])
  const scores = mask === undefined ? raw : g.op("Where", [mask, raw, g.floatScalar(maskedScore)])
  const heads = g.op("MatMul", [g.op("Softmax", [scores], { axis: -1 }), value])
  const merged = g.op("Reshape", [g.op("Transpose", [heads], { perm: [0, 2, 1, 3] }), g.int64s([0, 0, hidden])])
  return linear(g, merged, w.output, "out_proj")
}

export const transformerBlock = (
  g: Graph,
  x: Value,
  w: TransformerBlockWeights,
  context: AttentionContext,
  name: string
): AttentionResult =>
  g.scope(name, () => {
    const attention = selfAttention(g, layerNorm(g, x, w.norm1, "input_layernorm"), w.attention, context, "self_attn")
    const afterAttention = g.op("Add", [x, attention.output])
    const output = g.op("Add", [
      afterAttention,
      mlp(g, layerNorm(g, afterAttention, w.norm2, "post_attention_layernorm"), w.mlp, "mlp")
    ])
    return attention.present === undefined ? { output } : { output, present: attention.present }
  })

/**
 * Grouped-query attention over a cache as the split-layout VLM decoders write it: the step's keys
 * and values appended to the layer's past (the present, which the graph gives back), each KV head's
 * group of queries against its keys, scaled by `scale`, the mask applied (bool [batch, 1, 1,
 * sequence, total]), and the heads merged to [batch, sequence, heads · headDim]. `query` is
 * [batch, heads, sequence, headDim], `newKey` and `newValue` [batch, kvHeads, sequence, headDim].
 */
export const groupedCacheAttention = (
  g: Graph,
  step: { readonly query: Value; readonly newKey: Value; readonly newValue: Value },
  past: KvCache,
  mask: Value,
  shape: { readonly heads: number; readonly kvHeads: number; readonly headDim: number; readonly scale: number }
): { readonly merged: Value; readonly present: KvCache } => {
  const { heads, kvHeads, headDim, scale } = shape
  const key = g.op("Concat", [past.key, step.newKey], { axis: 2 })
  const value = g.op("Concat", [past.value, step.newValue], { axis: 2 })
  // Grouped queries: [batch, kvHeads, group, sequence, headDim] against each KV head's keys.
  const grouped = g.op("Reshape", [step.query, g.int64s([0, kvHeads, heads / kvHeads, -1, headDim])])
  const keyT = g.op("Unsqueeze", [g.op("Transpose", [key], { perm: [0, 1, 3, 2] }), g.int64s([2])])
  const scores = g.op("Mul", [g.op("MatMul", [grouped, keyT]), g.floatScalar(scale)])
  const weights = g.op("Softmax", [g.op("Where", [mask, scores, g.floatScalar(maskedScore)])], { axis: -1 })
  const context = g.op("MatMul", [weights, g.op("Unsqueeze", [value, g.int64s([2])])])
  const merged = g.op("Reshape", [
    g.op("Transpose", [g.op("Reshape", [context, g.int64s([0, heads, -1, headDim])])], { perm: [0, 2, 1, 3] }),
    g.int64s([0, 0, heads * headDim])
  ])
  return { merged, present: { key, value } }
}
