import { causalMask, groupedCacheAttention, selfAttention } from "../onnx/Attention.js"
import { type Dim, elementType, Graph, type Value } from "../onnx/Graph.js"
import { geluTanh, layerNorm, linear, matrixWeight, patchEmbedding } from "../onnx/Layers.js"
import type {
  LayerNormWeights,
  LinearWeights,
  Matrix,
  PatchEmbeddingWeights,
  TransformerBlockWeights
} from "../Weights.js"
import { pastName, presentName, rmsNorm, rotary } from "./Llama.js"

/**
 * Gemma 3 (transformers' Gemma3ForConditionalGeneration) as the three graphs of a split export
 * that transformers.js's Gemma3ForConditionalGeneration runs:
 *
 *   onnx/vision_encoder.onnx       pixel_values float [batch, 3, S, S]
 *                                  → image_features float [batch, mm_tokens_per_image, text hidden]
 *   onnx/embed_tokens.onnx         input_ids int64 [batch, sequence]
 *                                  → inputs_embeds float [batch, sequence, hidden], already scaled by √hidden
 *   onnx/decoder_model_merged.onnx inputs_embeds, attention_mask int64 [batch, total],
 *                                  position_ids int64 [batch, sequence],
 *                                  past_key_values.N.key/value → logits, present.N.key/value
 *
 * The vision encoder is SigLIP's vision tower without its head (a patch Conv, learnt positions,
 * pre-LayerNorm layers with tanh GELU, a final LayerNorm) and Gemma 3's multimodal projector: the
 * patch grid average-pooled to √mm_tokens_per_image a side, Gemma's RMSNorm, a projection.
 *
 * The decoder follows modeling_gemma3.py: every RMSNorm scales by 1 + w; each layer normalizes
 * before and after both its attention and its MLP (the sum of the residual and the normalized
 * output goes on); queries and keys are RMS-normalized per head before rotary positions; scores are
 * scaled by query_pre_attn_scalar^-½; the MLP is down(gelu_tanh(gate) · up). Layers are sliding or
 * full: a sliding layer's query sees the `sliding_window` cache slots up to itself, with rotary base
 * rope_local_base_freq; a full layer sees the whole causal prefix, with rope_theta and rope_scaling.
 * Rotary angles are position_ids · inv_freq, worked out in the graph, so any position is valid
 * (transformers.js counts Gemma 3's positions from 1). Every layer's present is its whole cache,
 * the sliding ones' too: transformers.js reads the cache length from layer 0 and keeps it all.
 */

export type Gemma3LayerType = "sliding_attention" | "full_attention"

export interface Gemma3VisionConfig {
  readonly hiddenSize: number
  readonly intermediateSize: number
  readonly layers: number
  readonly heads: number
  readonly imageSize: number
  readonly patchSize: number
  readonly layerNormEps: number
}

/** rope_scaling of the full attention layers; "linear" divides every rotary frequency by `factor`. */
export interface Gemma3RopeScaling {
  readonly ropeType: "linear"
  readonly factor: number
}

export interface Gemma3TextConfig {
  readonly hiddenSize: number
  readonly intermediateSize: number
  readonly layers: number
  readonly heads: number
  readonly kvHeads: number
  readonly headDim: number
  readonly vocabSize: number
  readonly maxPositions: number
  /** Attention scores are scaled by its inverse square root, not head_dim's. */
  readonly queryPreAttnScalar: number
  /** Cache slots a sliding layer's query sees, its own included. */
  readonly slidingWindow: number
  readonly layerTypes: ReadonlyArray<Gemma3LayerType>
  /** The rotary base of the full attention layers. */
  readonly ropeTheta: number
  /** The rotary base of the sliding layers, which are never scaled. */
  readonly ropeLocalBaseFreq: number
  readonly ropeScaling: Gemma3RopeScaling | null
  readonly rmsNormEps: number
  readonly tieWordEmbeddings: boolean
}

