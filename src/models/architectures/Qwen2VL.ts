import { maskedScore } from "../onnx/Attention.js"
import { elementType, Graph, type Value } from "../onnx/Graph.js"
import { gelu, type LinearWriter, layerNorm, linear, matrixWeight } from "../onnx/Layers.js"
import type { LayerNormWeights, LinearWeights, Matrix } from "../Weights.js"
import { rotary } from "./Llama.js"
import { type Qwen2DecoderLayerWeights, qwen2DecoderGraph } from "./Qwen2Decoder.js"

/**
 * Qwen2-VL as the three graphs of the community's split export for transformers.js
 * (onnx-community/Qwen2-VL-2B-Instruct):
 *
 *   onnx/vision_encoder.onnx       pixel_values float [patches, C·T·P·P], grid_thw int64 [images, 3]
 *                                  → image_features float [patches / merge², text hidden]
 *   onnx/embed_tokens.onnx         input_ids int64 [batch, sequence] → inputs_embeds float [batch, sequence, hidden]
 *   onnx/decoder_model_merged.onnx inputs_embeds, attention_mask int64 [batch, total],
 *                                  position_ids int64 [3, batch, sequence] (M-RoPE: t, h, w),
 *                                  past_key_values.N.key/value → logits, present.N.key/value
 *
 * The vision encoder follows Qwen2VisionTransformerPretrainedModel: the Conv3d patch embedding
 * (kernel = stride, no bias) is the linear map over the flattened C·T·P·P patch the processor
 * writes; 2D rotary angles come from each patch's (row, column) in its image, worked out inside the
 * graph from grid_thw and the processor's 2×2 merge-block order; attention is confined to one
 * temporal frame of one image (transformers' cu_seqlens), so several images in one call are
 * encoded as they would be alone; the patch merger joins each merge² run of rows.
 *
 * The decoder is Qwen2 (Llama with biases on q, k and v) with multimodal rotary positions: each
 * rotary frequency takes its angle from the t, h or w row of position_ids by `mrope_section`, as
 * transformers' apply_multimodal_rotary_pos_emb does.
 */

export interface Qwen2VLVisionConfig {
  readonly depth: number
  readonly embedDim: number
  readonly heads: number
  readonly mlpRatio: number
  readonly inChannels: number
  readonly patchSize: number
  readonly temporalPatchSize: number
  readonly spatialMergeSize: number
}

export interface Qwen2VLTextConfig {
  readonly hiddenSize: number
  readonly intermediateSize: number
  readonly layers: number
  readonly heads: number
  readonly kvHeads: number
  readonly vocabSize: number
  readonly maxPositions: number
  readonly ropeTheta: number
  readonly rmsNormEps: number
  /** Rotary frequencies given to the t, h and w positions; they sum to head_dim / 2. */
  readonly mropeSection: readonly [number, number, number]
  readonly tieWordEmbeddings: boolean
}

export interface Qwen2VLConfig {
  readonly vision: Qwen2VLVisionConfig
  readonly text: Qwen2VLTextConfig
}

export interface Qwen2VLVisionBlockWeights {
  readonly norm1: LayerNormWeights
  /** [embed, 3·embed]: the columns are q, k, v, each heads × head_dim. */
  readonly qkv: LinearWeights
  readonly proj: LinearWeights
  readonly norm2: LayerNormWeights
  readonly fc1: LinearWeights
  readonly fc2: LinearWeights
}

export interface Qwen2VLVisionWeights {
  readonly config: Qwen2VLVisionConfig
  /** [C·T·P·P, embed]: the Conv3d kernel [embed, C, T, P, P] flattened and transposed. */
  readonly patchEmbed: Matrix
  readonly blocks: ReadonlyArray<Qwen2VLVisionBlockWeights>
  readonly merger: {
    readonly norm: LayerNormWeights
    /** [embed·merge², embed·merge²]. */
    readonly fc1: LinearWeights
    /** [embed·merge², text hidden]. */
    readonly fc2: LinearWeights
  }
}

export interface Qwen2VLTextWeights {
  readonly config: Qwen2VLTextConfig
  /** [vocab, hidden]. */
  readonly embedTokens: Matrix
  readonly layers: ReadonlyArray<Qwen2DecoderLayerWeights>
  readonly norm: Float32Array
  /** [hidden, vocab]; the transposed embeddings when the config ties them. */
  readonly lmHead: Matrix
}

