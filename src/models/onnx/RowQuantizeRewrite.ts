import onnxProto from "onnx-proto"

const { onnx } = onnxProto

/**
 * A load-time rewrite of dynamic activation quantisation (the community's q8, int8 and uint8
 * exports) from one scale over the whole input to one scale per batch row, so that a request's
 * numbers do not depend on the requests batched beside it.
 *
 * `DynamicQuantizeLinear(x)` takes the range of all of x (min with 0, max with 0), its scale
 * (range / 255) and zero point (round(−min / scale), clamped to [0, 255]), and quantises x with
 * them. Here each batch row (x's first axis) gets its own: x is flattened to [rows, n], reduced
 * over n, and quantised by a per-axis QuantizeLinear: for a batch of one row, exactly what the
 * original computes, bit for bit. The row's scale is shaped [rows, 1, …] for the Muls that
 * apply it. `MatMulInteger` takes only one activation zero point, so each consumer runs with a
 * zero point of 0 and the product is corrected by the row's zero point times the weights' column
 * sums (less their zero point): Σ(a − z)(w − zw) = Σ a(w − zw) − z·Σ(w − zw), exact in int32.
 * Given `readWeight` (an initializer's bytes, wherever they are), the sums are computed here, one
 * weight at a time, and added as constants; otherwise they are nodes of the graph, which ONNX
 * Runtime folds at load through an int32 copy of each weight (at a 1B model's size: minutes, and
 * 11 GB).
 *
 * Rewritten only when every node that reads a DynamicQuantizeLinear's outputs is a MatMulInteger
 * (its quantised value and zero point, as inputs 0 and 2) or a Mul (its scale); otherwise the
 * model is given back as it is. A prompt's rows still mix its tokens in one scale, as the original
 * does for a prompt alone; a batch of prompts of different lengths would mix in the padding, so
 * prompts are not batched on such a model.
 */

type NodeProto = onnxProto.onnx.INodeProto
type TensorProto = onnxProto.onnx.ITensorProto

const { INT64, INT32, INT8, UINT8, FLOAT } = onnx.TensorProto.DataType

const tensor = (name: string, dataType: number, dims: ReadonlyArray<number>, raw: ArrayBufferView): TensorProto => ({
  name,
  dims: [...dims],
  dataType,
  rawData: new Uint8Array(raw.buffer, raw.byteOffset, raw.byteLength)
})

/** The default domain's opset the model imports. */
const opsetOf = (model: onnxProto.onnx.IModelProto): number =>
  Number(model.opsetImport?.find((entry) => (entry.domain ?? "") === "")?.version ?? 0)