export interface Gemma3Config {
  readonly vision: Gemma3VisionConfig
  readonly text: Gemma3TextConfig
  /** Soft tokens per image; its square root is the side of the pooled patch grid. */
  readonly mmTokensPerImage: number
}

export interface Gemma3VisionWeights {
  readonly config: Gemma3VisionConfig
  readonly mmTokensPerImage: number
  readonly patch: PatchEmbeddingWeights
  /** [patches, hidden]: one learnt row per patch, no class token. */
  readonly positions: Matrix
  /** SigLIP's encoder layers: fc1 and fc2 are `mlp.up` and `mlp.down`, with tanh GELU between. */
  readonly layers: ReadonlyArray<TransformerBlockWeights>
  readonly postLayerNorm: LayerNormWeights
  /** mm_soft_emb_norm's weight w, [vision hidden]: Gemma's RMSNorm scales by 1 + w. */
  readonly softEmbeddingNorm: Float32Array
  /** mm_input_projection_weight, [vision hidden, text hidden]. */
  readonly inputProjection: Matrix
}

/** Every norm weight is Gemma's RMSNorm's w, which scales by 1 + w. */
export interface Gemma3DecoderLayerWeights {
  readonly inputNorm: Float32Array
  readonly q: LinearWeights
  readonly k: LinearWeights
  readonly v: LinearWeights
  readonly o: LinearWeights
  /** [head_dim] each, shared by all heads. */
  readonly qNorm: Float32Array
  readonly kNorm: Float32Array
  readonly postAttentionNorm: Float32Array
  readonly preFeedforwardNorm: Float32Array
  readonly postFeedforwardNorm: Float32Array
  readonly gate: LinearWeights
  readonly up: LinearWeights
  readonly down: LinearWeights
}

export interface Gemma3TextWeights {
  readonly config: Gemma3TextConfig
  /** [vocab, hidden], unscaled: embed_tokens.onnx multiplies the rows by √hidden. */
  readonly embedTokens: Matrix
  readonly layers: ReadonlyArray<Gemma3DecoderLayerWeights>
  readonly norm: Float32Array
  /** [hidden, vocab]: the embedding table transposed when tied. */
  readonly lmHead: Matrix
}

/** The JSON fields of a Gemma3TextConfig that decide each layer's attention. */
export interface Gemma3LayerTypeFields {
  readonly num_hidden_layers: number
  readonly layer_types?: ReadonlyArray<string> | null
  readonly sliding_window_pattern?: number | null
}

/**
 * Each layer's attention as Gemma3TextConfig decides it: `layer_types` where the config has it,
 * otherwise sliding except every `sliding_window_pattern`-th layer (6 by default), which is full.
 */
export const gemma3LayerTypes = (fields: Gemma3LayerTypeFields): ReadonlyArray<Gemma3LayerType> => {
  const layers = fields.num_hidden_layers
  if (fields.layer_types != null) {
    if (fields.layer_types.length !== layers) {
      throw new Error(`layer_types has ${fields.layer_types.length} entries for ${layers} layers`)
    }
    return fields.layer_types.map((type, i) => {
      if (type !== "sliding_attention" && type !== "full_attention") {
        throw new Error(`layer_types[${i}] is ${JSON.stringify(type)}, not sliding_attention or full_attention`)
      }
      return type
    })
  }
  const pattern = fields.sliding_window_pattern ?? 6
  return Array.from({ length: layers }, (_, i) => ((i + 1) % pattern === 0 ? "full_attention" : "sliding_attention"))
}

/** The sliding_window_pattern that gives `types`, if one does. */
const slidingWindowPattern = (types: ReadonlyArray<Gemma3LayerType>): number | undefined =>
  Array.from({ length: types.length + 1 }, (_, i) => i + 1).find((pattern) =>
    gemma3LayerTypes({ num_hidden_layers: types.length, sliding_window_pattern: pattern }).every(
      (type, i) => type === types[i]
    )
  )

