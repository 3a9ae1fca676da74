import { elementType, Graph, type Value } from "../onnx/Graph.js"
import { gelu, geluTanh, layerNorm, linear, matrixWeight } from "../onnx/Layers.js"
import type { LayerNormWeights, LinearWeights, Matrix } from "../Weights.js"
import { qwen2DecoderGraph } from "./Qwen2Decoder.js"
import { type FrameRope, frameAttention, patchPlaces, selectedAxesRotary } from "./Qwen2VL.js"

/**
 * Qwen3-VL as the three graphs of the community's split export for transformers.js
 * (onnx-community/Qwen3-VL-2B-Instruct-ONNX), under Qwen2.5-VL's names, which transformers.js's
 * Qwen3VLForConditionalGeneration (a Qwen2_5_VLForConditionalGeneration) feeds and reads:
 *
 *   onnx/vision_encoder.onnx       pixel_values float [patches, C·T·P·P], image_grid_thw int64 [images, 3]
 *                                  → image_features float [patches / merge², text hidden]
 *   onnx/embed_tokens.onnx         input_ids int64 [batch, sequence] → inputs_embeds float [batch, sequence, hidden]
 *   onnx/decoder_model_merged.onnx inputs_embeds, attention_mask int64 [batch, total],
 *                                  position_ids int64 [3, batch, sequence] (M-RoPE: t, h, w),
 *                                  past_key_values.N.key/value → logits, present.N.key/value
 *
 * The vision encoder follows transformers' Qwen3VLVisionModel: the Conv3d patch embedding (with a
 * bias) as a linear map over the flattened C·T·P·P patch; learned position embeddings on a
 * side × side grid (num_position_embeddings = side²) interpolated bilinearly to each image's patch
 * grid (fast_pos_embed_interpolate: linspace(0, side − 1, rows) by linspace(0, side − 1, columns)),
 * worked out in the graph from image_grid_thw for each patch's row and column; the 2D rotary
 * angles of Qwen2-VL's tower; attention within one frame of one image (cu_seqlens), no window
 * attention; blocks with a gelu_pytorch_tanh MLP; the patch merger (LayerNorm before the merge²
 * rows are joined, GELU between its two linear maps).
 *
 * The decoder is Qwen3 (RMSNorm of each head's query and key before rotary positions, no biases,
 * head_dim of its own) with interleaved M-RoPE: rotary frequency k takes its angle from the h
 * row of position_ids when k mod 3 = 1 and k < 3·mrope_section[1], from the w row when k mod 3 = 2
 * and k < 3·mrope_section[2], else from the t row (transformers' apply_interleaved_mrope).
 *
 * Deepstack is left out, as the community export leaves it out: transformers' Qwen3-VL adds the
 * outputs of extra patch mergers (use_postshuffle_norm: the LayerNorm after the merge) at the
 * vision blocks of deepstack_visual_indexes to the hidden states at the image tokens after the
 * first len(deepstack_visual_indexes) decoder layers, and the export's decoder takes no such input
 * (transformers.js passes none). Serving it would need an export whose vision encoder answers
 * those features too (deepstack_features [indexes, image tokens, text hidden]) and whose decoder
 * takes them with a mask of the image positions (visual_pos_masks); the runner would then carry
 * them beside the image's rows, through the sidecar with fission. The fixture's config.json says
 * deepstack_visual_indexes: [], the Qwen3-VL these graphs compute exactly.
 */

export interface Qwen3VLVisionConfig {
  readonly depth: number
  readonly hiddenSize: number
  readonly heads: number
  readonly intermediateSize: number
  readonly inChannels: number
  readonly patchSize: number
  readonly temporalPatchSize: number
  readonly spatialMergeSize: number
  /** The text model's width, what the merger gives. */
  readonly outHiddenSize: number
  /** The learned position grid's size: a square of side √num_position_embeddings. */
  readonly numPositionEmbeddings: number
}

export interface Qwen3VLTextConfig {
  readonly hiddenSize: number
  readonly intermediateSize: number
  readonly layers: number
  readonly heads: number
  readonly kvHeads: number
  readonly headDim: number
  readonly vocabSize: number
  readonly maxPositions: number
  readonly ropeTheta: number
  readonly rmsNormEps: number
  /** Rotary frequencies given to the t, h and w positions, interleaved; they sum to head_dim / 2. */
  readonly mropeSection: readonly [number, number, number]
  readonly tieWordEmbeddings: boolean
}

export interface Qwen3VLConfig {
  readonly vision: Qwen3VLVisionConfig
  readonly text: Qwen3VLTextConfig
}

