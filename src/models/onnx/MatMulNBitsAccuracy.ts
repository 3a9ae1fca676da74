import onnxProto from "onnx-proto"

const { onnx } = onnxProto

/**
 * The compute of a 4-bit decoder's MatMulNBits nodes, set at load time through their
 * `accuracy_level` attribute (ONNX Runtime's contrib operator): 0 (as the community's q4 exports
 * are written) dequantises each block of weights and multiplies in fp32; 4 quantises the
 * activations to 8 bits in blocks along K, each row on its own, and multiplies in int8 (as
 * llama.cpp does with Q8 activations for its Q4 weights). At Llama-3.2-1B's size on two x86
 * threads, level 4 decodes about twice as fast; its numbers are not the export's, so a greedy
 * answer can part from transformers.js's at a near-tie. Each row is quantised apart, so a
 * request's numbers do not depend on its batch neighbours.
 */
export const int8ActivationsLevel = 4

/** The model with every MatMulNBits node at `level`, and how many there were (0: the bytes unchanged). */
export const withMatMulNBitsAccuracy = (
  bytes: Uint8Array,
  level: number
): { readonly bytes: Uint8Array; readonly nodes: number } => {
  const model = onnx.ModelProto.decode(bytes)
  const nodes = (model.graph?.node ?? []).filter(
    (node) => node.opType === "MatMulNBits" && node.domain === "com.microsoft"
  )
  if (nodes.length === 0) return { bytes, nodes: 0 }
  for (const node of nodes) {
    const others = (node.attribute ?? []).filter((attribute) => attribute.name !== "accuracy_level")
    node.attribute = [...others, { name: "accuracy_level", type: onnx.AttributeProto.AttributeType.INT, i: level }]
  }
  return { bytes: onnx.ModelProto.encode(model).finish(), nodes: nodes.length }
}
