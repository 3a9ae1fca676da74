import * as Data from "effect/Data"
import onnxProto from "onnx-proto"
import { fromHalf } from "../Float16.js"

const { onnx } = onnxProto

/**
 * A load-time rewrite of a decoder's attention onto a cache that the runner owns. As exported,
 * each layer concatenates its past keys and values with the step's new ones (a copy of the whole
 * cache in the graph), attends over the result under a mask, and hands the concatenation out as
 * present.N.key/value (a second copy, out of ONNX Runtime). Here each layer's attention becomes
 * one `GroupQueryAttention` (ONNX Runtime's contrib op) over the past as the runner holds it:
 * [batch, kvHeads, capacity, headDim], each row's positions at its start, `seqlens_k` (int32
 * [batch]: each row's length after this run, less one) saying how many are real. It reads only
 * each row's own positions, so rows of different lengths need no padding and no mask, and
 * present.N.key/value become the step's *new* keys and values alone ([batch, kvHeads, new,
 * headDim]), which the runner writes into its cache in place.
 *
 * The attention subgraph is matched as exporters write it, per layer, from the cache outward:
 * - present = Concat(past, new) on the position axis (each optionally through a Cast, where the
 *   export stores the cache in float16 and computes in float32);
 * - scores = MatMul(query, keys transposed), where the keys come from that Concat through shape
 *   ops (Transpose, Reshape, Unsqueeze, Expand: the repeat of grouped heads) and either side may
 *   be scaled by a constant (torch's SDPA export scales both by the scale's square root);
 * - then a scale, the mask (Add, or Where), Softmax, and MatMul with the values;
 * - then the heads merged back (Transpose to [batch, positions, heads, headDim], Reshape).
 * The mask is dropped: GroupQueryAttention's own is causal within each row's length, which is
 * what the exports' masks say for the cache the runner keeps (no padding; no sliding window: a
 * model whose config uses one is not rewritten). Anything else, or anything that still reads
 * the past after the rewrite (positions derived from its shape, say), leaves the model as it is.
 */

type NodeProto = onnxProto.onnx.INodeProto
type TensorProto = onnxProto.onnx.ITensorProto
type ValueInfoProto = onnxProto.onnx.IValueInfoProto

const { FLOAT, FLOAT16, DOUBLE, INT32, INT64 } = onnx.TensorProto.DataType
const { INT, INTS, FLOAT: FLOAT_ATTRIBUTE } = onnx.AttributeProto.AttributeType

/** The runner's inputs to the rewritten decoder. */
export const sharedCacheInputs = {
  /** int32 [batch]: each row's length once this run's positions are in, less one. */
  seqlens: "cornserve_seqlens_k",
  /** int32 scalar: the longest row's length once this run's positions are in. */
  total: "cornserve_total_sequence_length"
} as const

export interface AttentionGeometry {
  readonly heads: number
  readonly kvHeads: number
  readonly headDim: number
}

export type SharedCacheRewrite =
  | { readonly bytes: Uint8Array; readonly layers: number }
  | { readonly bytes?: undefined; readonly reason: string }

const pastPattern = /^(?:past_key_values|past)\.(\d+)\.(?:decoder\.)?(key|value)$/
const presentPattern = /^(?:present|present_key_values)\.(\d+)\.(?:decoder\.)?(key|value)$/

const attribute = (node: NodeProto, name: string) => node.attribute?.find((entry) => entry.name === name)
const intsOf = (node: NodeProto, name: string): ReadonlyArray<number> | undefined =>
  attribute(node, name)?.ints?.map(Number)