export interface Qwen3VLVisionBlockWeights {
  readonly norm1: LayerNormWeights
  /** [hidden, 3·hidden]: the columns are q, k, v, each heads × head_dim. */
  readonly qkv: LinearWeights
  readonly proj: LinearWeights
  readonly norm2: LayerNormWeights
  readonly fc1: LinearWeights
  readonly fc2: LinearWeights
}

export interface Qwen3VLVisionWeights {
  readonly config: Qwen3VLVisionConfig
  /** [C·T·P·P, hidden] with its bias: the Conv3d kernel [hidden, C, T, P, P] flattened and transposed. */
  readonly patchEmbed: LinearWeights
  /** [num_position_embeddings, hidden], row-major over the side × side grid. */
  readonly posEmbed: Matrix
  readonly blocks: ReadonlyArray<Qwen3VLVisionBlockWeights>
  readonly merger: {
    /** Over one patch's hidden, before the merge. */
    readonly norm: LayerNormWeights
    /** [hidden·merge², hidden·merge²]. */
    readonly fc1: LinearWeights
    /** [hidden·merge², out hidden]. */
    readonly fc2: LinearWeights
  }
}

export interface Qwen3DecoderLayerWeights {
  readonly inputNorm: Float32Array
  readonly q: LinearWeights
  readonly k: LinearWeights
  readonly v: LinearWeights
  readonly o: LinearWeights
  /** [head_dim]: RMSNorm of each head's query, and key. */
  readonly qNorm: Float32Array
  readonly kNorm: Float32Array
  readonly postNorm: Float32Array
  readonly gate: LinearWeights
  readonly up: LinearWeights
  readonly down: LinearWeights
}

export interface Qwen3VLTextWeights {
  readonly config: Qwen3VLTextConfig
  /** [vocab, hidden]. */
  readonly embedTokens: Matrix
  readonly layers: ReadonlyArray<Qwen3DecoderLayerWeights>
  readonly norm: Float32Array
  /** [hidden, vocab]; the transposed embeddings when the config ties them. */
  readonly lmHead: Matrix
}

/** The vision tower's rotary base (Qwen3VLVisionRotaryEmbedding's theta). */
export const qwen3VLVisionRopeTheta = 10000

export const qwen3VLVisionHeadDim = (config: Qwen3VLVisionConfig): number => config.hiddenSize / config.heads

/** The side of the learned position grid; num_position_embeddings must be a square. */
export const positionGridSide = (config: Qwen3VLVisionConfig): number => {
  const side = Math.round(Math.sqrt(config.numPositionEmbeddings))
  if (side * side !== config.numPositionEmbeddings)
    throw new Error(`num_position_embeddings ${config.numPositionEmbeddings} is not a square`)
  return side
}

/**
 * For each rotary frequency of the text head (head_dim / 2 of them), the position axis it takes its
 * angle from (0 t, 1 h, 2 w), as apply_interleaved_mrope assigns them.
 */
export const interleavedMropeAxes = (config: Qwen3VLTextConfig): Array<0 | 1 | 2> => {
  const half = config.headDim / 2
  const [, heights, widths] = config.mropeSection
  const total = config.mropeSection.reduce((a, b) => a + b, 0)
  if (total !== half) {
    throw new Error(`mrope_section [${config.mropeSection.join(", ")}] sums to ${total}, not head_dim / 2 = ${half}`)
  }
  return Array.from({ length: half }, (_, k) =>
    k % 3 === 1 && k < 3 * heights ? 1 : k % 3 === 2 && k < 3 * widths ? 2 : 0
  )
}

/** config.json's text_config in transformers' Qwen3VLTextConfig fields. */
export const qwen3VLTextConfigJson = (text: Qwen3VLTextConfig) => ({
  model_type: "qwen3_vl_text",
  hidden_size: text.hiddenSize,
  intermediate_size: text.intermediateSize,
  num_hidden_layers: text.layers,
  num_attention_heads: text.heads,
  num_key_value_heads: text.kvHeads,
  head_dim: text.headDim,
  vocab_size: text.vocabSize,
  max_position_embeddings: text.maxPositions,
  rope_theta: text.ropeTheta,
  rms_norm_eps: text.rmsNormEps,
  rope_scaling: { rope_type: "default", mrope_section: [...text.mropeSection], mrope_interleaved: true },
  attention_bias: false,
  hidden_act: "silu",
  tie_word_embeddings: text.tieWordEmbeddings,
  torch_dtype: "float32"
})

