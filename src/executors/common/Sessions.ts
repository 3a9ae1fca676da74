import * as ort from "onnxruntime-node"
import { type DType, Tensor } from "../../sidecar/Tensor.js"

/** An ONNX Runtime session on one device: the CPU provider with a fixed thread count, or CUDA device N. */
export const createSession = (path: string, device: string, threads: number): Promise<ort.InferenceSession> => {
  const [type, index] = device.split(":")
  const executionProviders: ort.InferenceSession.SessionOptions["executionProviders"] =
    type === "cuda" ? [{ name: "cuda", deviceId: Number(index) }] : ["cpu"]
  return ort.InferenceSession.create(path, {
    executionProviders,
    intraOpNumThreads: threads,
    interOpNumThreads: 1,
    graphOptimizationLevel: "all"
  })
}

/** A tensor (over any memory, the batch buffer included) as ONNX Runtime's input. */
export const toOrt = (tensor: Tensor): ort.Tensor =>
  new ort.Tensor(tensor.dtype as ort.Tensor.Type, tensor.data as ort.Tensor.DataType, [...tensor.shape])

/** ONNX Runtime's output as a tensor. */
export const fromOrt = (tensor: ort.Tensor): Tensor =>
  new Tensor(tensor.type as DType, tensor.dims, tensor.data as never)
