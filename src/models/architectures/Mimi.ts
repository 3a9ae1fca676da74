import { gelu, layerNorm } from "../onnx/Layers.js"
import { float, Graph, type Value } from "../onnx/Graph.js"
import { maskedScore } from "../onnx/Attention.js"
import { rotary, rotaryTables } from "./Llama.js"
import type { LayerNormWeights, Matrix } from "../Weights.js"

/**
 * Mimi's decoder (Kyutai's neural audio codec, transformers' MimiModel) in the layout of the
 * community's export (onnx-community/kyutai-mimi-ONNX's onnx/decoder_model.onnx), which
 * transformers.js's MimiDecoderModel loads: audio_codes [batch, quantizers, frames] (int64, 12.5
 * frames a second) → audio_values [batch, 1, frames × 1920] (24 kHz).
 *
 * As transformers' `_decode_frame`: the split residual quantizer sums each codebook's vectors (the
 * first `num_semantic_quantizers` codebooks and the rest apart, each sum through its own 1×1
 * output projection), a depthwise transposed convolution doubles the frame rate, a transformer of
 * pre-norm layers (LayerNorm, rotary attention within a sliding window, GELU MLP, each residual
 * branch scaled by a learnt layer scale) runs over the frames, and the SEANet decoder upsamples to
 * samples: a convolution, then per ratio an ELU, a transposed convolution and a residual block,
 * then an ELU and the last convolution. Every convolution is causal: padded on the left only, the
 * transposed ones trimmed on the right, so a sample depends on the codes before it alone.
 */

export interface MimiSize {
  readonly hidden: number
  readonly numFilters: number
  /** The SEANet decoder's upsampling ratios, in order. */
  readonly upsamplingRatios: ReadonlyArray<number>
  readonly kernelSize: number
  readonly lastKernelSize: number
  readonly residualKernelSize: number
  readonly dilationGrowthRate: number
  readonly numResidualLayers: number
  readonly compress: number
  readonly codebookSize: number
  /** The quantizer's width (vector_quantization_hidden_dimension). */
  readonly codebookDim: number
  readonly numQuantizers: number
  readonly numSemanticQuantizers: number
  readonly layers: number
  readonly heads: number
  readonly headDim: number
  readonly intermediate: number
  /** Keys a query sees in the transformer, itself included, at twice the code frame rate. */
  readonly slidingWindow: number
  readonly ropeTheta: number
  readonly normEps: number
  readonly maxPositions: number
  readonly samplingRate: number
  readonly frameRate: number
}

export interface MimiConv {
  /** [out, in / groups, kernel] (a Conv) or [in, out / groups, kernel] (a ConvTranspose). */
  readonly kernel: Float32Array
  readonly bias?: Float32Array
}

export interface MimiLayer {
  readonly inputNorm: LayerNormWeights
  readonly query: Matrix
  readonly key: Matrix
  readonly value: Matrix
  readonly output: Matrix
  readonly attentionScale: Float32Array
  readonly postNorm: LayerNormWeights
  readonly up: Matrix
  readonly down: Matrix
  readonly mlpScale: Float32Array
}

export interface MimiWeights {
  /** One [codebook size, codebook dim] table per quantizer, semantic ones first. */
  readonly codebooks: ReadonlyArray<Float32Array>
  /** [codebook dim, hidden]: the 1×1 output projections of the semantic and the acoustic quantizer. */
  readonly semanticProjection: Matrix
  readonly acousticProjection: Matrix
  /** The depthwise upsampler's kernel, [hidden, 1, 2 × stride], no bias. */
  readonly upsample: MimiConv
  readonly layers: ReadonlyArray<MimiLayer>
  readonly firstConv: MimiConv
  /** Per ratio: the transposed convolution and the residual blocks' two convolutions each. */
  readonly stages: ReadonlyArray<{
    readonly upsample: MimiConv
    readonly residuals: ReadonlyArray<{ readonly narrow: MimiConv; readonly wide: MimiConv }>
  }>
  readonly lastConv: MimiConv
}

/** Samples per code frame. */
export const mimiHop = (size: Pick<MimiSize, "upsamplingRatios">): number =>
  size.upsamplingRatios.reduce((product, ratio) => product * ratio, 1) * mimiUpsampleStride

/** The transformer runs at the encodec frame rate, twice the code rate (transformers' upsample stride 2). */
export const mimiUpsampleStride = 2

/** Channels at the input of SEANet stage `stage` (and of its transposed convolution). */
export const mimiStageChannels = (size: MimiSize, stage: number): number =>
  size.numFilters * 2 ** (size.upsamplingRatios.length - stage)

