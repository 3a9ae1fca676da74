import type { LayerNormWeights, LinearWeights, Matrix, MlpWeights, PatchEmbeddingWeights } from "../Weights.js"
import { float, type Graph, microsoftDomain, type Value } from "./Graph.js"

/** Building blocks shared by every model graph; each names its weights inside `g.scope(name)`. */

export const matrixWeight = (g: Graph, name: string, m: Matrix): Value =>
  g.weight(name, "float32", [m.rows, m.cols], m.data)

export const linear = (g: Graph, x: Value, w: LinearWeights, name: string): Value =>
  g.scope(name, () => {
    const product = g.op("MatMul", [x, matrixWeight(g, "weight", w.weight)])
    if (w.bias === undefined) return product
    return g.op("Add", [product, g.weight("bias", "float32", [w.bias.length], w.bias)])
  })

/** How a graph writes a linear layer's weights: `linear` as fp32, `linearQ4` as a 4-bit export does. */
export type LinearWriter = (g: Graph, x: Value, w: LinearWeights, name: string) => Value

/** The inputs of one MatMulNBits block (ONNX Runtime's default, and the community's q4 exports'). */
export const q4BlockSize = 32

/**
 * W [inputs, outputs] as a 4-bit MatMulNBits weight, quantized as ONNX Runtime's symmetric
 * blockwise quantizer does (round to nearest): each output's inputs in blocks of `q4BlockSize`,
 * each block's value of largest magnitude mapped to code 0 by a scale of value / −8, codes 0..15
 * around the default zero point 8, two to a byte (the lower input in the low nibble). Rows are
 * read in runs of a block, so a matrix of hundreds of MB is read in order.
 */
export const quantizeQ4 = (m: Matrix): { readonly codes: Uint8Array; readonly scales: Float32Array } => {
  const { rows: inputs, cols: outputs, data } = m
  const blocks = Math.ceil(inputs / q4BlockSize)
  const blob = q4BlockSize / 2
  const codes = new Uint8Array(outputs * blocks * blob).fill(0x88)
  const scales = new Float32Array(outputs * blocks)
  const extreme = new Float32Array(outputs)
  for (let block = 0; block < blocks; block++) {
    const first = block * q4BlockSize
    const last = Math.min(first + q4BlockSize, inputs)
    extreme.fill(0)
    for (let row = first; row < last; row++) {
      const at = row * outputs
      for (let out = 0; out < outputs; out++) {
        const value = data[at + out]!
        if (Math.abs(value) > Math.abs(extreme[out]!)) extreme[out] = value
      }
    }
    for (let out = 0; out < outputs; out++) scales[out * blocks + block] = extreme[out]! / -8
    for (let row = first; row < last; row++) {
      const at = row * outputs
      const inBlock = row - first
      const shift = (inBlock & 1) * 4
      for (let out = 0; out < outputs; out++) {
        const scale = scales[out * blocks + block]!
        const code = scale === 0 ? 8 : Math.min(15, Math.max(0, Math.round(data[at + out]! / scale) + 8))
        const byte = (out * blocks + block) * blob + (inBlock >> 1)
        codes[byte] = (codes[byte]! & ~(0xf << shift)) | (code << shift)
      }
    }
  }
  return { codes, scales }
}

/** A linear layer as a 4-bit export writes it: MatMulNBits over `quantizeQ4`'s codes, then the bias. */
export const linearQ4: LinearWriter = (g, x, w, name) =>
  g.scope(name, () => {
    const { rows: inputs, cols: outputs } = w.weight
    const blocks = Math.ceil(inputs / q4BlockSize)
    const { codes, scales } = quantizeQ4(w.weight)
    const product = g.op(
      "MatMulNBits",
      [
        x,
        g.weight("MatMul_weight_Q4", "uint8", [outputs, blocks, q4BlockSize / 2], codes),
        g.weight("MatMul_weight_scales", "float32", [outputs * blocks], scales)
      ],
      { K: inputs, N: outputs, bits: 4, block_size: q4BlockSize },
      microsoftDomain
    )
    if (w.bias === undefined) return product
    return g.op("Add", [product, g.weight("bias", "float32", [w.bias.length], w.bias)])
  })

export const layerNorm = (g: Graph, x: Value, w: LayerNormWeights, name: string): Value =>
  g.scope(name, () =>
    g.op(
      "LayerNormalization",
      [
        x,
        g.weight("weight", "float32", [w.gamma.length], w.gamma),
        g.weight("bias", "float32", [w.beta.length], w.beta)
      ],
      { axis: -1, epsilon: float(w.epsilon) }
    )
  )

/** The exact (erf) GELU; opset 17 has no Gelu operator, and ONNX Runtime fuses this pattern into one. */
export const gelu = (g: Graph, x: Value): Value => {
  const erf = g.op("Erf", [g.op("Mul", [x, g.floatScalar(Math.SQRT1_2)])])
  const gate = g.op("Mul", [g.op("Add", [erf, g.floatScalar(1)]), g.floatScalar(0.5)])
  return g.op("Mul", [x, gate])
}

/** GELU's tanh approximation (gelu_pytorch_tanh): 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))). */
export const geluTanh = (g: Graph, x: Value): Value => {
  const cubic = g.op("Mul", [g.op("Mul", [g.op("Mul", [x, x]), x]), g.floatScalar(0.044715)])
  const inner = g.op("Mul", [g.op("Add", [x, cubic]), g.floatScalar(Math.sqrt(2 / Math.PI))])
  const gate = g.op("Mul", [g.op("Add", [g.op("Tanh", [inner]), g.floatScalar(1)]), g.floatScalar(0.5)])
  return g.op("Mul", [x, gate])
}

export const mlp = (g: Graph, x: Value, w: MlpWeights, name: string): Value =>
  g.scope(name, () => linear(g, gelu(g, linear(g, x, w.up, "up_proj")), w.down, "down_proj"))

/** [batch, channels, H, W] → [batch, patches, hidden], patches in row-major order. */
export const patchEmbedding = (g: Graph, pixels: Value, w: PatchEmbeddingWeights, name: string): Value =>
  g.scope(name, () => {
    const kernel = g.weight("weight", "float32", [w.hidden, w.channels, w.patchSize, w.patchSize], w.kernel)
    const bias = g.weight("bias", "float32", [w.hidden], w.bias)
    const grid = g.op("Conv", [pixels, kernel, bias], {
      kernel_shape: [w.patchSize, w.patchSize],
      strides: [w.patchSize, w.patchSize]
    })
    const rows = g.op("Reshape", [grid, g.int64s([0, w.hidden, -1])])
    return g.op("Transpose", [rows], { perm: [0, 2, 1] })
  })
