import type { Dtype } from "../Dtype.js"
import { halvesOf } from "../Float16.js"
import { causalMask, maskedScore } from "../onnx/Attention.js"
import { type DataType, type Dim, elementType, type Graph, microsoftDomain, type Value } from "../onnx/Graph.js"
import { Random } from "../Random.js"

/**
 * A Llama-family decoder (RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP: Llama 2
 * and 3, SmolLM, Qwen2 without biases) as ONNX graphs with the input and output names of the
 * community's exports for transformers.js, in either layout:
 *
 * - decoder-only: `onnx/model.onnx` (input_ids, attention_mask, [position_ids],
 *   past_key_values.N.key/value → logits, present.N.key/value), what text LLMs ship;
 * - split: `onnx/embed_tokens.onnx` (input_ids → inputs_embeds) and
 *   `onnx/decoder_model_merged.onnx` taking inputs_embeds, what VLMs ship so that image features
 *   can be spliced into the prompt's embeddings.
 *
 * Weights are seeded random numbers stored at the export's dtype (fp32, fp16, 8-bit with
 * MatMulInteger, 4-bit with MatMulNBits or MatMulBnb4), so every precision the community publishes
 * has a graph of the same operators to test and measure against.
 */

export interface LlamaConfig {
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
}

export type LlamaLayout = "decoder-only" | "split"

export interface LlamaExport {
  readonly layout: LlamaLayout
  readonly dtype: Dtype
  /** Whether the decoder takes position_ids (otherwise it derives them from attention_mask). */
  readonly positionIds: boolean
  /** The names of the cache inputs and outputs: `past_key_values.N.key` → `present.N.key`, or `past.N.key` → `present.N.key`. */
  readonly pastPrefix: "past_key_values" | "past"
  readonly seed: number
  /** Standard deviation of the random weights (the lm_head's is scaled so logits are well spread). */
  readonly std: number
  /**
   * What the decoder answers: `logits` (a causal LM, the default) or `last_hidden_state`, the final
   * norm's output without an lm_head, as embedding models (Qwen3-Embedding) are exported; or
   * "both", logits and the last_hidden_state they are read from (a talker, whose depth head reads
   * the hidden state too).
   */
  readonly output?: "logits" | "last_hidden_state" | "both"
  /**
   * How attention is written: "grouped" (queries reshaped per KV head, a bool mask through
   * Where; the default), or "sdpa", as torch exports scaled_dot_product_attention (what optimum's
   * exports of transformers' sdpa attention hold): keys and values repeated per query head
   * (Unsqueeze, Expand, Reshape), the scale computed from the query's shape and applied as its
   * square root to both the query and the transposed keys, an additive float mask.
   */
  readonly attention?: "grouped" | "sdpa"
  /** Added to the logits, [vocabulary] (a constructed model's fixed preferences). */
  readonly logitBias?: Float32Array
}

/** config.json of the model, in transformers' LlamaConfig fields. */
export const llamaConfigJson = (config: LlamaConfig, extra: Record<string, unknown> = {}) => ({
  architectures: ["LlamaForCausalLM"],
  model_type: "llama",
  hidden_size: config.hiddenSize,
  intermediate_size: config.intermediateSize,
  num_hidden_layers: config.layers,
  num_attention_heads: config.heads,
  num_key_value_heads: config.kvHeads,
  head_dim: config.headDim,
  vocab_size: config.vocabSize,
  max_position_embeddings: config.maxPositions,
  rope_theta: config.ropeTheta,
  rms_norm_eps: config.rmsNormEps,
  hidden_act: "silu",
  tie_word_embeddings: false,
  torch_dtype: "float32",
  ...extra
})

/** The data type of the graph's float inputs and outputs (cache, logits, inputs_embeds) at `dtype`. */
export const ioType = (dtype: Dtype): "float32" | "float16" =>
  dtype === "fp16" || dtype === "q4f16" ? "float16" : "float32"

/** Writes weights of one precision, and the linear layers that use them. */
class WeightWriter {
  constructor(
    private readonly g: Graph,
    private readonly random: Random,
    private readonly dtype: Dtype
  ) {}

  /** A float tensor as a float32 value in the graph (stored as fp16 in half-precision exports). */
  floats(name: string, dims: ReadonlyArray<number>, values: Float32Array): Value {
    if (this.dtype !== "fp16" && this.dtype !== "q4f16") return this.g.weight(name, "float32", dims, values)
    const half = this.g.weight(name, "float16", dims, halvesOf(values))
    return this.g.op("Cast", [half], { to: elementType("float32") })
  }

