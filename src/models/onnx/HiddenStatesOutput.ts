import onnxProto from "onnx-proto"

const { onnx } = onnxProto

type NodeProto = onnxProto.onnx.INodeProto

/** The output a decoder gives its final hidden states under, as embedding models' exports name it. */
export const hiddenStatesOutput = "last_hidden_state"

export type HiddenStatesRewrite =
  | { readonly bytes: Uint8Array; readonly from: string }
  | { readonly bytes?: undefined; readonly reason: string }

/** Matrix products whose second input is the layer's weight (as exported: plain, 4-bit, NF4, 8-bit). */
const products = new Set(["MatMul", "Gemm", "FusedMatMul", "MatMulNBits", "MatMulBnb4", "MatMulInteger"])

/** What exporters put between the lm_head and `logits`: a bias, a Cast, an 8-bit product's rescaling. */
const after = new Set(["Add", "Cast", "Mul"])
const maxHops = 3

/** What a weight may pass through on its way to the product: a Cast, a dequantisation, a transpose. */
const weightOps = new Set(["Cast", "DequantizeLinear", "Transpose", "Reshape"])

/**
 * A load-time rewrite that adds the decoder's final hidden states as an output: the input of its
 * lm_head (the final norm's output), which the community's text-generation exports compute and
 * never give out. The lm_head is the first matrix product found walking back from `logits`
 * through the nodes exporters put after it (a bias Add, a Cast, the rescaling of an 8-bit
 * product), whose weight has the vocabulary as its output axis; its activation input, or for an
 * 8-bit product the floats DynamicQuantizeLinear quantised for it, is the output. It is an
 * Identity of that tensor, so nothing the decoder computed changes, and its logits stay what the
 * export gives. The weights are never read: a graph whose weights are in its data file (see
 * WeightsInPlace.ts) stays as small as it came.
 */
export const exposeHiddenStates = (bytes: Uint8Array): HiddenStatesRewrite => {
  const model = onnx.ModelProto.decode(bytes)
  const graph = model.graph
  if (graph == null) return { reason: "the model has no graph" }
  const outputs = graph.output ?? []
  if (outputs.some((output) => output.name === hiddenStatesOutput)) return { reason: "it gives them already" }
  if (!outputs.some((output) => output.name === "logits")) return { reason: "the decoder has no logits output" }
  const producer = new Map<string, NodeProto>()
  for (const node of graph.node ?? []) for (const name of node.output ?? []) producer.set(name, node)
  const initializers = new Map((graph.initializer ?? []).map((tensor) => [tensor.name!, tensor]))
  const constants = new Set<string>(initializers.keys())
  for (const node of graph.node ?? [])
    if (node.opType === "Constant") for (const name of node.output ?? []) constants.add(name)
  /** The initializer a weight input is read from (through a Cast, a dequantisation, ...), or "constant". */
  const weightOf = (name: string, depth = 0): onnxProto.onnx.ITensorProto | "constant" | undefined => {
    const tensor = initializers.get(name)
    if (tensor !== undefined) return tensor
    if (constants.has(name)) return "constant"
    const node = producer.get(name)
    if (node === undefined || depth > 3 || !weightOps.has(node.opType ?? "")) return undefined
    return weightOf(node.input![0]!, depth + 1)
  }
  const computed = (name: string) => name !== "" && weightOf(name) === undefined && producer.has(name)
  const vocab = Number(
    outputs.find((output) => output.name === "logits")?.type?.tensorType?.shape?.dim?.at(-1)?.dimValue ?? 0
  )
  /** The product multiplies by a weight with the vocabulary as its output axis (when logits say how wide). */
  const isHead = (node: NodeProto): boolean => {
    if (!products.has(node.opType ?? "")) return false
    const weight = weightOf(node.input?.[1] ?? "")
    if (weight === undefined) return false
    if (vocab === 0 || weight === "constant") return true
    const n = node.attribute?.find((attribute) => attribute.name === "N")
    if (n !== undefined) return Number(n.i) === vocab
    return (weight.dims ?? []).map(Number).includes(vocab)
  }

  // Breadth first from logits, through what exporters put after the lm_head.
  let frontier = [producer.get("logits")].filter((node): node is NodeProto => node !== undefined)
  let head: NodeProto | undefined
  for (let hop = 0; hop <= maxHops && head === undefined && frontier.length > 0; hop++) {
    head = frontier.find(isHead)
    frontier = frontier
      .filter((node) => after.has(node.opType ?? ""))
      .flatMap((node) => (node.input ?? []).filter(computed).map((name) => producer.get(name)!))
  }
  if (head === undefined) return { reason: "no lm_head (a product by the vocabulary's weights) just before logits" }
  const input = head.input![0]!
  const quantised = producer.get(input)
  const from =
    head.opType === "MatMulInteger" && quantised?.opType === "DynamicQuantizeLinear" ? quantised.input![0]! : input
  if (!computed(from)) return { reason: "the lm_head's input is not computed by the graph" }
  graph.node = [
    ...(graph.node ?? []),
    { opType: "Identity", name: "cornserve_last_hidden_state", input: [from], output: [hiddenStatesOutput] }
  ]
  // Its type is what ONNX Runtime infers for the Identity: the model's own precision.
  graph.output = [...outputs, { name: hiddenStatesOutput }]
  return { bytes: onnx.ModelProto.encode(model).finish(), from }
}
