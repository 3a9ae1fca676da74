import onnxProto from "onnx-proto"
import * as ort from "onnxruntime-node"
import { describe, expect, it } from "vitest"
import { elementType, Graph } from "../../src/models/onnx/Graph.js"
import { rewriteRowQuantization } from "../../src/models/onnx/RowQuantizeRewrite.js"
import { Random } from "../../src/models/Random.js"

const { onnx } = onnxProto

/**
 * The per-row rewrite of dynamic activation quantisation: for one row, the same numbers as the
 * exported graph, bit for bit; for a batch, each row's numbers are its numbers alone.
 */

const inputs = 24
const outputs = 10

/** x [batch, seq, 24] → DynamicQuantizeLinear → MatMulInteger → Cast → Mul(x_scale · w_scale), as quantize_dynamic writes it. */
const quantizedLinear = (weights: "int8" | "uint8", perColumnZero: boolean, extraScaleReader = false) => {
  const random = new Random(5)
  const g = new Graph("q")
  const x = g.input("x", "float32", ["batch", "seq", inputs])
  const codes =
    weights === "int8"
      ? Int8Array.from({ length: inputs * outputs }, () => random.below(255) - 127)
      : Uint8Array.from({ length: inputs * outputs }, () => random.below(256))
  const w = g.weight("w", weights, [inputs, outputs], codes)
  const zeros = perColumnZero
    ? weights === "int8"
      ? Int8Array.from({ length: outputs }, () => random.below(9) - 4)
      : Uint8Array.from({ length: outputs }, () => 124 + random.below(9))
    : weights === "int8"
      ? Int8Array.of(0)
      : Uint8Array.of(128)
  const wZero = g.weight("w_zero", weights, perColumnZero ? [outputs] : [], zeros)
  const [q, scale, zero] = g.opWithOutputs("DynamicQuantizeLinear", [x], 3)
  const product = g.op("MatMulInteger", [q!, w, zero!, wZero])
  const scales = g.op("Mul", [scale!, g.weight("w_scale", "float32", [], Float32Array.of(0.013))])
  const y = g.op("Mul", [g.op("Cast", [product], { to: elementType("float32") }), scales])
  g.output(y, "y", "float32", ["batch", "seq", outputs])
  if (extraScaleReader) g.output(g.op("Identity", [scale!]), "scale", "float32", [])
  return g.toBytes()
}

const run = async (model: Uint8Array, x: Float32Array, dims: ReadonlyArray<number>) => {
  const session = await ort.InferenceSession.create(model, { intraOpNumThreads: 1 })
  try {
    return (await session.run({ x: new ort.Tensor("float32", x, dims) })).y!.data as Float32Array
  } finally {
    await session.release()
  }
}

describe("rewriteRowQuantization", () => {
  const random = new Random(8)
  // Rows of different ranges, one of them all zeros, one positive only.
  const rows = [
    random.normals(3 * inputs, 1),
    random.normals(3 * inputs, 40),
    new Float32Array(3 * inputs),
    Float32Array.from(random.normals(3 * inputs, 2), Math.abs)
  ]

  it.each([
    ["int8", false, "graph"],
    ["uint8", false, "graph"],
    ["int8", true, "graph"],
    ["uint8", true, "graph"],
    ["int8", false, "read"],
    ["uint8", false, "read"],
    ["uint8", true, "read"]
  ] as const)(
    "%s weights (per-column zero point: %s), column sums from the %s: a row alone as exported, bit for bit; batched, as alone",
    async (weights, perColumn, sums) => {
      const original = quantizedLinear(weights, perColumn)
      // "read": the weights' bytes given, the sums are computed (a scalar zero point) and added as constants.
      const { bytes, rewritten } = rewriteRowQuantization(
        original,
        sums === "read" ? (tensor) => tensor.rawData ?? undefined : undefined
      )
      const reduces = onnx.ModelProto.decode(bytes).graph!.node!.filter((node) => node.opType === "ReduceSum").length
      expect(reduces).toBe(sums === "read" && !perColumn ? 0 : 1)
      expect(rewritten).toBe(1)
      const alone: Array<Float32Array> = []
      for (const row of rows) {
        const exported = await run(original, row, [1, 3, inputs])
        const perRow = await run(bytes, row, [1, 3, inputs])
        expect(perRow).toEqual(exported)
        alone.push(perRow)
      }
      const batch = new Float32Array(rows.length * 3 * inputs)
      rows.forEach((row, i) => batch.set(row, i * row.length))
      const together = await run(bytes, batch, [rows.length, 3, inputs])
      rows.forEach((_, i) => expect(together.subarray(i * 3 * outputs, (i + 1) * 3 * outputs)).toEqual(alone[i]))
      // The exported graph batched: one scale over all rows changes the small rows' numbers.
      const exportedTogether = await run(original, batch, [rows.length, 3, inputs])
      expect(exportedTogether.subarray(0, 3 * outputs)).not.toEqual(alone[0])
    }
  )

  it("at opset 18, where ReduceMax takes its axes as an input: the same numbers", async () => {
    const decoded = onnx.ModelProto.decode(quantizedLinear("uint8", true))
    decoded.opsetImport = [{ domain: "", version: 18 }]
    const original = onnx.ModelProto.encode(decoded).finish()
    const { bytes, rewritten } = rewriteRowQuantization(original)
    expect(rewritten).toBe(1)
    for (const row of rows)
      expect(await run(bytes, row, [1, 3, inputs])).toEqual(await run(original, row, [1, 3, inputs]))
  })

  it("gives a graph back as it is when a quantizer's output is read by anything else", () => {
    const model = quantizedLinear("int8", false, true)
    expect(rewriteRowQuantization(model)).toEqual({ bytes: model, rewritten: 0 })
  })
})