/** The single number a tensor holds (float, float16, double or an integer), if it holds one. */
const scalarOfTensor = (tensor: TensorProto): number | undefined => {
  const count = (tensor.dims ?? []).reduce<number>((product, dim) => product * Number(dim), 1)
  if (count !== 1) return undefined
  const raw = tensor.rawData
  if (tensor.dataType === FLOAT) {
    if (raw != null && raw.length === 4) return new DataView(raw.buffer, raw.byteOffset, 4).getFloat32(0, true)
    return tensor.floatData?.[0]
  }
  if (tensor.dataType === DOUBLE) {
    if (raw != null && raw.length === 8) return new DataView(raw.buffer, raw.byteOffset, 8).getFloat64(0, true)
    return tensor.doubleData?.[0]
  }
  if (tensor.dataType === INT64) {
    if (raw != null && raw.length === 8) return Number(new DataView(raw.buffer, raw.byteOffset, 8).getBigInt64(0, true))
    const value = tensor.int64Data?.[0]
    return value === undefined ? undefined : Number(value)
  }
  if (tensor.dataType === INT32) {
    if (raw != null && raw.length === 4) return new DataView(raw.buffer, raw.byteOffset, 4).getInt32(0, true)
    return tensor.int32Data?.[0]
  }
  if (tensor.dataType === FLOAT16) {
    if (raw != null && raw.length === 2) return fromHalf(new DataView(raw.buffer, raw.byteOffset, 2).getUint16(0, true))
    const bits = tensor.int32Data?.[0]
    return bits === undefined ? undefined : fromHalf(bits)
  }
  return undefined
}

/** Why a graph cannot be rewritten: thrown from deep in the walk, answered as `{ reason }`. */
class NotRewritable extends Data.TaggedError("NotRewritable")<{ readonly reason: string }> {}
const fail = (reason: string): never => {
  throw new NotRewritable({ reason })
}

export const rewriteSharedCache = (bytes: Uint8Array, geometry: AttentionGeometry): SharedCacheRewrite => {
  try {
    return rewrite(bytes, geometry)
  } catch (error) {
    if (error instanceof NotRewritable) return { reason: error.reason }
    throw error
  }
}

