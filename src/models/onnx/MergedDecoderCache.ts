import type { AttentionWeights } from "../Weights.js"
import { attendHeads } from "./Attention.js"
import type { Graph, Value } from "./Graph.js"
import { linear } from "./Layers.js"

/**
 * The cache of a merged encoder-decoder decoder as the community exports it (decoder_model_merged,
 * Whisper's and SpeechT5's): per layer, past_key_values.{i}.decoder.{key,value} (self-attention,
 * growing a position a step) and past_key_values.{i}.encoder.{key,value} (cross-attention, computed
 * from the encoder states on the first run and passed back unchanged after), with use_cache_branch
 * saying which run this is. The exporters switch with an If node; these graphs do it without: the
 * encoder states are sliced to nothing on cached runs and the computed keys appended to the past
 * ones, so one of the two is always empty.
 */
export interface MergedLayerCache {
  readonly decoderKey: Value
  readonly decoderValue: Value
  readonly encoderKey: Value
  readonly encoderValue: Value
}

/** The cache's inputs, [batch, heads, positions, headDim] each, in the exports' order. */
export const mergedDecoderCacheInputs = (
  g: Graph,
  layers: number,
  heads: number,
  headDim: number
): ReadonlyArray<MergedLayerCache> =>
  Array.from({ length: layers }, (_, index) => {
    const cache = (kind: "decoder" | "encoder", part: "key" | "value") =>
      g.input(`past_key_values.${index}.${kind}.${part}`, "float32", [
        "batch_size",
        heads,
        kind === "decoder" ? "past_decoder_sequence_length" : "encoder_sequence_length_out",
        headDim
      ])
    return {
      decoderKey: cache("decoder", "key"),
      decoderValue: cache("decoder", "value"),
      encoderKey: cache("encoder", "key"),
      encoderValue: cache("encoder", "value")
    }
  })

/** The encoder states the cross-attention projects on this run: all of them on the first run, none after. */
export const freshEncoderStates = (g: Graph, encoderStates: Value, useCacheBranch: Value): Value =>
  g.op("Slice", [
    encoderStates,
    g.int64s([0]),
    g.op("Where", [useCacheBranch, g.int64s([0]), g.int64s([2 ** 31])]),
    g.int64s([1])
  ])

/** [batch, positions, heads × headDim] → [batch, heads, positions, headDim]. */
export const splitHeads = (g: Graph, v: Value, heads: number, headDim: number): Value =>
  g.op("Transpose", [g.op("Reshape", [v, g.int64s([0, 0, heads, headDim])])], { perm: [0, 2, 1, 3] })

/**
 * Cross-attention of `h` over the encoder: the cached keys and values followed by those of the
 * fresh encoder states (projected by k_proj and v_proj), written out as present.{index}.encoder.*;
 * `mask`, bool, hides encoder positions (padding) where given.
 */
export const cachedCrossAttention = (
  g: Graph,
  h: Value,
  w: AttentionWeights,
  cache: MergedLayerCache,
  freshEncoder: Value,
  index: number,
  mask?: Value
): Value => {
  const headDim = w.query.weight.cols / w.heads
  const split = (v: Value) => splitHeads(g, v, w.heads, headDim)
  const key = g.op("Concat", [cache.encoderKey, split(linear(g, freshEncoder, w.key, "k_proj"))], { axis: 2 })
  const value = g.op("Concat", [cache.encoderValue, split(linear(g, freshEncoder, w.value, "v_proj"))], { axis: 2 })
  const shape = ["batch_size", w.heads, "encoder_sequence_length_out", headDim]
  g.output(key, `present.${index}.encoder.key`, "float32", shape)
  g.output(value, `present.${index}.encoder.value`, "float32", shape)
  return attendHeads(g, split(linear(g, h, w.query, "q_proj")), key, value, w, mask)
}
