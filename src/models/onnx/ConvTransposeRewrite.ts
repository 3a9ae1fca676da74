import onnxProto from "onnx-proto"

const { onnx } = onnxProto

/**
 * A load-time rewrite of 1-D transposed convolutions into polyphase convolutions: ONNX Runtime's
 * CPU ConvTranspose multiplies into columns and scatters them back (col2im), about half as fast a
 * multiply-add as its Conv, and the upsamplers of audio decoders (Mimi's SEANet, HiFi-GAN) spend
 * most of their time there.
 *
 * A ConvTranspose of stride r and kernel k = m·r (a kernel not a multiple of r is padded with zero
 * taps) writes output t = q·r + p as Σ_j W[:, :, p + j·r] · x[q − j], j < m: for each phase p a
 * plain convolution of kernel m over the input. So one Conv with C_out·r output channels (channel
 * o·r + p is phase p of output channel o, its taps reversed, its bias o's), padded m − 1 on each side,
 * computes every phase at once; reshaped [batch, C_out, r, steps], transposed to [batch, C_out,
 * steps, r] and flattened, it is the transposed convolution's whole output, which a Slice trims to
 * its pads. Pads that trim whole steps are taken from the Conv's padding instead, so a causal
 * decoder's right trim costs nothing. The same sums in another order: equal within float rounding.
 *
 * Rewritten: group 1, 1-D, dilation 1, no output_padding or output_shape, explicit pads, and a
 * float32 kernel (and bias) stored in the file. Anything else is left as it is.
 */

type NodeProto = onnxProto.onnx.INodeProto
type TensorProto = onnxProto.onnx.ITensorProto

const floatsOf = (tensor: TensorProto): Float32Array | undefined => {
  if (tensor.dataType !== onnx.TensorProto.DataType.FLOAT) return undefined
  if (tensor.rawData != null && tensor.rawData.length > 0) {
    const raw = tensor.rawData
    return new Float32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength))
  }
  if (tensor.floatData != null && tensor.floatData.length > 0) return Float32Array.from(tensor.floatData)
  return undefined
}

const attribute = (node: NodeProto, name: string) => node.attribute?.find((a) => a.name === name)
const ints = (node: NodeProto, name: string): ReadonlyArray<number> | undefined =>
  attribute(node, name)?.ints?.map(Number)
const int = (node: NodeProto, name: string): number | undefined => {
  const found = attribute(node, name)
  return found?.i == null ? undefined : Number(found.i)
}

const int64Tensor = (name: string, values: ReadonlyArray<number>): TensorProto => ({
  name,
  dims: [values.length],
  dataType: onnx.TensorProto.DataType.INT64,
  rawData: new Uint8Array(BigInt64Array.from(values, BigInt).buffer)
})

const floatTensor = (name: string, dims: ReadonlyArray<number>, data: Float32Array): TensorProto => ({
  name,
  dims: [...dims],
  dataType: onnx.TensorProto.DataType.FLOAT,
  rawData: new Uint8Array(data.buffer, data.byteOffset, data.byteLength)
})