/**
 * What the vision graph reads of a tower's weights: its blocks may come one at a time (a tower of
 * gigabytes drawn block by block).
 */
export type Qwen2VLVisionGraphWeights = Omit<Qwen2VLVisionWeights, "blocks"> & {
  readonly blocks: Iterable<Qwen2VLVisionBlockWeights>
}

/** The vision tower's rotary base (VisionRotaryEmbedding's theta). */
export const visionRopeTheta = 10000

export const visionHeadDim = (config: Qwen2VLVisionConfig): number => config.embedDim / config.heads
export const textHeadDim = (config: Qwen2VLTextConfig): number => config.hiddenSize / config.heads

/** The language model's fields of config.json (top level in Qwen2-VL's, text_config in newer Qwen2.5-VL's). */
export const qwen2VLTextConfigJson = (text: Qwen2VLTextConfig) => ({
  hidden_size: text.hiddenSize,
  intermediate_size: text.intermediateSize,
  num_hidden_layers: text.layers,
  num_attention_heads: text.heads,
  num_key_value_heads: text.kvHeads,
  vocab_size: text.vocabSize,
  max_position_embeddings: text.maxPositions,
  rope_theta: text.ropeTheta,
  rms_norm_eps: text.rmsNormEps,
  rope_scaling: { type: "mrope", mrope_section: [...text.mropeSection] },
  tie_word_embeddings: text.tieWordEmbeddings
})

/** config.json in transformers' Qwen2VLConfig fields (flat: the text model's fields at the top level). */
export const qwen2VLConfigJson = (
  config: Qwen2VLConfig,
  tokens: {
    readonly imageTokenId: number
    readonly videoTokenId: number
    readonly visionStartTokenId: number
    readonly visionEndTokenId: number
    readonly visionTokenId: number
    readonly bosTokenId: number
    readonly eosTokenId: number
  },
  extra: Record<string, unknown> = {}
) => ({
  architectures: ["Qwen2VLForConditionalGeneration"],
  model_type: "qwen2_vl",
  ...qwen2VLTextConfigJson(config.text),
  hidden_act: "silu",
  use_cache: true,
  use_sliding_window: false,
  torch_dtype: "float32",
  bos_token_id: tokens.bosTokenId,
  eos_token_id: tokens.eosTokenId,
  image_token_id: tokens.imageTokenId,
  video_token_id: tokens.videoTokenId,
  vision_start_token_id: tokens.visionStartTokenId,
  vision_end_token_id: tokens.visionEndTokenId,
  vision_token_id: tokens.visionTokenId,
  vision_config: {
    depth: config.vision.depth,
    embed_dim: config.vision.embedDim,
    mlp_ratio: config.vision.mlpRatio,
    num_heads: config.vision.heads,
    in_chans: config.vision.inChannels,
    hidden_size: config.text.hiddenSize,
    hidden_act: "quick_gelu",
    patch_size: config.vision.patchSize,
    spatial_merge_size: config.vision.spatialMergeSize,
    temporal_patch_size: config.vision.temporalPatchSize
  },
  ...extra
})

/** Per-frequency angles of one axis: 1/θ^(2k/dim) for k < dim/2. */
const inverseFrequencies = (dim: number, theta: number): Float32Array =>
  Float32Array.from({ length: dim / 2 }, (_, k) => 1 / theta ** ((2 * k) / dim))

/**
 * The vision rotary weights of the row and column axes, [head_dim] each: the angle of a patch at
 * (row, column) is row·rows + column·columns, laid out as transformers'
 * cat(rotary_pos_emb, rotary_pos_emb) of the flattened (row frequencies, column frequencies).
 */
export const visionRotaryAxes = (
  config: Qwen2VLVisionConfig
): { readonly rows: Float32Array; readonly columns: Float32Array } => {
  const headDim = visionHeadDim(config)
  const frequencies = inverseFrequencies(headDim / 2, visionRopeTheta)
  const quarter = frequencies.length
  const rows = new Float32Array(headDim)
  const columns = new Float32Array(headDim)
  for (const half of [0, headDim / 2]) {
    rows.set(frequencies, half)
    columns.set(frequencies, half + quarter)
  }
  return { rows, columns }
}

