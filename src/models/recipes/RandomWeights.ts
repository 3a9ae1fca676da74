import type { Random } from "../Random.js"
import {
  type LayerNormWeights,
  type LinearWeights,
  type Matrix,
  matrix,
  type TransformerBlockWeights
} from "../Weights.js"

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

/**
 * Weights at a scale that keeps activations their size through the layers, and norms off
 * identity, so that a fixture's graph and its reference disagree where a formula is wrong.
 */
export class WeightDraw {
  constructor(private readonly random: Random) {}

  /** Scaled by 1/√inputs so that activations keep their size through the layers. */
  linear(inputs: number, outputs: number, bias: boolean): LinearWeights {
    const weight = matrix(inputs, outputs, this.random.normals(inputs * outputs, 1 / Math.sqrt(inputs)))
    return bias ? { weight, bias: this.random.normals(outputs, 0.1) } : { weight }
  }

  /** Near 1, so that a wrong norm weight shows. */
  scales(width: number): Float32Array {
    return this.offsets(width).map((value) => 1 + value)
  }

  /** Near 0: weights a norm applies as 1 + w (Gemma's RMSNorm), so that a norm without the 1 shows. */
  offsets(width: number): Float32Array {
    return this.random.normals(width, 0.1)
  }

  layerNorm(width: number, epsilon = 1e-6): LayerNormWeights {
    return { gamma: this.scales(width), beta: this.random.normals(width, 0.1), epsilon }
  }

  /** Grouped-query attention's projections; `bias` on q, k and v (Qwen2's), never on o. */
  attention(
    hidden: number,
    heads: number,
    kvHeads: number,
    headDim: number,
    bias: boolean
  ): { readonly q: LinearWeights; readonly k: LinearWeights; readonly v: LinearWeights; readonly o: LinearWeights } {
    return {
      q: this.linear(hidden, heads * headDim, bias),
      k: this.linear(hidden, kvHeads * headDim, bias),
      v: this.linear(hidden, kvHeads * headDim, bias),
      o: this.linear(heads * headDim, hidden, false)
    }
  }

  /** A gated MLP's three projections, without biases. */
  gatedMlp(
    hidden: number,
    intermediate: number
  ): { readonly gate: LinearWeights; readonly up: LinearWeights; readonly down: LinearWeights } {
    return {
      gate: this.linear(hidden, intermediate, false),
      up: this.linear(hidden, intermediate, false),
      down: this.linear(intermediate, hidden, false)
    }
  }

  /**
   * A language model head [hidden, vocabulary]: the embedding table transposed when tied, else its
   * own, its logits spread wide enough that greedy choices are clear.
   */
  lmHead(embedTokens: Matrix, tied: boolean): Matrix {
    const [vocabSize, hidden] = [embedTokens.rows, embedTokens.cols]
    if (!tied) return matrix(hidden, vocabSize, this.random.normals(hidden * vocabSize, 2 / Math.sqrt(hidden)))
    const out = new Float32Array(vocabSize * hidden)
    for (let r = 0; r < vocabSize; r++)
      for (let c = 0; c < hidden; c++) out[c * vocabSize + r] = embedTokens.data[r * hidden + c]!
    return matrix(hidden, vocabSize, out)
  }
}
