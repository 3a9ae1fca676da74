import type { LayerNormWeights, LinearWeights, MlpWeights, PatchEmbeddingWeights } from "../Weights.js"

/**
 * Float64 arithmetic for the reference forward passes: the same operations as the ONNX graphs,
 * written plainly over row-major arrays, so that tests can tell a graph bug from float32 rounding.
 */

const twoOverSqrtPi = 2 / Math.sqrt(Math.PI)

/** erf to about 1e-15: its Taylor series near 0, the continued fraction of erfc further out. */
export const erf = (x: number): number => {
  const a = Math.abs(x)
  if (a < 3) {
    let term = x
    let sum = x
    for (let n = 1; Math.abs(term) > 1e-17 * Math.abs(sum); n++) {
      term *= (-x * x) / n
      sum += term / (2 * n + 1)
    }
    return twoOverSqrtPi * sum
  }
  let fraction = a
  for (let k = 60; k >= 1; k--) fraction = a + k / 2 / fraction
  const erfc = Math.exp(-a * a) / Math.sqrt(Math.PI) / fraction
  return Math.sign(x) * (1 - erfc)
}

export const gelu = (x: number): number => 0.5 * x * (1 + erf(x * Math.SQRT1_2))

/** [rows, in] · weight [in, out] + bias. */
export const linear = (x: Float64Array, rows: number, w: LinearWeights): Float64Array => {
  const { rows: inputs, cols: outputs, data } = w.weight
  const y = new Float64Array(rows * outputs)
  for (let r = 0; r < rows; r++) {
    for (let i = 0; i < inputs; i++) {
      const xi = x[r * inputs + i]!
      if (xi === 0) continue
      for (let o = 0; o < outputs; o++) y[r * outputs + o]! += xi * data[i * outputs + o]!
    }
    if (w.bias !== undefined) for (let o = 0; o < outputs; o++) y[r * outputs + o]! += w.bias[o]!
  }
  return y
}

export const layerNorm = (x: Float64Array, rows: number, w: LayerNormWeights): Float64Array => {
  const width = w.gamma.length
  const y = new Float64Array(rows * width)
  for (let r = 0; r < rows; r++) {
    const row = x.subarray(r * width, (r + 1) * width)
    const mean = row.reduce((a, b) => a + b, 0) / width
    const variance = row.reduce((a, b) => a + (b - mean) ** 2, 0) / width
    const scale = 1 / Math.sqrt(variance + w.epsilon)
    for (let i = 0; i < width; i++) y[r * width + i] = (row[i]! - mean) * scale * w.gamma[i]! + w.beta[i]!
  }
  return y
}

export const mlp = (x: Float64Array, rows: number, w: MlpWeights): Float64Array =>
  linear(linear(x, rows, w.up).map(gelu), rows, w.down)

export const softmaxInPlace = (values: Float64Array): void => {
  const max = values.reduce((a, b) => Math.max(a, b), -Infinity)
  let sum = 0
  for (let i = 0; i < values.length; i++) {
    values[i] = Math.exp(values[i]! - max)
    sum += values[i]!
  }
  for (let i = 0; i < values.length; i++) values[i]! /= sum
}

export const add = (a: Float64Array, b: Float64Array): Float64Array => a.map((value, i) => value + b[i]!)

/** One image [channels, size, size] → [patches, hidden], patches in row-major order. */
export const patchEmbedding = (image: Float64Array, size: number, w: PatchEmbeddingWeights): Float64Array => {
  const { channels, hidden, patchSize: p } = w
  const grid = size / p
  const out = new Float64Array(grid * grid * hidden)
  for (let gy = 0; gy < grid; gy++) {
    for (let gx = 0; gx < grid; gx++) {
      const row = (gy * grid + gx) * hidden
      for (let h = 0; h < hidden; h++) {
        let sum = w.bias[h]!
        for (let c = 0; c < channels; c++) {
          for (let ky = 0; ky < p; ky++) {
            for (let kx = 0; kx < p; kx++) {
              const pixel = image[(c * size + gy * p + ky) * size + gx * p + kx]!
              sum += pixel * w.kernel[((h * channels + c) * p + ky) * p + kx]!
            }
          }
        }
        out[row + h] = sum
      }
    }
  }
  return out
}
