import { attendHeads, transformerBlock } from "../onnx/Attention.js"
import {
  cachedCrossAttention,
  freshEncoderStates,
  mergedDecoderCacheInputs,
  splitHeads
} from "../onnx/MergedDecoderCache.js"
import { Graph, type Value } from "../onnx/Graph.js"
import { gelu, layerNorm, linear, mlp } from "../onnx/Layers.js"
import type { AttentionWeights, LayerNormWeights, Matrix, TransformerBlockWeights } from "../Weights.js"

/**
 * Whisper's two graphs in the layout of the community's exports (onnx-community/whisper-*,
 * Xenova/whisper-*), which transformers.js's WhisperForConditionalGeneration loads:
 *
 * - `encoder_model.onnx`: input_features [batch, mel bins, 3000] → last_hidden_state
 *   [batch, 1500, d_model]: two convolutions (the second of stride 2) with GELU, positions, pre-norm
 *   blocks, a final norm.
 * - `decoder_model_merged.onnx`: input_ids, encoder_hidden_states, per layer
 *   past_key_values.{i}.decoder.{key,value} (self-attention, growing) and
 *   past_key_values.{i}.encoder.{key,value} (cross-attention, computed once), and use_cache_branch
 *   → logits and the matching present.* outputs. The exporters' merged graph switches on
 *   use_cache_branch with an If node: false computes the cross-attention keys and values from
 *   encoder_hidden_states, true takes the past ones. This one does the same without If: the
 *   encoder states are sliced to nothing when use_cache_branch is set, and the computed keys are
 *   appended to the past ones, so one of the two is always empty.
 */

export interface WhisperSize {
  readonly melBins: number
  readonly dModel: number
  readonly heads: number
  readonly encoderLayers: number
  readonly decoderLayers: number
  readonly ffn: number
  readonly vocabSize: number
  /** Encoder positions: 1500 for Whisper (30 s of 10 ms frames, halved). */
  readonly sourcePositions: number
  readonly targetPositions: number
}

export interface WhisperConv {
  /** [out, in, 3], a Conv kernel. */
  readonly kernel: Float32Array
  readonly bias: Float32Array
}

export interface WhisperDecoderLayer {
  readonly selfNorm: LayerNormWeights
  readonly self: AttentionWeights
  readonly crossNorm: LayerNormWeights
  readonly cross: AttentionWeights
  readonly mlpNorm: LayerNormWeights
  readonly mlp: TransformerBlockWeights["mlp"]
}

export interface WhisperWeights {
  readonly conv1: WhisperConv
  readonly conv2: WhisperConv
  /** [sourcePositions, dModel]. */
  readonly encoderPositions: Matrix
  readonly encoderLayers: ReadonlyArray<TransformerBlockWeights>
  readonly encoderNorm: LayerNormWeights
  /** [vocab, dModel]. */
  readonly embedTokens: Matrix
  /**
   * [dModel, vocab]: Whisper ties it to embed_tokens (its transpose); the exports hold it as a
   * weight of its own, so a random model may untie it.
   */
  readonly outputProjection: Matrix
  /** [targetPositions, dModel]. */
  readonly decoderPositions: Matrix
  readonly decoderLayers: ReadonlyArray<WhisperDecoderLayer>
  readonly decoderNorm: LayerNormWeights
}

/** The frames the encoder reads: twice its positions (the second convolution halves them). */
export const whisperInputFrames = (size: WhisperSize): number => size.sourcePositions * 2

export const whisperEncoderGraph = (size: WhisperSize, w: WhisperWeights): Graph => {
  const g = new Graph("encoder_model")
  const features = g.input("input_features", "float32", ["batch_size", size.melBins, whisperInputFrames(size)])
  g.output(whisperEncoderStates(g, features, size, w), "last_hidden_state", "float32", [
    "batch_size",
    size.sourcePositions,
    size.dModel
  ])
  return g
}

/**
 * The encoder's body in `g`: features [batch, mel bins, 2 · positions] → its last hidden state
 * [batch, positions, d_model]; what encoders built on Whisper's (Voxtral's) add their own layers to.
 */