/** x · sigmoid(1.702 x), the vision MLP's activation. */
const quickGelu = (g: Graph, x: Value): Value =>
  g.op("Mul", [x, g.op("Sigmoid", [g.op("Mul", [x, g.floatScalar(1.702)])])])

const int64 = (g: Graph, x: Value) => g.op("Cast", [x], { to: elementType("int64") })
const toFloat = (g: Graph, x: Value) => g.op("Cast", [x], { to: elementType("float32") })

/**
 * Each patch's place, from grid_thw (image_grid_thw) and the processor's order (image, frame, merge block
 * row, merge block column, row in block, column in block): its row and column in its frame, its
 * image's patch rows and columns (Qwen3-VL interpolates its learned positions over them), and the index of its frame's first patch, which names the frame
 * for attention.
 */
export const patchPlaces = (g: Graph, pixelValues: Value, gridThw: Value, mergeSize: number) =>
  g.scope("patch_places", () => {
    const patchCount = g.op("Gather", [g.op("Shape", [pixelValues]), g.int64Scalar(0)], { axis: 0 })
    const patch = g.op("Range", [g.int64Scalar(0), patchCount, g.int64Scalar(1)])
    const field = (axis: number) => g.op("Gather", [gridThw, g.int64Scalar(axis)], { axis: 1 })
    const [frames, rows, columns] = [field(0), field(1), field(2)]
    const frameSizes = g.op("Mul", [rows, columns])
    const ends = g.op("CumSum", [g.op("Mul", [frames, frameSizes]), g.int64Scalar(0)])
    const starts = g.op("Sub", [ends, g.op("Mul", [frames, frameSizes])])
    const past = g.op("GreaterOrEqual", [
      g.op("Unsqueeze", [patch, g.int64s([1])]),
      g.op("Unsqueeze", [ends, g.int64s([0])])
    ])
    const image = g.op("ReduceSum", [int64(g, past), g.int64s([1])], { keepdims: 0 })
    const ofImage = (values: Value) => g.op("Gather", [values, image], { axis: 0 })
    const local = g.op("Sub", [patch, ofImage(starts)])
    const inFrame = g.op("Mod", [local, ofImage(frameSizes)])
    const imageRows = ofImage(rows)
    const imageColumns = ofImage(columns)
    const s = g.int64Scalar(mergeSize)
    const blocksPerRow = g.op("Div", [imageColumns, s])
    const block = g.op("Div", [inFrame, g.int64Scalar(mergeSize * mergeSize)])
    const rowInBlock = g.op("Mod", [g.op("Div", [inFrame, s]), s])
    const columnInBlock = g.op("Mod", [inFrame, s])
    return {
      row: g.op("Add", [g.op("Mul", [g.op("Div", [block, blocksPerRow]), s]), rowInBlock]),
      column: g.op("Add", [g.op("Mul", [g.op("Mod", [block, blocksPerRow]), s]), columnInBlock]),
      imageRows,
      imageColumns,
      frameStart: g.op("Sub", [patch, inFrame])
    }
  })

/** A vision block's rotary tables and its mask of patches of one frame. */
export interface FrameRope {
  readonly cos: Value
  readonly sin: Value
  readonly mask: Value
}

/**
 * A Qwen-VL vision block's attention: the pre-norm, one qkv projection, 2D rotary queries and keys,
 * attention within each frame (the mask), the heads merged and projected. Qwen2-VL's and
 * Qwen3-VL's towers share it; their MLPs differ.
 */