  normals(name: string, dims: ReadonlyArray<number>, std: number): Value {
    return this.floats(
      name,
      dims,
      this.random.normals(
        dims.reduce((a, b) => a * b, 1),
        std
      )
    )
  }

  /** x [..., inputs] · W [inputs, outputs], W random with standard deviation `std`, at the writer's dtype. */
  linear(x: Value, name: string, inputs: number, outputs: number, std: number): Value {
    const g = this.g
    return g.scope(name, () => {
      switch (this.dtype) {
        case "fp32":
        case "fp16":
          return g.op("MatMul", [x, this.normals("weight", [inputs, outputs], std)])
        case "q8":
        case "int8":
        case "uint8":
          return this.matMulInteger(x, inputs, outputs, std)
        case "q4":
        case "q4f16":
          return this.matMulNBits(x, inputs, outputs, std)
        case "bnb4":
          return this.matMulBnb4(x, inputs, outputs, std)
      }
    })
  }

  /** 8-bit weights, per-tensor scale; activations quantized on the fly (ONNX Runtime's dynamic quantization). */
  private matMulInteger(x: Value, inputs: number, outputs: number, std: number): Value {
    const g = this.g
    const unsigned = this.dtype === "uint8"
    const count = inputs * outputs
    // Uniform codes in [-127, 127] have standard deviation ~73.
    const scale = std / 73.3
    const codes = unsigned ? new Uint8Array(count) : new Int8Array(count)
    for (let i = 0; i < count; i++) codes[i] = this.random.below(255) - 127 + (unsigned ? 128 : 0)
    const weight = g.weight("weight_quantized", unsigned ? "uint8" : "int8", [inputs, outputs], codes)
    const weightZero = unsigned
      ? g.weight("weight_zero_point", "uint8", [], Uint8Array.of(128))
      : g.weight("weight_zero_point", "int8", [], Int8Array.of(0))
    const [quantized, xScale, xZero] = g.opWithOutputs("DynamicQuantizeLinear", [x], 3)
    const product = g.op("MatMulInteger", [quantized!, weight, xZero!, weightZero])
    const scaled = g.op("Mul", [xScale!, g.weight("weight_scale", "float32", [], Float32Array.of(scale))])
    return g.op("Mul", [g.op("Cast", [product], { to: elementType("float32") }), scaled])
  }

  /** 4-bit weights in blocks of 32 along the input axis, one scale per block (GPTQ/RTN as exported). */
  private matMulNBits(x: Value, inputs: number, outputs: number, std: number): Value {
    const g = this.g
    const blockSize = 32
    const blocks = Math.ceil(inputs / blockSize)
    const packed = new Uint8Array(outputs * blocks * (blockSize / 2))
    for (let i = 0; i < packed.length; i++) packed[i] = this.random.below(256)
    // Codes 0..15 around the default zero point 8 have standard deviation ~4.6.
    const scales = new Float32Array(outputs * blocks).map(() => (std / 4.6) * (0.75 + 0.5 * this.random.uniform()))
    const half = this.dtype === "q4f16"
    const weight = g.weight("weight_q4", "uint8", [outputs, blocks, blockSize / 2], packed)
    const scale = half
      ? g.weight("weight_scales", "float16", [outputs * blocks], halvesOf(scales))
      : g.weight("weight_scales", "float32", [outputs * blocks], scales)
    const input = half ? g.op("Cast", [x], { to: elementType("float16") }) : x
    const product = g.op(
      "MatMulNBits",
      [input, weight, scale],
      { K: inputs, N: outputs, bits: 4, block_size: blockSize },
      microsoftDomain
    )
    return half ? g.op("Cast", [product], { to: elementType("float32") }) : product
  }

  /** bitsandbytes NF4: the transposed weight in blocks of 64, one absmax per block. */
  private matMulBnb4(x: Value, inputs: number, outputs: number, std: number): Value {
    const g = this.g
    const blockSize = 64
    const count = inputs * outputs
    const packed = new Uint8Array(Math.ceil(count / 2))
    for (let i = 0; i < packed.length; i++) packed[i] = this.random.below(256)
    // NF4 levels lie in [-1, 1] with standard deviation ~0.55.
    const absmax = new Float32Array(Math.ceil(count / blockSize)).map(
      () => (std / 0.55) * (0.75 + 0.5 * this.random.uniform())
    )
    return g.op(
      "MatMulBnb4",
      [
        x,
        g.weight("weight_bnb4", "uint8", [packed.length], packed),
        g.weight("weight_absmax", "float32", [absmax.length], absmax)
      ],
      { K: inputs, N: outputs, block_size: blockSize, quant_type: 1 },
      microsoftDomain
    )
  }
}