export interface Gemma3TokenIds {
  readonly padTokenId: number
  readonly bosTokenId: number
  readonly eosTokenIds: ReadonlyArray<number>
  readonly imageTokenIndex: number
  readonly boiTokenIndex: number
  readonly eoiTokenIndex: number
}

/** text_config in Gemma3TextConfig's fields, every one written out. */
export const gemma3TextConfigJson = (text: Gemma3TextConfig, tokens: Gemma3TokenIds) => {
  const pattern = slidingWindowPattern(text.layerTypes)
  return {
    model_type: "gemma3_text",
    architectures: ["Gemma3ForCausalLM"],
    vocab_size: text.vocabSize,
    hidden_size: text.hiddenSize,
    intermediate_size: text.intermediateSize,
    num_hidden_layers: text.layers,
    num_attention_heads: text.heads,
    num_key_value_heads: text.kvHeads,
    head_dim: text.headDim,
    query_pre_attn_scalar: text.queryPreAttnScalar,
    hidden_activation: "gelu_pytorch_tanh",
    max_position_embeddings: text.maxPositions,
    rms_norm_eps: text.rmsNormEps,
    rope_theta: text.ropeTheta,
    rope_local_base_freq: text.ropeLocalBaseFreq,
    rope_scaling: text.ropeScaling === null ? null : { rope_type: "linear", factor: text.ropeScaling.factor },
    sliding_window: text.slidingWindow,
    ...(pattern === undefined ? {} : { sliding_window_pattern: pattern }),
    layer_types: text.layerTypes,
    attention_bias: false,
    attention_dropout: 0,
    attn_logit_softcapping: null,
    final_logit_softcapping: null,
    initializer_range: 0.02,
    use_cache: true,
    tie_word_embeddings: text.tieWordEmbeddings,
    torch_dtype: "float32",
    pad_token_id: tokens.padTokenId,
    bos_token_id: tokens.bosTokenId,
    eos_token_id: tokens.eosTokenIds
  }
}

/** config.json in transformers' Gemma3Config fields. */
export const gemma3ConfigJson = (
  config: Gemma3Config,
  tokens: Gemma3TokenIds,
  extra: Record<string, unknown> = {}
) => ({
  architectures: ["Gemma3ForConditionalGeneration"],
  model_type: "gemma3",
  boi_token_index: tokens.boiTokenIndex,
  eoi_token_index: tokens.eoiTokenIndex,
  image_token_index: tokens.imageTokenIndex,
  mm_tokens_per_image: config.mmTokensPerImage,
  pad_token_id: tokens.padTokenId,
  bos_token_id: tokens.bosTokenId,
  eos_token_id: tokens.eosTokenIds,
  initializer_range: 0.02,
  tie_word_embeddings: config.text.tieWordEmbeddings,
  torch_dtype: "float32",
  text_config: gemma3TextConfigJson(config.text, tokens),
  vision_config: siglipVisionConfigJson(config.vision),
  ...extra
})

/** vision_config in SiglipVisionConfig's fields: the tower without its head. */
export const siglipVisionConfigJson = (vision: Gemma3VisionConfig) => ({
  model_type: "siglip_vision_model",
  hidden_size: vision.hiddenSize,
  intermediate_size: vision.intermediateSize,
  num_hidden_layers: vision.layers,
  num_attention_heads: vision.heads,
  num_channels: 3,
  image_size: vision.imageSize,
  patch_size: vision.patchSize,
  hidden_act: "gelu_pytorch_tanh",
  layer_norm_eps: vision.layerNormEps,
  attention_dropout: 0,
  vision_use_head: false
})

/** Gemma3RMSNorm over the last axis: x · rsqrt(mean(x²) + ε) · (1 + w). */
const gemmaRmsNorm = (g: Graph, x: Value, name: string, weight: Float32Array, epsilon: number): Value =>
  rmsNorm(g, x, g.op("Add", [g.weight(name, "float32", [weight.length], weight), g.floatScalar(1)]), epsilon)