export const rewriteRowQuantization = (
  bytes: Uint8Array,
  readWeight?: (tensor: TensorProto) => Uint8Array | undefined
): { readonly bytes: Uint8Array; readonly rewritten: number } => {
  const model = onnx.ModelProto.decode(bytes)
  const graph = model.graph
  const unchanged = { bytes, rewritten: 0 }
  if (graph?.node == null) return unchanged
  const quantizers = graph.node.filter((node) => node.opType === "DynamicQuantizeLinear" && (node.domain ?? "") === "")
  const initializers = new Map((graph.initializer ?? []).map((init) => [init.name!, init]))
  if (quantizers.length === 0) return unchanged
  const opset = opsetOf(model)
  // ReduceSum's axes became an input at 13, ReduceMax's at 18; per-axis QuantizeLinear needs 13.
  if (opset < 13) return unchanged

  const readers = new Map<string, Array<{ readonly node: NodeProto; readonly input: number }>>()
  for (const node of graph.node)
    (node.input ?? []).forEach((name, input) => {
      if (name === "") return
      const list = readers.get(name) ?? []
      list.push({ node, input })
      readers.set(name, list)
    })
  const graphOutputs = new Set((graph.output ?? []).map((value) => value.name))
  for (const quantizer of quantizers) {
    const [value, scale, zero] = quantizer.output ?? []
    if (value === undefined || scale === undefined || zero === undefined) return unchanged
    if ([value, scale, zero].some((name) => graphOutputs.has(name))) return unchanged
    const valueReaders = readers.get(value) ?? []
    const zeroReaders = readers.get(zero) ?? []
    if (!valueReaders.every(({ node, input }) => node.opType === "MatMulInteger" && input === 0)) return unchanged
    if (!zeroReaders.every(({ node, input }) => node.opType === "MatMulInteger" && input === 2)) return unchanged
    if (!valueReaders.every(({ node }) => node.input?.[2] === zero)) return unchanged
    if (!(readers.get(scale) ?? []).every(({ node }) => node.opType === "Mul")) return unchanged
  }

  const added: Array<TensorProto> = [
    tensor("row_quant/zero_f", FLOAT, [], Float32Array.of(0)),
    tensor("row_quant/one_f", FLOAT, [], Float32Array.of(1)),
    tensor("row_quant/range_f", FLOAT, [], Float32Array.of(255)),
    tensor("row_quant/zero_u8", UINT8, [], Uint8Array.of(0)),
    tensor("row_quant/flat", INT64, [2], BigInt64Array.of(0n, -1n)),
    tensor("row_quant/rows", INT64, [1], BigInt64Array.of(-1n)),
    ...(opset >= 18 ? [tensor("row_quant/axis1", INT64, [1], BigInt64Array.of(1n))] : []),
    tensor("row_quant/one_i64", INT64, [1], BigInt64Array.of(1n))
  ]
  /** Each DynamicQuantizeLinear's per-row nodes. */
  const replaced = new Map<NodeProto, Array<NodeProto>>()
  /** MatMulIntegers whose product the correction replaces, and the nodes that compute it instead. */
  const corrected = new Map<NodeProto, Array<NodeProto>>()
  quantizers.forEach((quantizer, index) => {
    const [x] = quantizer.input!
    const [value, scale, zero] = quantizer.output!
    const n = (name: string) => `row_quant/${index}/${name}`
    const node = (
      opType: string,
      inputs: ReadonlyArray<string>,
      outputs: ReadonlyArray<string>,
      attrs: Array<onnxProto.onnx.IAttributeProto> = []
    ): NodeProto => ({
      opType,
      domain: "",
      name: n(`${opType}_${outputs[0]}`),
      input: [...inputs],
      output: [...outputs],
      attribute: attrs
    })
    const reduce = (opType: "ReduceMax" | "ReduceMin", input: string, output: string) =>
      opset >= 18
        ? node(
            opType,
            [input, "row_quant/axis1"],
            [output],
            [{ name: "keepdims", type: onnx.AttributeProto.AttributeType.INT, i: 1 }]
          )
        : node(
            opType,
            [input],
            [output],
            [
              { name: "axes", type: onnx.AttributeProto.AttributeType.INTS, ints: [1] },
              { name: "keepdims", type: onnx.AttributeProto.AttributeType.INT, i: 1 }
            ]
          )
    const nodes: Array<NodeProto> = [
      // [rows, n], each row's range with 0 in it.
      node("Reshape", [x!, "row_quant/flat"], [n("flat")]),
      reduce("ReduceMax", n("flat"), n("max")),
      reduce("ReduceMin", n("flat"), n("min")),
      node("Max", [n("max"), "row_quant/zero_f"], [n("max0")]),
      node("Min", [n("min"), "row_quant/zero_f"], [n("min0")]),
      // scale = (max − min) / 255, or 1 for a row of zeros.
      node("Sub", [n("max0"), n("min0")], [n("span")]),
      node("Div", [n("span"), "row_quant/range_f"], [n("scaled")]),
      node("Equal", [n("max0"), n("min0")], [n("flat_row")]),
      node("Where", [n("flat_row"), "row_quant/one_f", n("scaled")], [n("scale2")]),
      // zero point = round(clamp(0 − min / scale, 0, 255)), half to even.
      node("Div", [n("min0"), n("scale2")], [n("min_steps")]),
      node("Sub", ["row_quant/zero_f", n("min_steps")], [n("zero_f")]),
      node("Clip", [n("zero_f"), "row_quant/zero_f", "row_quant/range_f"], [n("zero_clipped")]),
      node("Round", [n("zero_clipped")], [n("zero_rounded")]),
      node(
        "Cast",
        [n("zero_rounded")],
        [n("zero_u8_2")],
        [{ name: "to", type: onnx.AttributeProto.AttributeType.INT, i: UINT8 }]
      ),
      node("Reshape", [n("scale2"), "row_quant/rows"], [n("scale1")]),
      node("Reshape", [n("zero_u8_2"), "row_quant/rows"], [n("zero1")]),
      node(
        "QuantizeLinear",
        [n("flat"), n("scale1"), n("zero1")],
        [n("quantized_flat")],
        [{ name: "axis", type: onnx.AttributeProto.AttributeType.INT, i: 0 }]
      ),
      node("Shape", [x!], [n("shape")]),
      node("Reshape", [n("quantized_flat"), n("shape")], [value!]),
      // [rows, 1, …, 1] of x's rank, for the scale's and zero point's consumers.
      node("Shape", [n("shape")], [n("rank")]),
      node("Sub", [n("rank"), "row_quant/one_i64"], [n("rest")]),
      node(
        "ConstantOfShape",
        [n("rest")],
        [n("ones")],
        [
          {
            name: "value",
            type: onnx.AttributeProto.AttributeType.TENSOR,
            t: tensor("", INT64, [1], BigInt64Array.of(1n))
          }
        ]
      ),
      node(
        "Concat",
        ["row_quant/rows", n("ones")],
        [n("row_shape")],
        [{ name: "axis", type: onnx.AttributeProto.AttributeType.INT, i: 0 }]
      ),
      node("Reshape", [n("scale1"), n("row_shape")], [scale!]),
      node(
        "Cast",
        [n("zero1")],
        [n("zero_i32_1")],
        [{ name: "to", type: onnx.AttributeProto.AttributeType.INT, i: INT32 }]
      ),
      node("Reshape", [n("zero_i32_1"), n("row_shape")], [zero!])
    ]
    replaced.set(quantizer, nodes)

    for (const { node: matMul } of readers.get(value!) ?? []) {
      const [, weight, , weightZero] = matMul.input!
      const [product] = matMul.output!
      const m = (name: string) => `${n(name)}/${product}`
      const weightInputs = weightZero === undefined || weightZero === "" ? [] : [weightZero]
      const sums = readWeight === undefined ? undefined : columnSums(initializers, weight!, weightZero, readWeight)
      if (sums !== undefined) {
        added.push(tensor(m("colsum"), INT32, [sums.length], sums))
        corrected.set(matMul, [
          { ...matMul, input: [value!, weight!, "row_quant/zero_u8", ...weightInputs], output: [m("raw")] },
          node("Mul", [zero!, m("colsum")], [m("correction")]),
          node("Sub", [m("raw"), m("correction")], [product!])
        ])
        continue
      }
      const fix: Array<NodeProto> = [
        { ...matMul, input: [value!, weight!, "row_quant/zero_u8", ...weightInputs], output: [m("raw")] },
        node("Cast", [weight!], [m("w_i32")], [{ name: "to", type: onnx.AttributeProto.AttributeType.INT, i: INT32 }]),
        ...(weightInputs.length === 0
          ? [node("Identity", [m("w_i32")], [m("w_centered")])]
          : [
              node(
                "Cast",
                [weightZero!],
                [m("wz_i32")],
                [{ name: "to", type: onnx.AttributeProto.AttributeType.INT, i: INT32 }]
              ),
              node("Sub", [m("w_i32"), m("wz_i32")], [m("w_centered")])
            ]),
        // Σ over the weights' input axis (their second to last), for each output column.
        node("Shape", [m("w_centered")], [m("w_shape")]),
        node("Shape", [m("w_shape")], [m("w_rank")]),
        node("Sub", [m("w_rank"), tensorName(added, "two", 2n)], [m("in_axis")]),
        node(
          "ReduceSum",
          [m("w_centered"), m("in_axis")],
          [m("colsum")],
          [{ name: "keepdims", type: onnx.AttributeProto.AttributeType.INT, i: 0 }]
        ),
        node("Mul", [zero!, m("colsum")], [m("correction")]),
        node("Sub", [m("raw"), m("correction")], [product!])
      ]
      corrected.set(matMul, fix)
    }
  })
  const nodes: Array<NodeProto> = []
  for (const node of graph.node) {
    const perRow = replaced.get(node)
    if (perRow !== undefined) {
      nodes.push(...perRow)
      continue
    }
    const fix = corrected.get(node)
    if (fix !== undefined) nodes.push(...fix)
    else nodes.push(node)
  }
  graph.node = nodes
  graph.initializer = [...(graph.initializer ?? []), ...added]
  return { bytes: onnx.ModelProto.encode(model).finish(), rewritten: quantizers.length }
}