const rewrite = (bytes: Uint8Array, { heads, kvHeads, headDim }: AttentionGeometry): SharedCacheRewrite => {
  const model = onnx.ModelProto.decode(bytes)
  const graph = model.graph ?? fail("the model has no graph")
  const nodes = graph.node ?? []
  if (nodes.some((node) => node.opType === "If" || node.opType === "Loop" || node.opType === "Scan"))
    fail("it has subgraphs (If, Loop or Scan)")

  const producer = new Map<string, NodeProto>()
  const consumers = new Map<string, Array<{ readonly node: NodeProto; readonly input: number }>>()
  for (const node of nodes) {
    for (const name of node.output ?? []) producer.set(name, node)
    ;(node.input ?? []).forEach((name, input) => {
      if (name === "") return
      const list = consumers.get(name) ?? []
      list.push({ node, input })
      consumers.set(name, list)
    })
  }
  const initializers = new Map((graph.initializer ?? []).map((init) => [init.name!, init]))
  const inputs = new Map((graph.input ?? []).map((value) => [value.name!, value]))
  const outputs = graph.output ?? []
  /** Whether a scale was read off a shape: torch's SDPA export computes 1 / sqrt(the query's last dimension). */
  let scaleFromShape = false
  /**
   * The value of a scalar computed from constants (and the last dimension of a shape, which in an
   * attention's scale is the head's): Constant, Cast, Sqrt, Reciprocal, Mul, Div.
   */
  const scalar = (name: string, depth = 0): number | undefined => {
    const init = initializers.get(name)
    if (init !== undefined) return scalarOfTensor(init)
    const node = producer.get(name)
    if (node === undefined || depth > 8) return undefined
    const arg = (index: number) => {
      const input = node.input?.[index]
      return input === undefined || input === "" ? undefined : scalar(input, depth + 1)
    }
    switch (node.opType) {
      case "Constant": {
        const value = attribute(node, "value")?.t
        return value == null ? undefined : scalarOfTensor(value)
      }
      case "Cast":
        return arg(0)
      case "Sqrt": {
        const value = arg(0)
        return value === undefined || value < 0 ? undefined : Math.sqrt(value)
      }
      case "Reciprocal": {
        const value = arg(0)
        return value === undefined || value === 0 ? undefined : 1 / value
      }
      case "Mul":
      case "Div": {
        const [a, b] = [arg(0), arg(1)]
        if (a === undefined || b === undefined || (node.opType === "Div" && b === 0)) return undefined
        return node.opType === "Mul" ? a * b : a / b
      }
      case "Slice":
      case "Gather": {
        // The last entry of a shape: Slice(Shape(x), [-1], [end]) or Gather(Shape(x), -1).
        if (producer.get(node.input?.[0] ?? "")?.opType !== "Shape") return undefined
        if (arg(1) !== -1) return undefined
        if (node.opType === "Slice" && (node.input?.length ?? 0) > 3 && arg(3) !== 0 && arg(3) !== -1) return undefined
        scaleFromShape = true
        return headDim
      }
      default:
        return undefined
    }
  }
  /** For Mul or Div by a constant: the data input and the factor it applies. */
  const scaling = (node: NodeProto): { readonly data: string; readonly factor: number } | undefined => {
    if (node.opType !== "Mul" && node.opType !== "Div") return undefined
    const [a, b] = node.input ?? []
    const right = b === undefined ? undefined : scalar(b)
    if (right !== undefined && right !== 0) return { data: a!, factor: node.opType === "Mul" ? right : 1 / right }
    const left = node.opType === "Mul" && a !== undefined ? scalar(a) : undefined
    if (left !== undefined) return { data: b!, factor: left }
    return undefined
  }
  const only = (name: string) => {
    const list = consumers.get(name) ?? []
    return list.length === 1 ? list[0]! : undefined
  }

  const pasts = new Map<string, ValueInfoProto>()
  for (const value of graph.input ?? []) {
    const match = pastPattern.exec(value.name ?? "")
    if (match !== null) pasts.set(`${match[1]}.${match[2]}`, value)
  }
  const presents = new Map<string, ValueInfoProto>()
  for (const value of outputs) {
    const match = presentPattern.exec(value.name ?? "")
    if (match !== null) presents.set(`${match[1]}.${match[2]}`, value)
  }
  const layers = pasts.size / 2
  if (layers === 0 || !Number.isInteger(layers)) fail("it has no past_key_values inputs in pairs")

  /** The Concat behind a present output, and what it concatenates. */
  const concatOf = (layer: number, kind: "key" | "value") => {
    const past = pasts.get(`${layer}.${kind}`) ?? fail(`layer ${layer} has no past ${kind}`)
    const present = presents.get(`${layer}.${kind}`) ?? fail(`layer ${layer} has no present ${kind}`)
    let node = producer.get(present.name!) ?? fail(`${present.name} is not computed`)
    const storedAs = node.opType === "Cast" ? Number(attribute(node, "to")?.i ?? 0) : undefined
    if (node.opType === "Cast") node = producer.get(node.input![0]!) ?? fail(`${present.name} is not a Concat`)
    if (node.opType !== "Concat") fail(`${present.name} is not a Concat of the past and the new ${kind}s`)
    const axis = Number(attribute(node, "axis")?.i ?? 0)
    if ((axis !== 2 && axis !== -2) || node.input?.length !== 2) fail(`${present.name}'s Concat is not on positions`)
    const [first, added] = node.input as [string, string]
    let computeType = Number(past.type?.tensorType?.elemType ?? 0)
    let pastRead = first
    const cast = producer.get(first)
    if (cast?.opType === "Cast") {
      computeType = Number(attribute(cast, "to")?.i ?? 0)
      pastRead = cast.input![0]!
    }
    if (pastRead !== past.name) fail(`${present.name} does not concatenate ${past.name}`)
    if (computeType !== FLOAT && computeType !== FLOAT16) fail(`${past.name} is not float32 or float16`)
    return { past, present, concat: node, added, computeType, storedAs, castPast: cast?.opType === "Cast" }
  }

  const initializerAdds: Array<TensorProto> = []
  const replacements = new Map<NodeProto, Array<NodeProto>>()
  const removed = new Set<NodeProto>()
  const rewired = new Map<string, string>()
  const addedOutputs = new Map<string, ValueInfoProto>()
  const retyped = new Map<string, number>()
  let factorTotal = 1

  for (let layer = 0; layer < layers; layer++) {
    const key = concatOf(layer, "key")
    const value = concatOf(layer, "value")
    if (key.computeType !== value.computeType) fail(`layer ${layer}'s keys and values differ in type`)
    const keys = key.concat.output![0]!
    const values = value.concat.output![0]!

    // The scores' MatMul: the one the keys reach through shape ops (and a scale), as its second input.
    const shapeOps = new Set(["Transpose", "Reshape", "Unsqueeze", "Expand", "Cast"])
    let keyFactor = 1
    const reach = (from: string, target: string): number | undefined => {
      // Backward from `from` through shape ops and constant scales to `target`; the scale found.
      let name = from
      let factor = 1
      for (let hops = 0; hops < 16; hops++) {
        if (name === target) return factor
        const node = producer.get(name)
        if (node === undefined) return undefined
        const scaled = scaling(node)
        if (scaled !== undefined) {
          factor *= scaled.factor
          name = scaled.data
        } else if (shapeOps.has(node.opType!)) name = node.input![0]!
        else return undefined
      }
      return undefined
    }
    const matMuls = nodes.filter((node) => node.opType === "MatMul" && node.input?.length === 2)
    const scoresNode =
      matMuls.find((node) => reach(node.input![1]!, keys) !== undefined) ?? fail(`layer ${layer}'s scores not found`)
    keyFactor = reach(scoresNode.input![1]!, keys)!
    const contextNode =
      matMuls.find((node) => node !== scoresNode && reach(node.input![1]!, values) !== undefined) ??
      fail(`layer ${layer}'s weighted values not found`)
    if (reach(contextNode.input![1]!, values) !== 1) fail(`layer ${layer}'s values are scaled`)

    // The query: back from the scores through reshapes and a scale.
    let query = scoresNode.input![0]!
    let queryFactor = 1
    for (let hops = 0; hops < 8; hops++) {
      const node = producer.get(query)
      if (node === undefined) break
      const scaled = scaling(node)
      if (scaled !== undefined) {
        queryFactor *= scaled.factor
        query = scaled.data
      } else if (node.opType === "Reshape" || node.opType === "Unsqueeze") query = node.input![0]!
      else break
    }

    // Scores → (scale) → mask → Softmax → (Cast) → the values' MatMul.
    let scoresFactor = 1
    let at = scoresNode.output![0]!
    for (let hops = 0; ; hops++) {
      if (hops > 8) fail(`layer ${layer}'s softmax not found`)
      const next = only(at) ?? fail(`layer ${layer}'s scores are read twice`)
      const node = next.node
      const scaled = scaling(node)
      if (scaled !== undefined && scaled.data === at) scoresFactor *= scaled.factor
      else if (node.opType === "Add" || (node.opType === "Where" && next.input === 1) || node.opType === "Cast") {
        // the mask, or a cast around it
      } else if (node.opType === "Softmax") {
        const axis = Number(attribute(node, "axis")?.i ?? -1)
        if (axis !== -1 && axis !== 3 && axis !== 4) fail(`layer ${layer}'s softmax is not over the keys`)
        at = node.output![0]!
        break
      } else fail(`layer ${layer}'s scores go through ${node.opType}`)
      at = node.output![0]!
    }
    const afterSoftmax = only(at) ?? fail(`layer ${layer}'s weights are read twice`)
    const weightsInput =
      afterSoftmax.node.opType === "Cast" ? (only(afterSoftmax.node.output![0]!) ?? afterSoftmax) : afterSoftmax
    if (weightsInput.node !== contextNode || weightsInput.input !== 0)
      fail(`layer ${layer}'s weights do not go to the values' MatMul`)

    // The heads merged: a chain of Reshape and Transpose (with [0, 2, 1, 3]) ending in a Reshape.
    let merged = contextNode.output![0]!
    let transposed = false
    let last: NodeProto | undefined
    for (let hops = 0; hops < 6; hops++) {
      const next = only(merged)
      if (next === undefined || (next.node.opType !== "Reshape" && next.node.opType !== "Transpose")) break
      if (next.node.opType === "Transpose") {
        const perm = intsOf(next.node, "perm")
        if (perm?.join() !== "0,2,1,3") fail(`layer ${layer}'s heads are merged in an order not known`)
        transposed = true
      }
      last = next.node
      merged = next.node.output![0]!
    }
    if (!transposed || last?.opType !== "Reshape") fail(`layer ${layer}'s heads are not merged as known`)

    const scale = keyFactor * queryFactor * scoresFactor
    if (scaleFromShape && Math.abs(scale * Math.sqrt(headDim) - 1) > 1e-5)
      fail(`layer ${layer}'s scale, read off a shape, is not 1 / sqrt(head_dim)`)
    if (layer === 0) factorTotal = scale
    else if (Math.abs(scale - factorTotal) > 1e-6 * Math.abs(factorTotal))
      fail("its layers scale their scores differently")

    // The replacement, where the values' MatMul was (everything it reads is computed before it).
    const n = (name: string) => `shared_cache/${layer}/${name}`
    const int64s = (name: string, values: ReadonlyArray<number>): string => {
      const full = n(name)
      initializerAdds.push({
        name: full,
        dims: [values.length],
        dataType: onnx.TensorProto.DataType.INT64,
        rawData: new Uint8Array(BigInt64Array.from(values, BigInt).buffer)
      })
      return full
    }
    const node = (opType: string, input: Array<string>, output: Array<string>, attrs: Array<object> = []) =>
      ({ opType, name: output[0], input, output, attribute: attrs }) as NodeProto
    const perm = { name: "perm", type: INTS, ints: [0, 2, 1, 3] }
    const flat = int64s("flat", [0, 0, -1])
    const toRows = (from: string, name: string) => [
      node("Transpose", [from], [n(`${name}_bsnh`)], [perm]),
      node("Reshape", [n(`${name}_bsnh`), flat], [n(`${name}_bsh`)])
    ]
    const added: Array<NodeProto> = [
      ...toRows(query, "query"),
      ...toRows(key.added, "key"),
      ...toRows(value.added, "value"),
      {
        opType: "GroupQueryAttention",
        domain: "com.microsoft",
        name: n("attention"),
        input: [
          n("query_bsh"),
          n("key_bsh"),
          n("value_bsh"),
          key.past.name!,
          value.past.name!,
          sharedCacheInputs.seqlens,
          sharedCacheInputs.total
        ],
        output: [n("output"), n("present_key"), n("present_value")],
        attribute: [
          { name: "num_heads", type: INT, i: heads },
          { name: "kv_num_heads", type: INT, i: kvHeads },
          { name: "scale", type: FLOAT_ATTRIBUTE, f: scale }
        ]
      }
    ]
    // present.N.* is now the new positions alone, rounded as the export stored them.
    for (const side of [key, value]) {
      const name = side.present.name!
      if (side.storedAs !== undefined && side.castPast) {
        const to = (type: number) => ({ name: "to", type: INT, i: type })
        added.push(node("Cast", [side.added], [n(`${name}_stored`)], [to(side.storedAs)]))
        added.push(node("Cast", [n(`${name}_stored`)], [name], [to(side.computeType)]))
      } else if (side.storedAs !== undefined) {
        added.push(node("Cast", [side.added], [name], [{ name: "to", type: INT, i: side.storedAs }]))
      } else added.push(node("Identity", [side.added], [name]))
      const stored = side.castPast ? side.computeType : (side.storedAs ?? side.computeType)
      addedOutputs.set(name, {
        name,
        type: {
          tensorType: {
            elemType: stored,
            shape: {
              dim: [
                { dimParam: "batch_size" },
                { dimValue: kvHeads },
                { dimParam: "new_positions" },
                { dimValue: headDim }
              ]
            }
          }
        }
      })
      if (side.castPast) retyped.set(side.past.name!, side.computeType)
      const old = producer.get(name)!
      removed.add(old)
    }
    replacements.set(contextNode, added)
    rewired.set(merged, n("output"))
  }

  // Splice: each layer's nodes where its values' MatMul was; readers of the merged heads read the attention.
  const spliced: Array<NodeProto> = []
  for (const node of nodes) {
    if (removed.has(node)) continue
    const added = replacements.get(node)
    if (added !== undefined) {
      spliced.push(...added)
      continue
    }
    if ((node.input ?? []).some((name) => rewired.has(name)))
      node.input = node.input!.map((name) => rewired.get(name) ?? name)
    spliced.push(node)
  }
  graph.output = outputs.map((value) => addedOutputs.get(value.name!) ?? value)
  for (const [name, type] of retyped) {
    const input = inputs.get(name)!
    input.type = { tensorType: { elemType: type, shape: input.type?.tensorType?.shape ?? null } }
  }

  // Keep what the outputs need.
  const byOutput = new Map<string, NodeProto>()
  for (const node of spliced) for (const name of node.output ?? []) byOutput.set(name, node)
  const live = new Set<NodeProto>()
  const pending = graph.output.map((value) => value.name!)
  while (pending.length > 0) {
    const node = byOutput.get(pending.pop()!)
    if (node === undefined || live.has(node)) continue
    live.add(node)
    for (const name of node.input ?? []) if (name !== "") pending.push(name)
  }
  const kept = spliced.filter((node) => live.has(node))
  for (const node of kept) {
    if (node.opType === "GroupQueryAttention") continue
    const read = (node.input ?? []).find((name) => pasts.has(pastKey(name)))
    if (read !== undefined) fail(`${read} is still read by a ${node.opType} beside the attention`)
  }
  graph.node = kept
  // The constants of the nodes the rewrite dropped go with them (ONNX Runtime would warn of each).
  const read = new Set([...kept.flatMap((node) => node.input ?? []), ...graph.output.map((value) => value.name!)])
  graph.initializer = [...(graph.initializer ?? []), ...initializerAdds].filter((init) => read.has(init.name!))
  const names = new Set(kept.flatMap((node) => node.output ?? []))
  graph.valueInfo = (graph.valueInfo ?? []).filter((info) => names.has(info.name!) && !addedOutputs.has(info.name!))
  graph.input = [
    ...(graph.input ?? []),
    {
      name: sharedCacheInputs.seqlens,
      type: { tensorType: { elemType: INT32, shape: { dim: [{ dimParam: "batch_size" }] } } }
    },
    { name: sharedCacheInputs.total, type: { tensorType: { elemType: INT32, shape: { dim: [] } } } }
  ]
  if (!(model.opsetImport ?? []).some((entry) => entry.domain === "com.microsoft"))
    model.opsetImport = [...(model.opsetImport ?? []), { domain: "com.microsoft", version: 1 }]
  return { bytes: onnx.ModelProto.encode(model).finish(), layers }

  function pastKey(name: string): string {
    const match = pastPattern.exec(name)
    return match === null || !inputs.has(name) ? "" : `${match[1]}.${match[2]}`
  }
}