/** A SigLIP encoder layer: x + attention(LN1(x)), then + fc2(gelu_tanh(fc1(LN2(x)))). */
const siglipLayer = (g: Graph, x: Value, w: TransformerBlockWeights, name: string): Value =>
  g.scope(name, () => {
    const attention = selfAttention(g, layerNorm(g, x, w.norm1, "layer_norm1"), w.attention, {}, "self_attn")
    const afterAttention = g.op("Add", [x, attention.output])
    const normed = layerNorm(g, afterAttention, w.norm2, "layer_norm2")
    const mlp = g.scope("mlp", () => linear(g, geluTanh(g, linear(g, normed, w.mlp.up, "fc1")), w.mlp.down, "fc2"))
    return g.op("Add", [afterAttention, mlp])
  })

/** SigLIP's vision tower up to its last encoder layer: the patch embedding, learnt positions and layers. */
export type SiglipTowerWeights = Pick<Gemma3VisionWeights, "patch" | "positions" | "layers">

/**
 * The output of SigLIP's last encoder layer (hidden_states[-1], before post_layernorm), [batch,
 * patches, hidden], its weights named under vision_tower.vision_model.
 */
export const siglipHiddenStates = (g: Graph, pixelValues: Value, w: SiglipTowerWeights): Value => {
  let x = g.scope("vision_tower.vision_model.embeddings", () =>
    g.op("Add", [
      patchEmbedding(g, pixelValues, w.patch, "patch_embedding"),
      matrixWeight(g, "position_embedding.weight", w.positions)
    ])
  )
  w.layers.forEach((layer, i) => {
    x = siglipLayer(g, x, layer, `vision_tower.vision_model.encoder.layers.${i}`)
  })
  return x
}

export const gemma3VisionGraph = (w: Gemma3VisionWeights): Graph => {
  const { config } = w
  const grid = config.imageSize / config.patchSize
  const side = Math.sqrt(w.mmTokensPerImage)
  if (!Number.isInteger(grid) || !Number.isInteger(side) || grid % side !== 0) {
    throw new Error(
      `${config.imageSize}-pixel images of ${config.patchSize}-pixel patches do not pool to ${w.mmTokensPerImage} tokens`
    )
  }
  const pool = grid / side
  const hidden = config.hiddenSize
  const g = new Graph("vision_encoder")
  const pixelValues = g.input("pixel_values", "float32", ["batch_size", 3, config.imageSize, config.imageSize])
  const x = layerNorm(
    g,
    siglipHiddenStates(g, pixelValues, w),
    w.postLayerNorm,
    "vision_tower.vision_model.post_layernorm"
  )
  const features = g.scope("multi_modal_projector", () => {
    // [batch, patches, hidden] → [batch, hidden, grid, grid] → pooled → [batch, tokens, hidden]
    const planes = g.op("Reshape", [g.op("Transpose", [x], { perm: [0, 2, 1] }), g.int64s([0, hidden, grid, grid])])
    const pooled = g.op("AveragePool", [planes], { kernel_shape: [pool, pool], strides: [pool, pool] })
    const tokens = g.op("Transpose", [g.op("Reshape", [pooled, g.int64s([0, hidden, -1])])], { perm: [0, 2, 1] })
    const normed = gemmaRmsNorm(g, tokens, "mm_soft_emb_norm.weight", w.softEmbeddingNorm, config.layerNormEps)
    return g.op("MatMul", [normed, matrixWeight(g, "mm_input_projection_weight", w.inputProjection)])
  })
  g.output(features, "image_features", "float32", ["batch_size", w.mmTokensPerImage, w.inputProjection.cols])
  return g
}

export const gemma3EmbedTokensGraph = (w: Gemma3TextWeights): Graph => {
  const hidden = w.config.hiddenSize
  const g = new Graph("embed_tokens")
  const inputIds = g.input("input_ids", "int64", ["batch_size", "sequence_length"])
  const rows = g.op("Gather", [matrixWeight(g, "model.embed_tokens.weight", w.embedTokens), inputIds], { axis: 0 })
  // Gemma3TextScaledWordEmbedding: √hidden in the weights' dtype.
  const embeds = g.op("Mul", [rows, g.floatScalar(Math.sqrt(hidden))])
  g.output(embeds, "inputs_embeds", "float32", ["batch_size", "sequence_length", hidden])
  return g
}

