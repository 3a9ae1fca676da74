import type { Random } from "../Random.js"
import { type LayerNormWeights, type LinearWeights, matrix, type TransformerBlockWeights } from "../Weights.js"

/** Random transformer weights at the scale a freshly initialized model has (normal, std 0.02; norms at identity). */

export const initStd = 0.02

const randomLinear = (random: Random, inputs: number, outputs: number): LinearWeights => ({
  weight: matrix(inputs, outputs, random.normals(inputs * outputs, initStd)),
  bias: random.normals(outputs, initStd)
})

export const unitLayerNorm = (width: number, epsilon: number): LayerNormWeights => ({
  gamma: new Float32Array(width).fill(1),
  beta: new Float32Array(width),
  epsilon
})

export interface TransformerSize {
  readonly hidden: number
  readonly layers: number
  readonly heads: number
  readonly intermediate: number
}

export const randomBlocks = (random: Random, size: TransformerSize, epsilon: number): Array<TransformerBlockWeights> =>
  Array.from({ length: size.layers }, () => ({
    norm1: unitLayerNorm(size.hidden, epsilon),
    attention: {
      heads: size.heads,
      query: randomLinear(random, size.hidden, size.hidden),
      key: randomLinear(random, size.hidden, size.hidden),
      value: randomLinear(random, size.hidden, size.hidden),
      output: randomLinear(random, size.hidden, size.hidden)
    },
    norm2: unitLayerNorm(size.hidden, epsilon),
    mlp: {
      up: randomLinear(random, size.hidden, size.intermediate),
      down: randomLinear(random, size.intermediate, size.hidden)
    }
  }))
