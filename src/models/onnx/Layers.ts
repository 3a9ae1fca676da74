import type { LayerNormWeights, LinearWeights, Matrix, MlpWeights, PatchEmbeddingWeights } from "../Weights.js"
import { float, type Graph, type Value } from "./Graph.js"

/** Building blocks shared by every model graph; each names its weights inside `g.scope(name)`. */

export const matrixWeight = (g: Graph, name: string, m: Matrix): Value =>
  g.weight(name, "float32", [m.rows, m.cols], m.data)

export const linear = (g: Graph, x: Value, w: LinearWeights, name: string): Value =>
  g.scope(name, () => {
    const product = g.op("MatMul", [x, matrixWeight(g, "weight", w.weight)])
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