/** inv_freq of one layer type, each frequency twice as rotate_half pairs them: 1/θ^(2k/head_dim) / factor. */
const rotaryFrequencies = (headDim: number, theta: number, factor: number): Float32Array => {
  const frequencies = new Float32Array(headDim)
  for (let k = 0; k < headDim / 2; k++) {
    const frequency = 1 / theta ** ((2 * k) / headDim) / factor
    frequencies[k] = frequency
    frequencies[k + headDim / 2] = frequency
  }
  return frequencies
}

/**
 * Which keys each query sees on top of the causal and padding mask, bool [1, 1, sequence, total]:
 * key slot j is in the window of the query at slot i when j > i − window.
 */
const slidingWindowBand = (g: Graph, inputsEmbeds: Value, pastKey: Value, window: number): Value =>
  g.scope("sliding_window_mask", () => {
    const dim = (of: Value, axis: number) => g.op("Gather", [g.op("Shape", [of]), g.int64Scalar(axis)], { axis: 0 })
    const past = dim(pastKey, 2)
    const total = g.op("Add", [past, dim(inputsEmbeds, 1)])
    const queries = g.op("Range", [past, total, g.int64Scalar(1)])
    const keys = g.op("Range", [g.int64Scalar(0), total, g.int64Scalar(1)])
    const band = g.op("Greater", [
      g.op("Unsqueeze", [keys, g.int64s([0])]),
      g.op("Unsqueeze", [g.op("Sub", [queries, g.int64Scalar(window)]), g.int64s([1])])
    ])
    return g.op("Unsqueeze", [band, g.int64s([0, 1])])
  })