export const rmsNorm = (g: Graph, x: Value, weight: Value, epsilon: number): Value => {
  const meanSquare = g.op("ReduceMean", [g.op("Mul", [x, x])], { axes: [-1], keepdims: 1 })
  const inverse = g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [meanSquare, g.floatScalar(epsilon)])])])
  return g.op("Mul", [g.op("Mul", [x, inverse]), weight])
}

/** x [batch, heads, sequence, headDim] rotated by the angles of its positions (cos, sin: [batch, 1, sequence, headDim]). */
export const rotary = (g: Graph, x: Value, cos: Value, sin: Value, headDim: number): Value => {
  const half = headDim / 2
  const slice = (from: number, to: number) => g.op("Slice", [x, g.int64s([from]), g.int64s([to]), g.int64s([-1])])
  const rotated = g.op("Concat", [g.op("Neg", [slice(half, headDim)]), slice(0, half)], { axis: -1 })
  return g.op("Add", [g.op("Mul", [x, cos]), g.op("Mul", [rotated, sin])])
}

/** Rotary tables [maxPositions, headDim] (each frequency twice, as transformers' rotate_half pairs them). */
export const rotaryTables = (
  config: Pick<LlamaConfig, "headDim" | "maxPositions" | "ropeTheta">
): { readonly cos: Float32Array; readonly sin: Float32Array } => {
  const { headDim, maxPositions, ropeTheta } = config
  const cos = new Float32Array(maxPositions * headDim)
  const sin = new Float32Array(maxPositions * headDim)
  for (let p = 0; p < maxPositions; p++) {
    for (let i = 0; i < headDim / 2; i++) {
      const angle = p / ropeTheta ** ((2 * i) / headDim)
      for (const at of [p * headDim + i, p * headDim + i + headDim / 2]) {
        cos[at] = Math.cos(angle)
        sin[at] = Math.sin(angle)
      }
    }
  }
  return { cos, sin }
}

/** Cache tensor names of layer `i`. */
export const pastName = (prefix: LlamaExport["pastPrefix"], layer: number, kind: "key" | "value") =>
  `${prefix}.${layer}.${kind}`
export const presentName = (layer: number, kind: "key" | "value") => `present.${layer}.${kind}`

/**
 * The decoder: tokens (input_ids in the decoder-only layout, inputs_embeds in the split one),
 * attention_mask, optionally position_ids, and the past → logits and the present.
 */
