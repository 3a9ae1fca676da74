import { createHash } from "node:crypto"
import onnxProto from "onnx-proto"

const { onnx } = onnxProto

type NodeProto = onnxProto.onnx.INodeProto
type TensorProto = onnxProto.onnx.ITensorProto
type GraphProto = onnxProto.onnx.IGraphProto

/**
 * A vision encoder cut in two at its projector's input: the tower (pixels to the tower's last
 * hidden states) and the projector (those states to the language model's soft tokens). Gemma 3's
 * sizes (4B, 12B, 27B) hold one SigLIP tower and differ in the projector alone (its output width is
 * the language model's hidden size), so one tower serves them all, each with its own projector: the
 * original Cornserve's encoder adapters. The community's `vision_encoder.onnx` holds both; this
 * cuts it where the tower ends, at the output of its last `LayerNormalization` (SigLIP's
 * post_layernorm: Gemma's projector norms with an RMSNorm, which exports write as other ops).
 *
 * The projector is every node that reads the cut, directly or through other projector nodes, with
 * the constants they read (initializers, Constant nodes and what is computed from them alone). A
 * projector node that reads any other tower value (its shape, say) makes the cut refused: the
 * projector would need the tower's inner values, which the tower's session does not give.
 *
 * The graph is read without its weights (see WeightsInPlace.ts): both parts keep their weights as
 * references into the file they came from, so they are opened with that file's folder as their
 * external data folder and nothing holds the weights twice. `towerDigest` names the tower's
 * computation and weights (each weight's bytes hashed as read, one tensor at a time), so two
 * models' towers can be told equal before one of them is served for both.
 */
export interface ProjectorSplit {
  /** A ModelProto: the encoder's inputs to `cut`, its only output. */
  readonly tower: Uint8Array
  /** A ModelProto: `cut` to the encoder's outputs. */
  readonly projector: Uint8Array
  /** The value the encoder is cut at: the tower's output and the projector's input. */
  readonly cut: string
  readonly towerDigest: string
  /** Bytes of the weights each part reads. */
  readonly towerWeightBytes: number
  readonly projectorWeightBytes: number
}

export type ProjectorSplitResult = ProjectorSplit | { readonly tower?: undefined; readonly reason: string }

const isLayerNorm = (node: NodeProto) =>
  node.opType === "LayerNormalization" && (node.domain == null || node.domain === "" || node.domain === "ai.onnx")

/**
 * Cuts the encoder `model` (a ModelProto whose large weights may be external, as
 * `graphWithWeightsInPlace` reads it) at its projector's input; `weightBytes` reads a weight's
 * bytes wherever they are (see `initializerBytes`), for the tower's digest.
 */