export const gemma3DecoderGraph = (w: Gemma3TextWeights): Graph => {
  const { config } = w
  const { hiddenSize: hidden, heads, kvHeads, headDim, layers, vocabSize } = config
  if (config.layerTypes.length !== layers || w.layers.length !== layers) {
    throw new Error(
      `${layers} layers, but ${config.layerTypes.length} layer types and ${w.layers.length} layers of weights`
    )
  }
  const g = new Graph("decoder_model_merged")
  const inputsEmbeds = g.input("inputs_embeds", "float32", ["batch_size", "sequence_length", hidden])
  const attentionMask = g.input("attention_mask", "int64", ["batch_size", "total_sequence_length"])
  const positionIds = g.input("position_ids", "int64", ["batch_size", "sequence_length"])
  // Head count and head size are numbers: transformers.js sizes the first step's empty cache from them.
  const cacheShape = (length: string): ReadonlyArray<Dim> => ["batch_size", kvHeads, length, headDim]
  const pasts = Array.from({ length: layers }, (_, i) => ({
    key: g.input(pastName("past_key_values", i, "key"), "float32", cacheShape("past_sequence_length")),
    value: g.input(pastName("past_key_values", i, "value"), "float32", cacheShape("past_sequence_length"))
  }))

  const causal = causalMask(g, inputsEmbeds, pasts[0]!.key, attentionMask)
  const positions = g.op("Unsqueeze", [g.op("Cast", [positionIds], { to: elementType("float32") }), g.int64s([1, 3])])
  /** The mask [batch, 1, 1, sequence, total] and rotary cos and sin [batch, 1, sequence, head_dim] of a layer type. */
  const attentionOf = (type: Gemma3LayerType) => {
    const sliding = type === "sliding_attention"
    const mask = sliding
      ? g.op("And", [causal, slidingWindowBand(g, inputsEmbeds, pasts[0]!.key, config.slidingWindow)])
      : causal
    const angles = g.scope(sliding ? "model.rotary_emb_local" : "model.rotary_emb", () => {
      const frequencies = sliding
        ? rotaryFrequencies(headDim, config.ropeLocalBaseFreq, 1)
        : rotaryFrequencies(headDim, config.ropeTheta, config.ropeScaling?.factor ?? 1)
      return g.op("Mul", [positions, g.weight("inv_freq", "float32", [headDim], frequencies)])
    })
    return {
      mask: g.op("Unsqueeze", [mask, g.int64s([1])]),
      cos: g.op("Cos", [angles]),
      sin: g.op("Sin", [angles])
    }
  }
  const byType = new Map([...new Set(config.layerTypes)].map((type) => [type, attentionOf(type)] as const))
  const norm = (x: Value, name: string, weight: Float32Array) => gemmaRmsNorm(g, x, name, weight, config.rmsNormEps)
  const presents: Array<{ readonly key: Value; readonly value: Value }> = []

  let x = inputsEmbeds
  w.layers.forEach((layer, i) => {
    g.scope(`model.layers.${i}`, () => {
      const { mask, cos, sin } = byType.get(config.layerTypes[i]!)!
      const normed = norm(x, "input_layernorm.weight", layer.inputNorm)
      const attention = g.scope("self_attn", () => {
        const split = (value: Value, count: number) =>
          g.op("Transpose", [g.op("Reshape", [value, g.int64s([0, 0, count, headDim])])], { perm: [0, 2, 1, 3] })
        const query = rotary(
          g,
          norm(split(linear(g, normed, layer.q, "q_proj"), heads), "q_norm.weight", layer.qNorm),
          cos,
          sin,
          headDim
        )
        const newKey = rotary(
          g,
          norm(split(linear(g, normed, layer.k, "k_proj"), kvHeads), "k_norm.weight", layer.kNorm),
          cos,
          sin,
          headDim
        )
        const newValue = split(linear(g, normed, layer.v, "v_proj"), kvHeads)
        const { merged, present } = groupedCacheAttention(g, { query, newKey, newValue }, pasts[i]!, mask, {
          heads,
          kvHeads,
          headDim,
          scale: 1 / Math.sqrt(config.queryPreAttnScalar)
        })
        presents.push(present)
        return linear(g, merged, layer.o, "o_proj")
      })
      const afterAttention = g.op("Add", [
        x,
        norm(attention, "post_attention_layernorm.weight", layer.postAttentionNorm)
      ])
      const feedforwardInput = norm(afterAttention, "pre_feedforward_layernorm.weight", layer.preFeedforwardNorm)
      const mlp = g.scope("mlp", () => {
        const gate = geluTanh(g, linear(g, feedforwardInput, layer.gate, "gate_proj"))
        const up = linear(g, feedforwardInput, layer.up, "up_proj")
        return linear(g, g.op("Mul", [gate, up]), layer.down, "down_proj")
      })
      x = g.op("Add", [afterAttention, norm(mlp, "post_feedforward_layernorm.weight", layer.postFeedforwardNorm)])
    })
  })
  const logits = g.op("MatMul", [norm(x, "model.norm.weight", w.norm), matrixWeight(g, "lm_head.weight", w.lmHead)])
  g.output(logits, "logits", "float32", ["batch_size", "sequence_length", vocabSize])
  presents.forEach((present, i) => {
    g.output(present.key, presentName(i, "key"), "float32", cacheShape("total_sequence_length"))
    g.output(present.value, presentName(i, "value"), "float32", cacheShape("total_sequence_length"))
  })
  return g
}

/** The three graphs by their onnx/ stem. */
export const gemma3Graphs = (
  vision: Gemma3VisionWeights,
  text: Gemma3TextWeights
): ReadonlyMap<"vision_encoder" | "embed_tokens" | "decoder_model_merged", Graph> =>
  new Map([
    ["vision_encoder", gemma3VisionGraph(vision)],
    ["embed_tokens", gemma3EmbedTokensGraph(text)],
    ["decoder_model_merged", gemma3DecoderGraph(text)]
  ])
