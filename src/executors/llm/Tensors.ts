/** The tensors the LLM runner's sessions take and give, in the element types they use. */
import * as ort from "onnxruntime-node"
import { floatsOf, halvesOf } from "../../models/Float16.js"
import type { CacheArray } from "./PastCache.js"

export const float = (data: Float32Array, dims: ReadonlyArray<number>) => new ort.Tensor("float32", data, dims)

export const int64 = (data: BigInt64Array, dims: ReadonlyArray<number>) => new ort.Tensor("int64", data, dims)

/** A cache tensor of either precision. */
export const cacheTensor = (data: CacheArray, dims: ReadonlyArray<number>) =>
  data instanceof Uint16Array ? new ort.Tensor("float16", data, dims) : new ort.Tensor("float32", data, dims)

/** Float32 values as a tensor of `type`. */
export const floatsAs = (type: "float32" | "float16", data: Float32Array, dims: ReadonlyArray<number>) =>
  type === "float16" ? new ort.Tensor("float16", halvesOf(data), dims) : float(data, dims)

/** A float tensor's data as float32 (a copy for float16). */
export const float32Data = (tensor: ort.Tensor): Float32Array =>
  tensor.type === "float16" ? floatsOf(tensor.data as Uint16Array) : (tensor.data as Float32Array)

/** Each row's values at its last position of a [batch, length, width] tensor, [batch × width] as float32. */
export const lastRows = (tensor: ort.Tensor, batch: number, width: number): Float32Array => {
  const length = tensor.dims[1]!
  // A decode step (or num_logits_to_keep) gives one float32 position per row: already the layout wanted.
  if (length === 1 && tensor.data instanceof Float32Array) return tensor.data
  const out = new Float32Array(batch * width)
  const data = tensor.data as Float32Array | Uint16Array
  for (let row = 0; row < batch; row++) {
    const from = ((row + 1) * length - 1) * width
    out.set(
      data instanceof Uint16Array ? floatsOf(data, from, from + width) : data.subarray(from, from + width),
      row * width
    )
  }
  return out
}
