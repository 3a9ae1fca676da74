import { elementType, Graph, type Value } from "../onnx/Graph.js"
import { gelu, linear, matrixWeight } from "../onnx/Layers.js"
import type { LinearWeights, Matrix } from "../Weights.js"
import {
  type Gemma3VisionConfig,
  type SiglipTowerWeights,
  siglipHiddenStates,
  siglipVisionConfigJson
} from "./Gemma3.js"
import { type Qwen2DecoderLayerWeights, qwen2DecoderGraph } from "./Qwen2Decoder.js"

/**
 * LLaVA-OneVision (transformers' LlavaOnevisionForConditionalGeneration, e.g.
 * llava-hf/llava-onevision-qwen2-0.5b-ov-hf) as the three graphs of the community's split export,
 * which transformers.js runs as LlavaForConditionalGeneration:
 *
 *   onnx/vision_encoder.onnx       pixel_values float [images, 3, S, S]
 *                                  → image_features float [images, (S / patch)², text hidden]
 *   onnx/embed_tokens.onnx         input_ids int64 [batch, sequence] → inputs_embeds float [batch, sequence, hidden]
 *   onnx/decoder_model_merged.onnx inputs_embeds, attention_mask int64 [batch, total],
 *                                  position_ids int64 [batch, sequence],
 *                                  past_key_values.N.key/value → logits, present.N.key/value
 *
 * The vision encoder is SigLIP's tower read at vision_feature_layer -1 with the "full" strategy:
 * hidden_states[-1], the last encoder layer's output with every patch and without the tower's
 * post_layernorm (which the graph does not hold), then LlavaOnevisionMultiModalProjector: linear_1,
 * GELU (erf), linear_2, both with biases. Any-resolution tiling and the image_newline row are not
 * in it: transformers.js resizes each image to the tower's size and encodes it whole.
 *
 * The decoder is Qwen2: RMSNorm, biases on q, k and v only, rotary angles position_ids · inv_freq
 * worked out in the graph (positions counted from 0), grouped-query attention, SwiGLU MLP.
 */

/** SigLIP's vision_config, as Gemma 3's tower reads it. */
export type LlavaOnevisionVisionConfig = Gemma3VisionConfig

export interface LlavaOnevisionTextConfig {
  readonly hiddenSize: number
  readonly intermediateSize: number
  readonly layers: number
  readonly heads: number
  readonly kvHeads: number
  readonly vocabSize: number
  readonly maxPositions: number
  readonly ropeTheta: number
  readonly rmsNormEps: number
  readonly tieWordEmbeddings: boolean
}

export interface LlavaOnevisionConfig {
  readonly vision: LlavaOnevisionVisionConfig
  readonly text: LlavaOnevisionTextConfig
  /** The any-resolution grids [height, width] in pixels that config.json and the image processor list. */
  readonly imageGridPinpoints: ReadonlyArray<readonly [number, number]>
  readonly visionAspectRatio: string
}

export interface LlavaOnevisionVisionWeights extends SiglipTowerWeights {
  readonly config: LlavaOnevisionVisionConfig
  /** multi_modal_projector.linear_1, [vision hidden, text hidden]. */
  readonly linear1: LinearWeights
  /** multi_modal_projector.linear_2, [text hidden, text hidden]. */
  readonly linear2: LinearWeights
}

export interface LlavaOnevisionTextWeights {
  readonly config: LlavaOnevisionTextConfig
  /** [vocab, hidden]. */
  readonly embedTokens: Matrix
  readonly layers: ReadonlyArray<Qwen2DecoderLayerWeights>
  readonly norm: Float32Array
  /** [hidden, vocab]; the transposed embeddings when the config ties them. */
  readonly lmHead: Matrix
}

export interface LlavaOnevisionTokenIds {
  readonly imageTokenIndex: number
  readonly videoTokenIndex: number
  readonly bosTokenId: number
  readonly eosTokenId: number
  readonly padTokenId: number
}

export const llavaOnevisionHeadDim = (text: LlavaOnevisionTextConfig): number => text.hiddenSize / text.heads

/** The image tokens a picture takes: every patch of the tower (vision_feature_select_strategy "full"). */
export const llavaOnevisionImageTokens = (vision: LlavaOnevisionVisionConfig): number =>
  Math.floor(vision.imageSize / vision.patchSize) ** 2