/**
 * The weight's column sums less its zero point (int32, one per output), when the weight is a 2-D
 * int8 or uint8 initializer whose zero point is a scalar initializer (or absent).
 */
const columnSums = (
  initializers: ReadonlyMap<string, TensorProto>,
  weight: string,
  weightZero: string | undefined,
  readWeight: (tensor: TensorProto) => Uint8Array | undefined
): Int32Array | undefined => {
  const tensor = initializers.get(weight)
  const dims = (tensor?.dims ?? []).map(Number)
  if (tensor === undefined || dims.length !== 2 || (tensor.dataType !== INT8 && tensor.dataType !== UINT8))
    return undefined
  const signed = tensor.dataType === INT8
  let zeroPoint = 0
  if (weightZero !== undefined && weightZero !== "") {
    const zero = initializers.get(weightZero)
    const zeroBytes = zero === undefined ? undefined : readWeight(zero)
    if (zeroBytes === undefined || zeroBytes.length !== 1) return undefined
    zeroPoint = signed ? new Int8Array(zeroBytes.buffer, zeroBytes.byteOffset, 1)[0]! : zeroBytes[0]!
  }
  const raw = readWeight(tensor)
  const [rows, columns] = dims as [number, number]
  if (raw === undefined || raw.length !== rows * columns) return undefined
  const codes = signed ? new Int8Array(raw.buffer, raw.byteOffset, raw.length) : raw
  const sums = new Int32Array(columns).fill(-zeroPoint * rows)
  for (let row = 0; row < rows; row++) {
    const start = row * columns
    for (let column = 0; column < columns; column++) sums[column]! += codes[start + column]!
  }
  return sums
}

/** An int64 scalar-vector constant among `added`, made once. */
const tensorName = (added: Array<TensorProto>, name: string, value: bigint): string => {
  const full = `row_quant/${name}`
  if (!added.some((entry) => entry.name === full)) added.push(tensor(full, INT64, [1], BigInt64Array.of(value)))
  return full
}