const decoderGraph = (g: Graph, config: LlamaConfig, options: LlamaExport, random: Random): void => {
  const { hiddenSize: hidden, heads, kvHeads, headDim, layers, vocabSize } = config
  const w = new WeightWriter(g, random, options.dtype)
  const io: DataType = ioType(options.dtype)
  const toCompute = (value: Value) => (io === "float32" ? value : g.op("Cast", [value], { to: elementType("float32") }))
  const toIo = (value: Value) => (io === "float32" ? value : g.op("Cast", [value], { to: elementType(io) }))

  // The embedding table is drawn first in both layouts, so the two layouts of one seed are one model.
  const table = random.normals(vocabSize * hidden, options.std)
  let tokens: Value
  let embeds: Value
  if (options.layout === "decoder-only") {
    tokens = g.input("input_ids", "int64", ["batch_size", "sequence_length"])
    embeds = g.op("Gather", [w.floats("model.embed_tokens.weight", [vocabSize, hidden], table), tokens], { axis: 0 })
  } else {
    tokens = g.input("inputs_embeds", io, ["batch_size", "sequence_length", hidden])
    embeds = toCompute(tokens)
  }
  const attentionMask = g.input("attention_mask", "int64", ["batch_size", "total_sequence_length"])
  const cacheShape = (length: string): ReadonlyArray<Dim> => ["batch_size", kvHeads, length, headDim]
  const positionIds = options.positionIds
    ? g.input("position_ids", "int64", ["batch_size", "sequence_length"])
    : undefined
  const pasts = Array.from({ length: layers }, (_, i) => ({
    key: g.input(pastName(options.pastPrefix, i, "key"), io, cacheShape("past_sequence_length")),
    value: g.input(pastName(options.pastPrefix, i, "value"), io, cacheShape("past_sequence_length"))
  }))

  const mask = g.op("Unsqueeze", [causalMask(g, tokens, pasts[0]!.key, attentionMask), g.int64s([1])])
  const positions =
    positionIds ??
    g.scope("position_ids", () => {
      // transformers' convention: the cumulative count of visible tokens, minus one.
      const all = g.op("Sub", [g.op("CumSum", [attentionMask, g.int64Scalar(1)]), g.int64Scalar(1)])
      const length = g.op("Slice", [g.op("Shape", [tokens]), g.int64s([1]), g.int64s([2])])
      const last = g.op("Slice", [all, g.op("Neg", [length]), g.int64s([2 ** 62]), g.int64s([1])])
      return g.op("Max", [last, g.int64Scalar(0)])
    })
  const tables = rotaryTables(config)
  const angle = (name: string, table: Float32Array) =>
    g.op("Unsqueeze", [
      g.op("Gather", [g.weight(name, "float32", [config.maxPositions, headDim], table), positions], { axis: 0 }),
      g.int64s([1])
    ])
  const cos = angle("rotary.cos", tables.cos)
  const sin = angle("rotary.sin", tables.sin)
  const group = heads / kvHeads

  let x = embeds
  for (let i = 0; i < layers; i++) {
    g.scope(`model.layers.${i}`, () => {
      const normed = rmsNorm(
        g,
        x,
        w.floats(
          "input_layernorm.weight",
          [hidden],
          Float32Array.from({ length: hidden }, () => 1)
        ),
        config.rmsNormEps
      )
      const attention = g.scope("self_attn", () => {
        const split = (value: Value, count: number) =>
          g.op("Transpose", [g.op("Reshape", [value, g.int64s([0, 0, count, headDim])])], { perm: [0, 2, 1, 3] })
        const query = rotary(
          g,
          split(w.linear(normed, "q_proj", hidden, heads * headDim, options.std), heads),
          cos,
          sin,
          headDim
        )
        const newKey = rotary(
          g,
          split(w.linear(normed, "k_proj", hidden, kvHeads * headDim, options.std), kvHeads),
          cos,
          sin,
          headDim
        )
        const newValue = split(w.linear(normed, "v_proj", hidden, kvHeads * headDim, options.std), kvHeads)
        const key = g.op("Concat", [toCompute(pasts[i]!.key), newKey], { axis: 2 })
        const value = g.op("Concat", [toCompute(pasts[i]!.value), newValue], { axis: 2 })
        g.output(toIo(key), presentName(i, "key"), io, cacheShape("total_sequence_length"))
        g.output(toIo(value), presentName(i, "value"), io, cacheShape("total_sequence_length"))
        if (options.attention === "sdpa") {
          const repeat = (kv: Value) =>
            g.op("Reshape", [
              g.op("Expand", [g.op("Unsqueeze", [kv, g.int64s([2])]), g.int64s([1, 1, group, 1, 1])]),
              g.int64s([0, heads, -1, headDim])
            ])
          // torch's _attention_scale: 1 / sqrt(the query's last dimension), from its shape.
          const embedding = g.op(
            "Cast",
            [g.op("Slice", [g.op("Shape", [query]), g.int64s([-1]), g.int64s([2 ** 62])])],
            {
              to: elementType("float32")
            }
          )
          const scale = g.op("Div", [g.floatScalar(1), g.op("Sqrt", [embedding])])
          const root = g.op("Sqrt", [scale])
          const keyT = g.op("Mul", [g.op("Transpose", [repeat(key)], { perm: [0, 1, 3, 2] }), root])
          const scores = g.op("MatMul", [g.op("Mul", [query, root]), keyT])
          const additive = g.op("Where", [mask, g.floatScalar(0), g.floatScalar(maskedScore)])
          const weights = g.op("Softmax", [g.op("Add", [scores, g.op("Squeeze", [additive, g.int64s([1])])])], {
            axis: -1
          })
          const context = g.op("MatMul", [weights, repeat(value)])
          const merged = g.op("Reshape", [
            g.op("Transpose", [context], { perm: [0, 2, 1, 3] }),
            g.int64s([0, 0, heads * headDim])
          ])
          return w.linear(merged, "o_proj", heads * headDim, hidden, options.std)
        }
        // Grouped queries: [batch, kvHeads, group, sequence, headDim] against each KV head's keys.
        const grouped = g.op("Reshape", [query, g.int64s([0, kvHeads, group, -1, headDim])])
        const keyT = g.op("Unsqueeze", [g.op("Transpose", [key], { perm: [0, 1, 3, 2] }), g.int64s([2])])
        const scores = g.op("Mul", [g.op("MatMul", [grouped, keyT]), g.floatScalar(1 / Math.sqrt(headDim))])
        const weights = g.op("Softmax", [g.op("Where", [mask, scores, g.floatScalar(maskedScore)])], { axis: -1 })
        const context = g.op("MatMul", [weights, g.op("Unsqueeze", [value, g.int64s([2])])])
        const merged = g.op("Reshape", [
          g.op("Transpose", [g.op("Reshape", [context, g.int64s([0, heads, -1, headDim])])], { perm: [0, 2, 1, 3] }),
          g.int64s([0, 0, heads * headDim])
        ])
        return w.linear(merged, "o_proj", heads * headDim, hidden, options.std)
      })
      const afterAttention = g.op("Add", [x, attention])
      const normed2 = rmsNorm(
        g,
        afterAttention,
        w.floats(
          "post_attention_layernorm.weight",
          [hidden],
          Float32Array.from({ length: hidden }, () => 1)
        ),
        config.rmsNormEps
      )
      const mlp = g.scope("mlp", () => {
        const gate = w.linear(normed2, "gate_proj", hidden, config.intermediateSize, options.std)
        const up = w.linear(normed2, "up_proj", hidden, config.intermediateSize, options.std)
        const silu = g.op("Mul", [gate, g.op("Sigmoid", [gate])])
        return w.linear(g.op("Mul", [silu, up]), "down_proj", config.intermediateSize, hidden, options.std)
      })
      x = g.op("Add", [afterAttention, mlp])
    })
  }
  const final = rmsNorm(
    g,
    x,
    w.floats(
      "model.norm.weight",
      [hidden],
      Float32Array.from({ length: hidden }, () => 1)
    ),
    config.rmsNormEps
  )
  if (options.output === "last_hidden_state" || options.output === "both")
    g.output(toIo(final), "last_hidden_state", io, ["batch_size", "sequence_length", hidden])
  if (options.output === "last_hidden_state") return
  // Logits spread by ~2 so that greedy choices are not near ties.
  const product = w.linear(final, "lm_head", hidden, vocabSize, 2 / Math.sqrt(hidden))
  const logits =
    options.logitBias === undefined
      ? product
      : g.op("Add", [product, g.weight("lm_head.bias", "float32", [vocabSize], options.logitBias)])
  g.output(toIo(logits), "logits", io, ["batch_size", "sequence_length", vocabSize])
}