/** The nodes (and new initializers) that compute `node` as a polyphase Conv, or undefined to keep it. */
const polyphase = (
  node: NodeProto,
  initializers: ReadonlyMap<string, TensorProto>
): { readonly nodes: ReadonlyArray<NodeProto>; readonly initializers: ReadonlyArray<TensorProto> } | undefined => {
  const [input, weightName, biasName] = node.input ?? []
  const output = node.output?.[0]
  if (input === undefined || weightName === undefined || output === undefined) return undefined
  if ((int(node, "group") ?? 1) !== 1) return undefined
  if (attribute(node, "output_shape") !== undefined) return undefined
  if ((ints(node, "output_padding") ?? [0]).some((v) => v !== 0)) return undefined
  if ((ints(node, "dilations") ?? [1]).some((v) => v !== 1)) return undefined
  const autoPad = attribute(node, "auto_pad")?.s
  if (autoPad != null && new TextDecoder().decode(autoPad) !== "NOTSET") return undefined
  const weight = initializers.get(weightName)
  const dims = weight?.dims?.map(Number)
  if (weight === undefined || dims === undefined || dims.length !== 3) return undefined
  const kernelData = floatsOf(weight)
  const [inputs, outputs, kernel] = dims as [number, number, number]
  const strides = ints(node, "strides") ?? [1]
  const stride = strides[0]!
  if (kernelData === undefined || strides.length !== 1 || stride < 2) return undefined
  let bias: Float32Array | undefined
  if (biasName !== undefined && biasName !== "") {
    const tensor = initializers.get(biasName)
    bias = tensor === undefined ? undefined : floatsOf(tensor)
    if (bias === undefined) return undefined
  }
  const [padBegin, padEnd] = (ints(node, "pads") ?? [0, 0]) as [number, number]

  const taps = Math.ceil(kernel / stride)
  // Zero taps past the kernel add outputs past the transposed convolution's end: trimmed with its pads.
  let trimEnd = padEnd + (taps * stride - kernel)
  let trimBegin = padBegin
  // Whole steps trimmed are steps the Conv need not pad for.
  const rightSteps = Math.max(0, taps - 1 - Math.floor(trimEnd / stride))
  trimEnd -= (taps - 1 - rightSteps) * stride
  const leftSteps = Math.max(0, taps - 1 - Math.floor(trimBegin / stride))
  trimBegin -= (taps - 1 - leftSteps) * stride

  const phases = new Float32Array(outputs * stride * inputs * taps)
  for (let o = 0; o < outputs; o++)
    for (let p = 0; p < stride; p++)
      for (let c = 0; c < inputs; c++)
        for (let j = 0; j < taps; j++) {
          const tap = p + j * stride
          if (tap < kernel)
            phases[((o * stride + p) * inputs + c) * taps + (taps - 1 - j)] =
              kernelData[(c * outputs + o) * kernel + tap]!
        }
  const name = node.name ?? output
  const prefix = `${name}/polyphase`
  const newInitializers: Array<TensorProto> = [
    floatTensor(`${prefix}/weight`, [outputs * stride, inputs, taps], phases),
    int64Tensor(`${prefix}/phases_shape`, [0, outputs, stride, -1]),
    int64Tensor(`${prefix}/output_shape`, [0, outputs, -1])
  ]
  if (bias !== undefined)
    newInitializers.push(
      floatTensor(
        `${prefix}/bias`,
        [outputs * stride],
        Float32Array.from({ length: outputs * stride }, (_, i) => bias[Math.floor(i / stride)]!)
      )
    )
  const trims = trimBegin > 0 || trimEnd > 0
  const interleaved = trims ? `${prefix}/interleaved` : output
  const nodes: Array<NodeProto> = [
    {
      opType: "Conv",
      name: `${prefix}/Conv`,
      input: [input, `${prefix}/weight`, ...(bias === undefined ? [] : [`${prefix}/bias`])],
      output: [`${prefix}/phases`],
      attribute: [
        { name: "kernel_shape", type: onnx.AttributeProto.AttributeType.INTS, ints: [taps] },
        { name: "pads", type: onnx.AttributeProto.AttributeType.INTS, ints: [leftSteps, rightSteps] }
      ]
    },
    {
      opType: "Reshape",
      name: `${prefix}/Reshape`,
      input: [`${prefix}/phases`, `${prefix}/phases_shape`],
      output: [`${prefix}/by_phase`]
    },
    {
      opType: "Transpose",
      name: `${prefix}/Transpose`,
      input: [`${prefix}/by_phase`],
      output: [`${prefix}/by_step`],
      attribute: [{ name: "perm", type: onnx.AttributeProto.AttributeType.INTS, ints: [0, 1, 3, 2] }]
    },
    {
      opType: "Reshape",
      name: `${prefix}/Flatten`,
      input: [`${prefix}/by_step`, `${prefix}/output_shape`],
      output: [interleaved]
    }
  ]
  if (trims) {
    newInitializers.push(
      int64Tensor(`${prefix}/starts`, [trimBegin]),
      int64Tensor(`${prefix}/ends`, [trimEnd > 0 ? -trimEnd : Number.MAX_SAFE_INTEGER]),
      int64Tensor(`${prefix}/axes`, [2])
    )
    nodes.push({
      opType: "Slice",
      name: `${prefix}/Slice`,
      input: [interleaved, `${prefix}/starts`, `${prefix}/ends`, `${prefix}/axes`],
      output: [output]
    })
  }
  return { nodes, initializers: newInitializers }
}

/**
 * The model file with its rewritable ConvTranspose nodes as polyphase Convs; `rewritten` counts
 * them (0: the bytes given back as they are). Kernels no other node reads are dropped.
 */
export const rewriteConvTransposes = (
  bytes: Uint8Array
): { readonly bytes: Uint8Array; readonly rewritten: number } => {
  const model = onnx.ModelProto.decode(bytes)
  const graph = model.graph
  if (graph?.node == null || !graph.node.some((node) => node.opType === "ConvTranspose" && (node.domain ?? "") === ""))
    return { bytes, rewritten: 0 }
  const initializers = new Map((graph.initializer ?? []).map((tensor) => [tensor.name ?? "", tensor]))
  const nodes: Array<NodeProto> = []
  const added: Array<TensorProto> = []
  const replacedKernels = new Set<string>()
  let rewritten = 0
  for (const node of graph.node) {
    const replacement =
      node.opType === "ConvTranspose" && (node.domain ?? "") === "" ? polyphase(node, initializers) : undefined
    if (replacement === undefined) {
      nodes.push(node)
      continue
    }
    nodes.push(...replacement.nodes)
    added.push(...replacement.initializers)
    for (const name of node.input!.slice(1)) if (name !== "") replacedKernels.add(name)
    rewritten++
  }
  if (rewritten === 0) return { bytes, rewritten: 0 }
  const stillRead = new Set(nodes.flatMap((node) => node.input ?? []))
  graph.node = nodes
  graph.initializer = [
    ...(graph.initializer ?? []).filter(
      (tensor) => !replacedKernels.has(tensor.name ?? "") || stillRead.has(tensor.name ?? "")
    ),
    ...added
  ]
  return { bytes: onnx.ModelProto.encode(model).finish(), rewritten }
}
