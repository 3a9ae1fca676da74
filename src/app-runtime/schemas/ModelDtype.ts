import * as Schema from "effect/Schema"

/**
 * Which of a model's ONNX exports runs: the precisions the community publishes (fp32, fp16, 8-bit
 * q8/int8/uint8, 4-bit q4/q4f16/bnb4), each its own file (onnx/model_q4.onnx is "q4").
 */
export const ModelDtype = Schema.Literal("fp32", "fp16", "q8", "int8", "uint8", "q4", "q4f16", "bnb4")
export type ModelDtype = typeof ModelDtype.Type