/** embed_tokens.onnx of the split layout: the same table as the decoder-only model of the same seed. */
const embedTokensGraph = (g: Graph, config: LlamaConfig, options: LlamaExport, random: Random): void => {
  const w = new WeightWriter(g, random, options.dtype)
  const table = w.normals("model.embed_tokens.weight", [config.vocabSize, config.hiddenSize], options.std)
  const inputIds = g.input("input_ids", "int64", ["batch_size", "sequence_length"])
  const embeds = g.op("Gather", [table, inputIds], { axis: 0 })
  const io = ioType(options.dtype)
  g.output(io === "float32" ? embeds : g.op("Cast", [embeds], { to: elementType(io) }), "inputs_embeds", io, [
    "batch_size",
    "sequence_length",
    config.hiddenSize
  ])
}

/** The graphs of one export by their onnx/ stem: "model", or "embed_tokens" and "decoder_model_merged". */
export const llamaGraphs = (
  config: LlamaConfig,
  options: LlamaExport,
  makeGraph: (name: string) => Graph
): ReadonlyMap<string, Graph> => {
  if (options.layout === "decoder-only") {
    const g = makeGraph("model")
    decoderGraph(g, config, options, new Random(options.seed))
    return new Map([["model", g]])
  }
  const embed = makeGraph("embed_tokens")
  embedTokensGraph(embed, config, options, new Random(options.seed))
  const decoder = makeGraph("decoder_model_merged")
  // The decoder draws the same table first, so both graphs hold the same embeddings.
  decoderGraph(decoder, config, options, new Random(options.seed))
  return new Map([
    ["embed_tokens", embed],
    ["decoder_model_merged", decoder]
  ])
}