export const frameAttention = (
  g: Graph,
  x: Value,
  w: { readonly norm1: LayerNormWeights; readonly qkv: LinearWeights; readonly proj: LinearWeights },
  shape: { readonly heads: number; readonly headDim: number; readonly width: number },
  rope: FrameRope
): Value =>
  g.scope("attn", () => {
    const { heads, headDim, width } = shape
    const qkv = linear(g, layerNorm(g, x, w.norm1, "norm1"), w.qkv, "qkv")
    // [patches, 3, heads, head_dim] → [3, heads, patches, head_dim]
    const split = g.op("Transpose", [g.op("Reshape", [qkv, g.int64s([0, 3, heads, headDim])])], {
      perm: [1, 2, 0, 3]
    })
    const part = (index: number) => g.op("Gather", [split, g.int64Scalar(index)], { axis: 0 })
    const query = rotary(g, part(0), rope.cos, rope.sin, headDim)
    const key = rotary(g, part(1), rope.cos, rope.sin, headDim)
    const keyT = g.op("Transpose", [key], { perm: [0, 2, 1] })
    const scores = g.op("Mul", [g.op("MatMul", [query, keyT]), g.floatScalar(1 / Math.sqrt(headDim))])
    const weights = g.op("Softmax", [g.op("Where", [rope.mask, scores, g.floatScalar(maskedScore)])], { axis: -1 })
    const merged = g.op("Reshape", [
      g.op("Transpose", [g.op("MatMul", [weights, part(2)])], { perm: [1, 0, 2] }),
      g.int64s([0, width])
    ])
    return linear(g, merged, w.proj, "proj")
  })

const visionBlock = (
  g: Graph,
  x: Value,
  w: Qwen2VLVisionBlockWeights,
  config: Qwen2VLVisionConfig,
  rope: FrameRope,
  name: string
): Value =>
  g.scope(name, () => {
    const shape = { heads: config.heads, headDim: visionHeadDim(config), width: config.embedDim }
    const afterAttention = g.op("Add", [x, frameAttention(g, x, w, shape, rope)])
    const mlp = g.scope("mlp", () =>
      linear(g, quickGelu(g, linear(g, layerNorm(g, afterAttention, w.norm2, "norm2"), w.fc1, "fc1")), w.fc2, "fc2")
    )
    return g.op("Add", [afterAttention, mlp])
  })

/** The vision encoder's grid input: grid_thw in Qwen2-VL's export, image_grid_thw in Qwen2.5-VL's. */
export type Qwen2VLGridInput = "grid_thw" | "image_grid_thw"

export const qwen2VLVisionGraph = (w: Qwen2VLVisionGraphWeights, gridInput: Qwen2VLGridInput = "grid_thw"): Graph => {
  const { config } = w
  const patchWidth = config.inChannels * config.temporalPatchSize * config.patchSize ** 2
  const merge = config.spatialMergeSize ** 2
  const g = new Graph("vision_encoder")
  const pixelValues = g.input("pixel_values", "float32", ["num_patches", patchWidth])
  const gridThw = g.input(gridInput, "int64", ["num_images", 3])

  const places = patchPlaces(g, pixelValues, gridThw, config.spatialMergeSize)
  const rope = g.scope("rotary_pos_emb", () => {
    const axes = visionRotaryAxes(config)
    const headDim = visionHeadDim(config)
    const angle = (position: Value, name: string, frequencies: Float32Array) =>
      g.op("Mul", [
        g.op("Unsqueeze", [toFloat(g, position), g.int64s([1])]),
        g.weight(name, "float32", [headDim], frequencies)
      ])
    const angles = g.op("Add", [angle(places.row, "rows", axes.rows), angle(places.column, "columns", axes.columns)])
    const mask = g.op("Equal", [
      g.op("Unsqueeze", [places.frameStart, g.int64s([1])]),
      g.op("Unsqueeze", [places.frameStart, g.int64s([0])])
    ])
    return { cos: g.op("Cos", [angles]), sin: g.op("Sin", [angles]), mask }
  })

  let x = g.scope("patch_embed.proj", () => g.op("MatMul", [pixelValues, matrixWeight(g, "weight", w.patchEmbed)]))
  let i = 0
  for (const block of w.blocks) x = visionBlock(g, x, block, config, rope, `blocks.${i++}`)
  if (i !== config.depth) throw new Error(`the vision tower's config has ${config.depth} blocks, its weights ${i}`)
  const features = g.scope("merger", () => {
    const grouped = g.op("Reshape", [layerNorm(g, x, w.merger.norm, "ln_q"), g.int64s([-1, config.embedDim * merge])])
    return linear(g, gelu(g, linear(g, grouped, w.merger.fc1, "mlp.0")), w.merger.fc2, "mlp.2")
  })
  g.output(features, "image_features", "float32", ["num_image_tokens", w.merger.fc2.weight.cols])
  return g
}