/**
 * How many code frames before a frame can change its samples: the reach to the left of every
 * layer, each at its own rate, in code frames. A window of codes that starts this many frames
 * before a span decodes that span's samples as the whole sequence does. Most of it is the
 * transformer's: each layer looks `slidingWindow - 1` positions back.
 */
export const mimiExactContextFrames = (size: MimiSize): number => {
  let frames = 1 // the upsampler: a kernel of two strides reaches one frame back
  let rate = mimiUpsampleStride // samples per code frame at this layer's input
  frames += (size.layers * (size.slidingWindow - 1)) / rate
  frames += (size.kernelSize - 1) / rate
  for (const ratio of size.upsamplingRatios) {
    frames += 1 / rate // a transposed convolution of kernel 2 × ratio reaches one input step back
    rate *= ratio
    for (let j = 0; j < size.numResidualLayers; j++)
      frames += ((size.residualKernelSize - 1) * size.dilationGrowthRate ** j) / rate
  }
  frames += (size.lastKernelSize - 1) / rate
  return Math.ceil(frames)
}

const dim = (g: Graph, of: Value, axis: number) =>
  g.op("Gather", [g.op("Shape", [of]), g.int64Scalar(axis)], { axis: 0 })

export const mimiDecoderGraph = (size: MimiSize, w: MimiWeights): Graph => {
  const g = new Graph("decoder_model")
  const codes = g.input("audio_codes", "int64", ["batch_size", size.numQuantizers, "codes_length"])
  const { hidden, headDim, heads } = size

  // The quantizer: each codebook's vectors, summed per group, projected to the hidden width.
  const quantized = g.scope("quantizer", () => {
    const codebook = (index: number) =>
      g.op("Gather", [
        g.weight(
          `layers.${index}.codebook.embed`,
          "float32",
          [size.codebookSize, size.codebookDim],
          w.codebooks[index]!
        ),
        g.op("Gather", [codes, g.int64Scalar(index)], { axis: 1 })
      ])
    const group = (name: string, from: number, to: number, projection: Matrix) =>
      g.scope(name, () => {
        let sum = codebook(from)
        for (let index = from + 1; index < to; index++) sum = g.op("Add", [sum, codebook(index)])
        return g.op("MatMul", [
          sum,
          g.weight("output_proj.weight", "float32", [projection.rows, projection.cols], projection.data)
        ])
      })
    const semantic = group("semantic_residual_vector_quantizer", 0, size.numSemanticQuantizers, w.semanticProjection)
    if (size.numQuantizers === size.numSemanticQuantizers) return semantic
    return g.op("Add", [
      semantic,
      group("acoustic_residual_vector_quantizer", size.numSemanticQuantizers, size.numQuantizers, w.acousticProjection)
    ])
  })

  // [batch, frames, hidden] → [batch, hidden, frames × 2], depthwise, trimmed on the right.
  const upsampled = g.scope("upsample", () =>
    g.op(
      "ConvTranspose",
      [
        g.op("Transpose", [quantized], { perm: [0, 2, 1] }),
        g.weight("conv.weight", "float32", [hidden, 1, 2 * mimiUpsampleStride], w.upsample.kernel)
      ],
      {
        kernel_shape: [2 * mimiUpsampleStride],
        strides: [mimiUpsampleStride],
        group: hidden,
        pads: [0, mimiUpsampleStride]
      }
    )
  )

  let x = g.op("Transpose", [upsampled], { perm: [0, 2, 1] })
  const length = dim(g, x, 1)
  const positions = g.op("Range", [g.int64Scalar(0), length, g.int64Scalar(1)])
  const tables = rotaryTables(size)
  const angle = (name: string, table: Float32Array) =>
    g.op("Unsqueeze", [
      g.op("Gather", [g.weight(name, "float32", [size.maxPositions, headDim], table), positions], { axis: 0 }),
      g.int64s([0, 1])
    ])
  const cos = angle("decoder_transformer.rotary.cos", tables.cos)
  const sin = angle("decoder_transformer.rotary.sin", tables.sin)
  // Query i sees key j when i - window < j ≤ i.
  const mask = g.scope("sliding_window_mask", () => {
    const column = g.op("Unsqueeze", [positions, g.int64s([1])])
    const row = g.op("Unsqueeze", [positions, g.int64s([0])])
    const seen = g.op("And", [
      g.op("LessOrEqual", [row, column]),
      g.op("Greater", [row, g.op("Sub", [column, g.int64Scalar(size.slidingWindow)])])
    ])
    return g.op("Unsqueeze", [seen, g.int64s([0, 1])])
  })
  const linear = (value: Value, name: string, m: Matrix) =>
    g.op("MatMul", [value, g.weight(`${name}.weight`, "float32", [m.rows, m.cols], m.data)])
  w.layers.forEach((layer, index) => {
    x = g.scope(`decoder_transformer.layers.${index}`, () => {
      const normed = layerNorm(g, x, layer.inputNorm, "input_layernorm")
      const attention = g.scope("self_attn", () => {
        const split = (value: Value) =>
          g.op("Transpose", [g.op("Reshape", [value, g.int64s([0, 0, heads, headDim])])], { perm: [0, 2, 1, 3] })
        const query = rotary(g, split(linear(normed, "q_proj", layer.query)), cos, sin, headDim)
        const key = rotary(g, split(linear(normed, "k_proj", layer.key)), cos, sin, headDim)
        const value = split(linear(normed, "v_proj", layer.value))
        const raw = g.op("Mul", [
          g.op("MatMul", [query, g.op("Transpose", [key], { perm: [0, 1, 3, 2] })]),
          g.floatScalar(1 / Math.sqrt(headDim))
        ])
        const scores = g.op("Where", [mask, raw, g.floatScalar(maskedScore)])
        const merged = g.op("Reshape", [
          g.op("Transpose", [g.op("MatMul", [g.op("Softmax", [scores], { axis: -1 }), value])], { perm: [0, 2, 1, 3] }),
          g.int64s([0, 0, heads * headDim])
        ])
        return linear(merged, "o_proj", layer.output)
      })
      const scaled = (value: Value, name: string, scale: Float32Array) =>
        g.op("Mul", [value, g.weight(`${name}.scale`, "float32", [hidden], scale)])
      const afterAttention = g.op("Add", [x, scaled(attention, "self_attn_layer_scale", layer.attentionScale)])
      const mlp = g.scope("mlp", () =>
        linear(
          gelu(g, linear(layerNorm(g, afterAttention, layer.postNorm, "post_attention_layernorm"), "fc1", layer.up)),
          "fc2",
          layer.down
        )
      )
      return g.op("Add", [afterAttention, scaled(mlp, "mlp_layer_scale", layer.mlpScale)])
    })
  })

  // SEANet's decoder on [batch, hidden, frames].
  const elu = (value: Value) => g.op("Elu", [value], { alpha: float(1) })
  const conv = (
    value: Value,
    weights: MimiConv,
    inputs: number,
    outputs: number,
    kernel: number,
    dilation: number,
    name: string
  ) =>
    g.scope(name, () =>
      g.op(
        "Conv",
        [
          value,
          g.weight("conv.weight", "float32", [outputs, inputs, kernel], weights.kernel),
          ...(weights.bias === undefined ? [] : [g.weight("conv.bias", "float32", [outputs], weights.bias)])
        ],
        { kernel_shape: [kernel], dilations: [dilation], pads: [(kernel - 1) * dilation, 0] }
      )
    )
  let layerIndex = 0
  let y = conv(
    g.op("Transpose", [x], { perm: [0, 2, 1] }),
    w.firstConv,
    hidden,
    mimiStageChannels(size, 0),
    size.kernelSize,
    1,
    `decoder.layers.${layerIndex++}`
  )
  size.upsamplingRatios.forEach((ratio, stage) => {
    const channels = mimiStageChannels(size, stage)
    const stageWeights = w.stages[stage]!
    layerIndex++ // the ELU
    y = g.scope(`decoder.layers.${layerIndex++}`, () =>
      g.op(
        "ConvTranspose",
        [
          elu(y),
          g.weight("conv.weight", "float32", [channels, channels / 2, 2 * ratio], stageWeights.upsample.kernel),
          g.weight("conv.bias", "float32", [channels / 2], stageWeights.upsample.bias!)
        ],
        { kernel_shape: [2 * ratio], strides: [ratio], pads: [0, ratio] }
      )
    )
    stageWeights.residuals.forEach((residual, j) => {
      const narrow = channels / 2 / size.compress
      const input = y
      y = g.scope(`decoder.layers.${layerIndex++}`, () => {
        const first = conv(
          elu(input),
          residual.narrow,
          channels / 2,
          narrow,
          size.residualKernelSize,
          size.dilationGrowthRate ** j,
          "block.1"
        )
        const second = conv(elu(first), residual.wide, narrow, channels / 2, 1, 1, "block.3")
        return g.op("Add", [input, second])
      })
    })
  })
  layerIndex++ // the ELU
  const audio = conv(elu(y), w.lastConv, size.numFilters, 1, size.lastKernelSize, 1, `decoder.layers.${layerIndex}`)
  g.output(audio, "audio_values", "float32", ["batch_size", 1, "audio_length"])
  return g
}