/** config.json in transformers' LlavaOnevisionConfig fields, text_config a Qwen2Config. */
export const llavaOnevisionConfigJson = (config: LlavaOnevisionConfig, tokens: LlavaOnevisionTokenIds) => ({
  architectures: ["LlavaOnevisionForConditionalGeneration"],
  model_type: "llava_onevision",
  image_token_index: tokens.imageTokenIndex,
  video_token_index: tokens.videoTokenIndex,
  projector_hidden_act: "gelu",
  multimodal_projector_bias: true,
  vision_feature_layer: -1,
  vision_feature_select_strategy: "full",
  vision_aspect_ratio: config.visionAspectRatio,
  image_grid_pinpoints: config.imageGridPinpoints,
  use_image_newline_parameter: true,
  tie_word_embeddings: config.text.tieWordEmbeddings,
  torch_dtype: "float32",
  text_config: {
    model_type: "qwen2",
    architectures: ["Qwen2ForCausalLM"],
    hidden_size: config.text.hiddenSize,
    intermediate_size: config.text.intermediateSize,
    num_hidden_layers: config.text.layers,
    num_attention_heads: config.text.heads,
    num_key_value_heads: config.text.kvHeads,
    vocab_size: config.text.vocabSize,
    max_position_embeddings: config.text.maxPositions,
    rope_theta: config.text.ropeTheta,
    rms_norm_eps: config.text.rmsNormEps,
    hidden_act: "silu",
    attention_dropout: 0,
    use_sliding_window: false,
    sliding_window: null,
    max_window_layers: config.text.layers,
    use_cache: true,
    tie_word_embeddings: config.text.tieWordEmbeddings,
    torch_dtype: "float32",
    bos_token_id: tokens.bosTokenId,
    eos_token_id: tokens.eosTokenId
  },
  vision_config: siglipVisionConfigJson(config.vision)
})

export const llavaOnevisionVisionGraph = (w: LlavaOnevisionVisionWeights): Graph => {
  const size = w.config.imageSize
  const g = new Graph("vision_encoder")
  const pixelValues = g.input("pixel_values", "float32", ["batch_size", 3, size, size])
  const hiddenStates = siglipHiddenStates(g, pixelValues, w)
  const features = g.scope("multi_modal_projector", () =>
    linear(g, gelu(g, linear(g, hiddenStates, w.linear1, "linear_1")), w.linear2, "linear_2")
  )
  g.output(features, "image_features", "float32", [
    "batch_size",
    llavaOnevisionImageTokens(w.config),
    w.linear2.weight.cols
  ])
  return g
}

export const llavaOnevisionEmbedTokensGraph = (w: LlavaOnevisionTextWeights): Graph => {
  const g = new Graph("embed_tokens")
  const inputIds = g.input("input_ids", "int64", ["batch_size", "sequence_length"])
  const embeds = g.op("Gather", [matrixWeight(g, "model.embed_tokens.weight", w.embedTokens), inputIds], { axis: 0 })
  g.output(embeds, "inputs_embeds", "float32", ["batch_size", "sequence_length", w.config.hiddenSize])
  return g
}

/** Rotary cos and sin [batch, 1, sequence, head_dim] of position_ids [batch, sequence]: angles position · 1/θ^(2k/head_dim). */
const positionRotary = (g: Graph, positionIds: Value, headDim: number, theta: number) =>
  g.scope("model.rotary_emb", () => {
    const frequencies = new Float32Array(headDim)
    for (let k = 0; k < headDim / 2; k++) {
      frequencies[k] = 1 / theta ** ((2 * k) / headDim)
      frequencies[k + headDim / 2] = frequencies[k]!
    }
    const positions = g.op("Unsqueeze", [g.op("Cast", [positionIds], { to: elementType("float32") }), g.int64s([1, 3])])
    const angles = g.op("Mul", [positions, g.weight("inv_freq", "float32", [headDim], frequencies)])
    return { cos: g.op("Cos", [angles]), sin: g.op("Sin", [angles]) }
  })

export const llavaOnevisionDecoderGraph = (w: LlavaOnevisionTextWeights): Graph =>
  qwen2DecoderGraph(w, {
    dims: ["batch_size", "sequence_length"],
    rotary: (g, positionIds, headDim) => positionRotary(g, positionIds, headDim, w.config.ropeTheta)
  })

/** The three graphs by their onnx/ stem. */
export const llavaOnevisionGraphs = (
  vision: LlavaOnevisionVisionWeights,
  text: LlavaOnevisionTextWeights
): ReadonlyMap<"vision_encoder" | "embed_tokens" | "decoder_model_merged", Graph> =>
  new Map([
    ["vision_encoder", llavaOnevisionVisionGraph(vision)],
    ["embed_tokens", llavaOnevisionEmbedTokensGraph(text)],
    ["decoder_model_merged", llavaOnevisionDecoderGraph(text)]
  ])