export const qwen2VLEmbedTokensGraph = (w: Pick<Qwen2VLTextWeights, "config" | "embedTokens">): Graph => {
  const g = new Graph("embed_tokens")
  const inputIds = g.input("input_ids", "int64", ["batch_size", "sequence_length"])
  const embeds = g.op("Gather", [matrixWeight(g, "model.embed_tokens.weight", w.embedTokens), inputIds], { axis: 0 })
  g.output(embeds, "inputs_embeds", "float32", ["batch_size", "sequence_length", w.config.hiddenSize])
  return g
}

/**
 * Multimodal rotary positions' cos and sin, [batch, 1, sequence, head_dim]: the angles of each
 * position axis (t, h, w rows of position_ids [3, batch, sequence]), and for each rotary frequency
 * k (of head_dim / 2) those of the axis `axisOf[k]` names, both halves alike. Qwen2-VL's M-RoPE
 * gives each axis a run of frequencies (mrope_section), Qwen3-VL's interleaves them.
 */
export const selectedAxesRotary = (
  g: Graph,
  positionIds: Value,
  headDim: number,
  theta: number,
  axisOf: ReadonlyArray<number>
) =>
  g.scope("rotary_emb", () => {
    const half = headDim / 2
    const frequencies = inverseFrequencies(headDim, theta)
    const both = new Float32Array(headDim)
    both.set(frequencies, 0)
    both.set(frequencies, half)
    const selection = new Float32Array(3 * headDim)
    axisOf.forEach((axis, k) => {
      selection[axis * headDim + k] = 1
      selection[axis * headDim + half + k] = 1
    })
    // [3, batch, sequence, 1] · [head_dim] → [3, batch, sequence, head_dim], then each frequency's axis.
    const perAxis = g.op("Mul", [
      g.op("Unsqueeze", [toFloat(g, positionIds), g.int64s([3])]),
      g.weight("inv_freq", "float32", [headDim], both)
    ])
    const chosen = g.op("Mul", [perAxis, g.weight("mrope_selection", "float32", [3, 1, 1, headDim], selection)])
    const angles = g.op("Unsqueeze", [g.op("ReduceSum", [chosen, g.int64s([0])], { keepdims: 0 }), g.int64s([1])])
    return { cos: g.op("Cos", [angles]), sin: g.op("Sin", [angles]) }
  })

/** M-RoPE: each axis takes the run of frequencies its mrope_section chunk names. */
const multimodalRotary = (g: Graph, positionIds: Value, config: Qwen2VLTextConfig) => {
  const headDim = textHeadDim(config)
  const sectionTotal = config.mropeSection.reduce((a, b) => a + b, 0)
  if (sectionTotal !== headDim / 2) {
    throw new Error(
      `mrope_section [${config.mropeSection.join(", ")}] sums to ${sectionTotal}, not head_dim / 2 = ${headDim / 2}`
    )
  }
  const axisOf = config.mropeSection.flatMap((width, axis) => Array.from({ length: width }, () => axis))
  return selectedAxesRotary(g, positionIds, headDim, config.ropeTheta, axisOf)
}

export const qwen2VLDecoderGraph = (
  w: Omit<Qwen2VLTextWeights, "layers"> & { readonly layers: Iterable<Qwen2DecoderLayerWeights> },
  quantized?: LinearWriter
): Graph =>
  qwen2DecoderGraph(
    w,
    {
      dims: [3, "batch_size", "sequence_length"],
      rotary: (g, positionIds) => multimodalRotary(g, positionIds, w.config)
    },
    quantized
  )

/** The three graphs by their onnx/ stem. */
export const qwen2VLGraphs = (
  vision: Qwen2VLVisionWeights,
  text: Qwen2VLTextWeights,
  gridInput: Qwen2VLGridInput = "grid_thw"
): ReadonlyMap<"vision_encoder" | "embed_tokens" | "decoder_model_merged", Graph> =>
  new Map([
    ["vision_encoder", qwen2VLVisionGraph(vision, gridInput)],
    ["embed_tokens", qwen2VLEmbedTokensGraph(text)],
    ["decoder_model_merged", qwen2VLDecoderGraph(text)]
  ])