/** config.json in transformers' Qwen3VLConfig fields: text_config and vision_config nested. */
export const qwen3VLConfigJson = (
  config: Qwen3VLConfig,
  tokens: {
    readonly imageTokenId: number
    readonly videoTokenId: number
    readonly visionStartTokenId: number
    readonly visionEndTokenId: number
    readonly bosTokenId: number
    readonly eosTokenId: number
  }
) => ({
  architectures: ["Qwen3VLForConditionalGeneration"],
  model_type: "qwen3_vl",
  text_config: {
    ...qwen3VLTextConfigJson(config.text),
    bos_token_id: tokens.bosTokenId,
    eos_token_id: tokens.eosTokenId
  },
  vision_config: {
    model_type: "qwen3_vl",
    depth: config.vision.depth,
    hidden_size: config.vision.hiddenSize,
    hidden_act: "gelu_pytorch_tanh",
    intermediate_size: config.vision.intermediateSize,
    num_heads: config.vision.heads,
    in_channels: config.vision.inChannels,
    patch_size: config.vision.patchSize,
    spatial_merge_size: config.vision.spatialMergeSize,
    temporal_patch_size: config.vision.temporalPatchSize,
    out_hidden_size: config.vision.outHiddenSize,
    num_position_embeddings: config.vision.numPositionEmbeddings,
    deepstack_visual_indexes: []
  },
  image_token_id: tokens.imageTokenId,
  video_token_id: tokens.videoTokenId,
  vision_start_token_id: tokens.visionStartTokenId,
  vision_end_token_id: tokens.visionEndTokenId,
  tie_word_embeddings: config.text.tieWordEmbeddings,
  torch_dtype: "float32"
})

/** Per-frequency angles of one axis: 1/θ^(2k/dim) for k < dim/2. */
const inverseFrequencies = (dim: number, theta: number): Float32Array =>
  Float32Array.from({ length: dim / 2 }, (_, k) => 1 / theta ** ((2 * k) / dim))

const toFloat = (g: Graph, x: Value) => g.op("Cast", [x], { to: elementType("float32") })

/**
 * The learned position embedding of each patch, [patches, hidden]: the grid of side × side rows
 * read bilinearly at (row·(side − 1)/(rows − 1), column·(side − 1)/(columns − 1)), each
 * coordinate's floor and fraction computed in integers, the ceiling clipped to the grid.
 */
const interpolatedPositions = (g: Graph, places: ReturnType<typeof patchPlaces>, w: Qwen3VLVisionWeights): Value =>
  g.scope("pos_embed", () => {
    const side = positionGridSide(w.config)
    const table = matrixWeight(g, "weight", w.posEmbed)
    const axis = (at: Value, count: Value) => {
      const span = g.op("Max", [g.op("Sub", [count, g.int64Scalar(1)]), g.int64Scalar(1)])
      const scaled = g.op("Mul", [at, g.int64Scalar(side - 1)])
      const floor = g.op("Div", [scaled, span])
      const fraction = g.op("Div", [toFloat(g, g.op("Mod", [scaled, span])), toFloat(g, span)])
      const ceil = g.op("Min", [g.op("Add", [floor, g.int64Scalar(1)]), g.int64Scalar(side - 1)])
      return { floor, ceil, fraction, rest: g.op("Sub", [g.floatScalar(1), fraction]) }
    }
    const y = axis(places.row, places.imageRows)
    const x = axis(places.column, places.imageColumns)
    const corner = (row: Value, column: Value, weight: Value) =>
      g.op("Mul", [
        g.op("Gather", [table, g.op("Add", [g.op("Mul", [row, g.int64Scalar(side)]), column])], { axis: 0 }),
        g.op("Unsqueeze", [weight, g.int64s([1])])
      ])
    const sum = (values: ReadonlyArray<Value>) => values.reduce((a, b) => g.op("Add", [a, b]))
    return sum([
      corner(y.floor, x.floor, g.op("Mul", [y.rest, x.rest])),
      corner(y.floor, x.ceil, g.op("Mul", [y.rest, x.fraction])),
      corner(y.ceil, x.floor, g.op("Mul", [y.fraction, x.rest])),
      corner(y.ceil, x.ceil, g.op("Mul", [y.fraction, x.fraction]))
    ])
  })

/**
 * The vision tower's rotary cos and sin, [patches, head_dim]: a patch at (row, column) turns by
 * row·f and column·f for the head_dim / 4 frequencies f of Qwen3VLVisionRotaryEmbedding(head_dim / 2),
 * laid out (row angles, column angles) twice, as rot_pos_emb and cat(emb, emb) do.
 */