export const whisperEncoderStates = (
  g: Graph,
  features: Value,
  size: WhisperSize,
  w: Pick<WhisperWeights, "conv1" | "conv2" | "encoderPositions" | "encoderLayers" | "encoderNorm">
): Value => {
  const conv = (x: Value, weights: WhisperConv, inputs: number, stride: number, name: string) =>
    g.scope(name, () =>
      gelu(
        g,
        g.op(
          "Conv",
          [
            x,
            g.weight("weight", "float32", [size.dModel, inputs, 3], weights.kernel),
            g.weight("bias", "float32", [size.dModel], weights.bias)
          ],
          { kernel_shape: [3], pads: [1, 1], strides: [stride] }
        )
      )
    )
  const convolved = conv(conv(features, w.conv1, size.melBins, 1, "conv1"), w.conv2, size.dModel, 2, "conv2")
  let x = g.op("Add", [
    g.op("Transpose", [convolved], { perm: [0, 2, 1] }),
    g.weight("embed_positions.weight", "float32", [size.sourcePositions, size.dModel], w.encoderPositions.data)
  ])
  w.encoderLayers.forEach((layer, index) => {
    x = transformerBlock(g, x, layer, {}, `layers.${index}`).output
  })
  return layerNorm(g, x, w.encoderNorm, "layer_norm")
}

export const whisperDecoderGraph = (size: WhisperSize, w: WhisperWeights): Graph => {
  const g = new Graph("decoder_model_merged")
  const headDim = size.dModel / size.heads
  const inputIds = g.input("input_ids", "int64", ["batch_size", "decoder_sequence_length"])
  const encoderStates = g.input("encoder_hidden_states", "float32", [
    "batch_size",
    "encoder_sequence_length / 2",
    size.dModel
  ])
  const pasts = mergedDecoderCacheInputs(g, w.decoderLayers.length, size.heads, headDim)
  const useCache = g.input("use_cache_branch", "bool", [1])

  const dim = (of: Value, axis: number) => g.op("Gather", [g.op("Shape", [of]), g.int64Scalar(axis)], { axis: 0 })
  const past = dim(pasts[0]!.decoderKey, 2)
  const total = g.op("Add", [past, dim(inputIds, 1)])
  const positions = g.op("Range", [past, total, g.int64Scalar(1)])
  let x = g.op("Add", [
    g.op("Gather", [
      g.weight("embed_tokens.weight", "float32", [size.vocabSize, size.dModel], w.embedTokens.data),
      inputIds
    ]),
    g.op("Gather", [
      g.weight("embed_positions.weight", "float32", [size.targetPositions, size.dModel], w.decoderPositions.data),
      positions
    ])
  ])
  // Query i (at past + i) sees keys 0 … past + i.
  const causal = g.op("Unsqueeze", [
    g.op("LessOrEqual", [
      g.op("Unsqueeze", [g.op("Range", [g.int64Scalar(0), total, g.int64Scalar(1)]), g.int64s([0])]),
      g.op("Unsqueeze", [positions, g.int64s([1])])
    ]),
    g.int64s([0, 1])
  ])
  const freshEncoder = freshEncoderStates(g, encoderStates, useCache)

  const split = (v: Value) => splitHeads(g, v, size.heads, headDim)
  const cacheShape = (sequence: string) => ["batch_size", size.heads, sequence, headDim]
  w.decoderLayers.forEach((layer, index) => {
    const cache = pasts[index]!
    g.scope(`layers.${index}`, () => {
      const selfOut = g.scope("self_attn", () => {
        const h = layerNorm(g, x, layer.selfNorm, "layer_norm")
        const key = g.op("Concat", [cache.decoderKey, split(linear(g, h, layer.self.key, "k_proj"))], { axis: 2 })
        const value = g.op("Concat", [cache.decoderValue, split(linear(g, h, layer.self.value, "v_proj"))], {
          axis: 2
        })
        g.output(key, `present.${index}.decoder.key`, "float32", cacheShape("past_decoder_sequence_length + 1"))
        g.output(value, `present.${index}.decoder.value`, "float32", cacheShape("past_decoder_sequence_length + 1"))
        return attendHeads(g, split(linear(g, h, layer.self.query, "q_proj")), key, value, layer.self, causal)
      })
      x = g.op("Add", [x, selfOut])
      const crossOut = g.scope("encoder_attn", () =>
        cachedCrossAttention(g, layerNorm(g, x, layer.crossNorm, "layer_norm"), layer.cross, cache, freshEncoder, index)
      )
      x = g.op("Add", [x, crossOut])
      x = g.op("Add", [x, mlp(g, layerNorm(g, x, layer.mlpNorm, "final_layer_norm"), layer.mlp, "mlp")])
    })
  })
  const normed = layerNorm(g, x, w.decoderNorm, "layer_norm")
  const logits = g.op("MatMul", [
    normed,
    g.weight("proj_out.weight", "float32", [size.dModel, size.vocabSize], w.outputProjection.data)
  ])
  g.output(logits, "logits", "float32", ["batch_size", "decoder_sequence_length", size.vocabSize])
  return g
}