export const splitAtProjector = (
  model: Uint8Array,
  weightBytes: (tensor: TensorProto) => Uint8Array | undefined
): ProjectorSplitResult => {
  const proto = onnx.ModelProto.decode(model)
  const graph = proto.graph
  if (graph == null) return { reason: "the model has no graph" }
  const nodes = graph.node ?? []
  const initializers = new Map((graph.initializer ?? []).map((tensor) => [tensor.name!, tensor]))
  const inputs = new Set((graph.input ?? []).map((input) => input.name!).filter((name) => !initializers.has(name)))
  const producer = new Map<string, number>()
  nodes.forEach((node, index) => {
    for (const name of node.output ?? []) producer.set(name, index)
  })
  const outputs = (graph.output ?? []).map((output) => output.name!)

  /** Values computed from constants alone (initializers, Constant nodes and what only they feed). */
  const constant = new Set<string>(initializers.keys())
  for (const node of nodes) {
    const reads = (node.input ?? []).filter((name) => name !== "")
    if (reads.every((name) => constant.has(name))) for (const name of node.output ?? []) constant.add(name)
  }
  /** Node indices whose values every output reads, by way of `from`. */
  const ancestors = (from: ReadonlyArray<string>): Set<number> => {
    const seen = new Set<number>()
    const stack = [...from]
    while (stack.length > 0) {
      const index = producer.get(stack.pop()!)
      if (index === undefined || seen.has(index)) continue
      seen.add(index)
      stack.push(...(nodes[index]!.input ?? []).filter((name) => name !== ""))
    }
    return seen
  }
  const feeding = ancestors(outputs)
  const cutIndex = nodes.findLastIndex((node, index) => isLayerNorm(node) && feeding.has(index))
  if (cutIndex < 0) return { reason: "no LayerNormalization (the tower's last norm) feeds the encoder's output" }
  const cut = nodes[cutIndex]!.output![0]!

  // The projector: what reads the cut, forward, in the graph's order (a topological one).
  const downstream = new Set<string>([cut])
  const projectorNodes = new Set<number>()
  nodes.forEach((node, index) => {
    if ((node.input ?? []).some((name) => downstream.has(name))) {
      projectorNodes.add(index)
      for (const name of node.output ?? []) downstream.add(name)
    }
  })
  if (!outputs.every((name) => downstream.has(name))) {
    return { reason: "an output of the encoder does not come from the tower's last norm" }
  }
  for (const index of projectorNodes) {
    for (const name of nodes[index]!.input ?? []) {
      if (name === "" || downstream.has(name)) continue
      if (!constant.has(name)) {
        return { reason: `the projector reads ${name}, a value of the tower other than its output` }
      }
      // A constant computed by nodes: they come along (they read no input, so they are cheap to repeat).
      for (const helper of ancestors([name])) projectorNodes.add(helper)
    }
  }
  const towerNodes = ancestors([cut])
  for (const index of towerNodes) {
    if (projectorNodes.has(index) && !constantNode(nodes[index]!, constant)) {
      return { reason: "the tower and the projector share a node" }
    }
  }
  for (const name of inputs) {
    if ([...projectorNodes].some((index) => (nodes[index]!.input ?? []).includes(name))) {
      return { reason: `the projector reads the encoder's input ${name}` }
    }
  }

  const elemType =
    (graph.valueInfo ?? []).find((info) => info.name === cut)?.type?.tensorType?.elemType ??
    (graph.input ?? []).find((input) => inputs.has(input.name!))?.type?.tensorType?.elemType ??
    onnx.TensorProto.DataType.FLOAT
  const cutInfo = { name: cut, type: { tensorType: { elemType } } }
  type Values = NonNullable<GraphProto["input"]>
  const part = (indices: ReadonlySet<number>, partInputs: Values, partOutputs: Values) => {
    const partNodes = nodes.filter((_, index) => indices.has(index))
    const reads = new Set(partNodes.flatMap((node) => node.input ?? []))
    const partInitializers = (graph.initializer ?? []).filter((tensor) => reads.has(tensor.name!))
    const partGraph: GraphProto = {
      ...graph,
      node: partNodes,
      initializer: partInitializers,
      input: partInputs,
      output: partOutputs,
      valueInfo: (graph.valueInfo ?? []).filter(
        (info) => reads.has(info.name!) && !inputsOf(partInputs).has(info.name!)
      )
    }
    return { graph: partGraph, initializers: partInitializers }
  }
  const tower = part(
    towerNodes,
    (graph.input ?? []).filter((input) => !initializers.has(input.name!)),
    [cutInfo]
  )
  const projector = part(projectorNodes, [cutInfo], graph.output ?? [])

  const digest = createHash("sha256")
  digest.update(JSON.stringify(tower.graph.input))
  for (const node of tower.graph.node ?? []) digest.update(onnx.NodeProto.encode(node).finish())
  for (const tensor of [...tower.initializers].sort((a, b) => (a.name! < b.name! ? -1 : 1))) {
    const bytes = weightBytes(tensor)
    if (bytes === undefined) return { reason: `the tower's weight ${tensor.name} cannot be read` }
    digest.update(`${tensor.name}:${tensor.dataType}:${(tensor.dims ?? []).join("x")}:`)
    digest.update(bytes)
  }
  const encode = (graphPart: GraphProto) => onnx.ModelProto.encode({ ...proto, graph: graphPart }).finish()
  return {
    tower: encode(tower.graph),
    projector: encode(projector.graph),
    cut,
    towerDigest: digest.digest("hex"),
    towerWeightBytes: weightsSize(tower.initializers),
    projectorWeightBytes: weightsSize(projector.initializers)
  }
}

const constantNode = (node: NodeProto, constant: ReadonlySet<string>) =>
  (node.output ?? []).every((name) => constant.has(name))

const inputsOf = (values: NonNullable<GraphProto["input"]>) => new Set(values.map((value) => value.name!))

/** A weight's bytes as stored: inline, or its external reference's length. */
const weightsSize = (tensors: ReadonlyArray<TensorProto>) =>
  tensors.reduce((sum, tensor) => {
    if (tensor.rawData != null && tensor.rawData.length > 0) return sum + tensor.rawData.length
    const length = (tensor.externalData ?? []).find((entry) => entry.key === "length")?.value
    return sum + (length === undefined ? 0 : Number(length))
  }, 0)