const visionRotary = (g: Graph, places: ReturnType<typeof patchPlaces>, config: Qwen3VLVisionConfig) =>
  g.scope("rotary_pos_emb", () => {
    const headDim = qwen3VLVisionHeadDim(config)
    const frequencies = inverseFrequencies(headDim / 2, qwen3VLVisionRopeTheta)
    const quarter = frequencies.length
    const rows = new Float32Array(headDim)
    const columns = new Float32Array(headDim)
    for (const half of [0, headDim / 2]) {
      rows.set(frequencies, half)
      columns.set(frequencies, half + quarter)
    }
    const angle = (position: Value, name: string, perAxis: Float32Array) =>
      g.op("Mul", [
        g.op("Unsqueeze", [toFloat(g, position), g.int64s([1])]),
        g.weight(name, "float32", [headDim], perAxis)
      ])
    const angles = g.op("Add", [angle(places.row, "rows", rows), angle(places.column, "columns", columns)])
    return { cos: g.op("Cos", [angles]), sin: g.op("Sin", [angles]) }
  })

const visionBlock = (
  g: Graph,
  x: Value,
  w: Qwen3VLVisionBlockWeights,
  config: Qwen3VLVisionConfig,
  rope: FrameRope,
  name: string
): Value =>
  g.scope(name, () => {
    const shape = { heads: config.heads, headDim: qwen3VLVisionHeadDim(config), width: config.hiddenSize }
    const afterAttention = g.op("Add", [x, frameAttention(g, x, w, shape, rope)])
    const mlp = g.scope("mlp", () =>
      linear(
        g,
        geluTanh(g, linear(g, layerNorm(g, afterAttention, w.norm2, "norm2"), w.fc1, "linear_fc1")),
        w.fc2,
        "linear_fc2"
      )
    )
    return g.op("Add", [afterAttention, mlp])
  })

export const qwen3VLVisionGraph = (w: Qwen3VLVisionWeights): Graph => {
  const { config } = w
  const patchWidth = config.inChannels * config.temporalPatchSize * config.patchSize ** 2
  const merge = config.spatialMergeSize ** 2
  const g = new Graph("vision_encoder")
  const pixelValues = g.input("pixel_values", "float32", ["num_patches", patchWidth])
  const gridThw = g.input("image_grid_thw", "int64", ["num_images", 3])

  const places = patchPlaces(g, pixelValues, gridThw, config.spatialMergeSize)
  const { cos, sin } = visionRotary(g, places, config)
  const mask = g.op("Equal", [
    g.op("Unsqueeze", [places.frameStart, g.int64s([1])]),
    g.op("Unsqueeze", [places.frameStart, g.int64s([0])])
  ])
  const patches = linear(g, pixelValues, w.patchEmbed, "patch_embed.proj")
  let x = g.op("Add", [patches, interpolatedPositions(g, places, w)])
  w.blocks.forEach((block, i) => {
    x = visionBlock(g, x, block, config, { cos, sin, mask }, `blocks.${i}`)
  })
  const features = g.scope("merger", () => {
    const grouped = g.op("Reshape", [layerNorm(g, x, w.merger.norm, "norm"), g.int64s([-1, config.hiddenSize * merge])])
    return linear(g, gelu(g, linear(g, grouped, w.merger.fc1, "linear_fc1")), w.merger.fc2, "linear_fc2")
  })
  g.output(features, "image_features", "float32", ["num_image_tokens", config.outHiddenSize])
  return g
}

export const qwen3VLEmbedTokensGraph = (w: Qwen3VLTextWeights): Graph => {
  const g = new Graph("embed_tokens")
  const inputIds = g.input("input_ids", "int64", ["batch_size", "sequence_length"])
  const embeds = g.op("Gather", [matrixWeight(g, "model.embed_tokens.weight", w.embedTokens), inputIds], { axis: 0 })
  g.output(embeds, "inputs_embeds", "float32", ["batch_size", "sequence_length", w.config.hiddenSize])
  return g
}

/** Interleaved M-RoPE: each rotary frequency takes the axis `interleavedMropeAxes` gives it. */
const interleavedRotary = (g: Graph, positionIds: Value, config: Qwen3VLTextConfig) =>
  selectedAxesRotary(g, positionIds, config.headDim, config.ropeTheta, interleavedMropeAxes(config))

export const qwen3VLDecoderGraph = (w: Qwen3VLTextWeights): Graph =>
  qwen2DecoderGraph(w, {
    dims: [3, "batch_size", "sequence_length"],
    rotary: (g, positionIds) => interleavedRotary(g, positionIds, w.config)
  })

/** The three graphs by their onnx/ stem. */
export const qwen3VLGraphs = (
  vision: Qwen3VLVisionWeights,
  text: Qwen3VLTextWeights
): ReadonlyMap<"vision_encoder" | "embed_tokens" | "decoder_model_merged", Graph> =>
  new Map([
    ["vision_encoder", qwen3VLVisionGraph(vision)],
    ["embed_tokens", qwen3VLEmbedTokensGraph(text)],
    ["decoder_model_merged", qwen3VLDecoderGraph(text)]
  ])
