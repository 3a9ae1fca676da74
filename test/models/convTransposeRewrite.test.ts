import * as ort from "onnxruntime-node"
import onnxProto from "onnx-proto"
import { describe, expect, it } from "vitest"
import { Graph } from "../../src/models/onnx/Graph.js"
import { rewriteConvTransposes } from "../../src/models/onnx/ConvTransposeRewrite.js"
import { Random } from "../../src/models/Random.js"

/**
 * The polyphase rewrite of transposed convolutions: for the strides, kernels (multiples of the
 * stride or not), pads (none, causal, symmetric, uneven) and biases audio decoders use, the
 * rewritten graph has no ConvTranspose left and answers as the original does within float
 * rounding, for inputs of any length; what it cannot rewrite it leaves as it is.
 */

interface Case {
  readonly inputs: number
  readonly outputs: number
  readonly kernel: number
  readonly stride: number
  readonly pads?: readonly [number, number]
  readonly bias?: boolean
  readonly group?: number
}

const modelOf = (c: Case, seed: number) => {
  const random = new Random(seed)
  const g = new Graph("conv_transpose")
  const x = g.input("x", "float32", ["batch", c.inputs, "steps"])
  const group = c.group ?? 1
  const weight = g.weight(
    "weight",
    "float32",
    [c.inputs, c.outputs / group, c.kernel],
    random.normals((c.inputs * c.outputs * c.kernel) / group, 0.3)
  )
  const bias = c.bias === false ? [] : [g.weight("bias", "float32", [c.outputs], random.normals(c.outputs, 0.1))]
  const y = g.op("ConvTranspose", [x, weight, ...bias], {
    kernel_shape: [c.kernel],
    strides: [c.stride],
    ...(c.pads === undefined ? {} : { pads: [...c.pads] }),
    ...(group === 1 ? {} : { group })
  })
  // Something after it, as in a decoder.
  g.output(g.op("Elu", [y]), "y", "float32", ["batch", c.outputs, "samples"])
  return g.toBytes()
}

const opTypes = (bytes: Uint8Array) => onnxProto.onnx.ModelProto.decode(bytes).graph!.node!.map((node) => node.opType)

describe("rewriteConvTransposes", () => {
  it.each<Case>([
    { inputs: 6, outputs: 4, kernel: 4, stride: 2, pads: [0, 2] },
    { inputs: 8, outputs: 4, kernel: 8, stride: 4, pads: [2, 2] },
    { inputs: 3, outputs: 5, kernel: 5, stride: 2, bias: false },
    { inputs: 4, outputs: 2, kernel: 16, stride: 8, pads: [3, 9] },
    { inputs: 5, outputs: 3, kernel: 3, stride: 3, pads: [1, 0] },
    { inputs: 4, outputs: 4, kernel: 12, stride: 6, pads: [0, 6] }
  ])("answers as the ConvTranspose did: kernel $kernel, stride $stride, pads $pads", async (c) => {
    const original = modelOf(c, c.kernel * 31 + c.stride)
    const { bytes, rewritten } = rewriteConvTransposes(original)
    expect(rewritten).toBe(1)
    expect(opTypes(bytes)).not.toContain("ConvTranspose")
    const [before, after] = await Promise.all([
      ort.InferenceSession.create(original),
      ort.InferenceSession.create(bytes)
    ])
    try {
      for (const steps of [1, 2, 7, 33]) {
        const random = new Random(steps)
        const x = new ort.Tensor("float32", random.normals(2 * c.inputs * steps, 1), [2, c.inputs, steps])
        const expected = (await before.run({ x })).y!
        const got = (await after.run({ x })).y!
        expect(got.dims).toEqual(expected.dims)
        const a = expected.data as Float32Array
        const b = got.data as Float32Array
        let most = 0
        for (let i = 0; i < a.length; i++) most = Math.max(most, Math.abs(a[i]! - b[i]!))
        expect(most, `${steps} steps`).toBeLessThan(1e-5)
      }
    } finally {
      await Promise.all([before.release(), after.release()])
    }
  })

  it("leaves what it cannot rewrite as it is: grouped, stride 1, and a graph without any", () => {
    const grouped = modelOf({ inputs: 4, outputs: 4, kernel: 4, stride: 2, pads: [0, 2], group: 4 }, 1)
    expect(rewriteConvTransposes(grouped)).toEqual({ bytes: grouped, rewritten: 0 })
    const strideOne = modelOf({ inputs: 4, outputs: 4, kernel: 3, stride: 1 }, 2)
    expect(rewriteConvTransposes(strideOne).rewritten).toBe(0)
    const g = new Graph("plain")
    g.output(g.op("Elu", [g.input("x", "float32", [1, 2])]), "y", "float32", [1, 2])
    const plain = g.toBytes()
    expect(rewriteConvTransposes(plain).bytes).toBe(plain)
  })
})
