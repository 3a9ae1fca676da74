import * as ort from "onnxruntime-node"
import { expect } from "vitest"

/** Helpers for running built models with onnxruntime-node and comparing them with the references. */

export const session = (path: string): Promise<ort.InferenceSession> =>
  ort.InferenceSession.create(path, { executionProviders: ["cpu"], graphOptimizationLevel: "all" })

export const floatTensor = (data: Float32Array, dims: ReadonlyArray<number>) => new ort.Tensor("float32", data, dims)

export const int64Tensor = (data: ReadonlyArray<number>, dims: ReadonlyArray<number>) =>
  new ort.Tensor("int64", BigInt64Array.from(data, BigInt), dims)

export const numbers = (tensor: ort.Tensor | undefined): Float64Array => {
  if (tensor === undefined) throw new Error("the model gave no such output")
  const data = tensor.data
  if (data instanceof BigInt64Array) return Float64Array.from(data, Number)
  return Float64Array.from(data as ArrayLike<number>)
}

/** max |actual − expected| / max |expected|: the error relative to the tensor's scale. */
export const relativeError = (actual: ArrayLike<number>, expected: ArrayLike<number>): number => {
  expect(actual.length).toBe(expected.length)
  let worst = 0
  let scale = 0
  for (let i = 0; i < expected.length; i++) {
    worst = Math.max(worst, Math.abs(actual[i]! - expected[i]!))
    scale = Math.max(scale, Math.abs(expected[i]!))
  }
  return scale === 0 ? worst : worst / scale
}

export const expectClose = (actual: ort.Tensor | undefined, expected: ArrayLike<number>, name: string) => {
  const error = relativeError(numbers(actual), expected)
  expect(error, `${name}: relative error ${error}`).toBeLessThanOrEqual(1e-4)
}
