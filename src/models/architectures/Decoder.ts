import { causalMask, type KvCache, transformerBlock } from "../onnx/Attention.js"
import { Graph, type Value } from "../onnx/Graph.js"
import { layerNorm, matrixWeight } from "../onnx/Layers.js"
import type { DecoderWeights } from "../Weights.js"

/**
 * A decoder-only language model split the way transformers.js exports it: embed_tokens.onnx
 * (input_ids → inputs_embeds) and decoder_model_merged.onnx (inputs_embeds, attention_mask,
 * position_ids, past_key_values.{i}.key/value → logits, present.{i}.key/value). The decoder takes
 * a past of length 0 on the first step, so one file serves prefill and decode; keeping the
 * embedding lookup outside lets an executor splice image or audio features into inputs_embeds.
 */

export const embedTokensGraph = (w: DecoderWeights): Graph => {
  const g = new Graph("embed_tokens")
  const inputIds = g.input("input_ids", "int64", ["batch_size", "sequence_length"])
  const embeds = g.op("Gather", [matrixWeight(g, "embed_tokens.weight", w.embedTokens), inputIds], { axis: 0 })
  g.output(embeds, "inputs_embeds", "float32", ["batch_size", "sequence_length", w.embedTokens.cols])
  return g
}

export const decoderGraph = (w: DecoderWeights): Graph => {
  const hidden = w.embedTokens.cols
  const heads = w.layers[0]?.attention.heads ?? 1
  const headDim = hidden / heads
  const g = new Graph("decoder_model_merged")
  const inputsEmbeds = g.input("inputs_embeds", "float32", ["batch_size", "sequence_length", hidden])
  const attentionMask = g.input("attention_mask", "int64", ["batch_size", "total_sequence_length"])
  const positionIds = g.input("position_ids", "int64", ["batch_size", "sequence_length"])
  const cacheShape = (length: string) => ["batch_size", heads, length, headDim]
  const pasts: Array<KvCache> = w.layers.map((_, i) => ({
    key: g.input(`past_key_values.${i}.key`, "float32", cacheShape("past_sequence_length")),
    value: g.input(`past_key_values.${i}.value`, "float32", cacheShape("past_sequence_length"))
  }))

  const mask = causalMask(g, inputsEmbeds, pasts[0]!.key, attentionMask)
  const positions = g.op("Gather", [matrixWeight(g, "embed_positions.weight", w.positions), positionIds], { axis: 0 })
  let x: Value = g.op("Add", [inputsEmbeds, positions])
  w.layers.forEach((layer, i) => {
    const block = transformerBlock(g, x, layer, { mask, past: pasts[i]! }, `layers.${i}`)
    x = block.output
    g.output(block.present!.key, `present.${i}.key`, "float32", cacheShape("total_sequence_length"))
    g.output(block.present!.value, `present.${i}.value`, "float32", cacheShape("total_sequence_length"))
  })
  const logits = g.op("MatMul", [layerNorm(g, x, w.finalNorm, "norm"), matrixWeight(g, "lm_head.weight", w.lmHead)])
  g.output(logits, "logits", "float32", ["batch_size", "sequence_length", w.lmHead.cols])
  return g
}
