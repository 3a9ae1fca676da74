import onnxProto from "onnx-proto"

const { onnx } = onnxProto

/**
 * A small typed builder for ONNX graphs (opset 17, IR version 8), so that models are written as
 * TypeScript and serialized with onnx-proto. Names are derived from a counter and the current
 * scope only, so the same sequence of calls always yields byte-identical files.
 */

export type DataType = "float32" | "float16" | "float64" | "int64" | "int32" | "int16" | "int8" | "uint8" | "bool"

/** A dimension: a fixed size, or a symbolic name such as "batch_size". */
export type Dim = number | string

/** Tensor contents; float16 values are their IEEE half bit patterns in a Uint16Array. */
export type TensorData =
  | Float32Array
  | Float64Array
  | BigInt64Array
  | Int32Array
  | Int16Array
  | Int8Array
  | Uint8Array
  | Uint16Array

/** A tensor flowing through the graph under construction. */
export interface Value {
  readonly name: string
}

/** Attribute values: integers, integer lists, strings, and floats wrapped with `float`. */
export type AttributeValue = number | ReadonlyArray<number> | string | { readonly float: number }

/** Marks a number as a float attribute (plain numbers are integer attributes). */
export const float = (value: number): { readonly float: number } => ({ float: value })

const opsetVersion = 17
const irVersion = 8

const elementTypes: Record<DataType, number> = {
  float32: onnx.TensorProto.DataType.FLOAT,
  float16: onnx.TensorProto.DataType.FLOAT16,
  float64: onnx.TensorProto.DataType.DOUBLE,
  int64: onnx.TensorProto.DataType.INT64,
  int32: onnx.TensorProto.DataType.INT32,
  int16: onnx.TensorProto.DataType.INT16,
  int8: onnx.TensorProto.DataType.INT8,
  uint8: onnx.TensorProto.DataType.UINT8,
  bool: onnx.TensorProto.DataType.BOOL
}

/** ONNX's numeric code for a data type (the `to` attribute of Cast). */
export const elementType = (dataType: DataType): number => elementTypes[dataType]

const valueInfo = (name: string, dataType: DataType, shape: ReadonlyArray<Dim>): onnxProto.onnx.IValueInfoProto => ({
  name,
  type: {
    tensorType: {
      elemType: elementTypes[dataType],
      shape: { dim: shape.map((dim) => (typeof dim === "number" ? { dimValue: dim } : { dimParam: dim })) }
    }
  }
})

const attributeProto = (name: string, value: AttributeValue): onnxProto.onnx.IAttributeProto => {
  const { AttributeType } = onnx.AttributeProto
  if (typeof value === "string") return { name, type: AttributeType.STRING, s: new TextEncoder().encode(value) }
  if (typeof value === "number") {
    if (!Number.isInteger(value))
      throw new Error(`attribute ${name}: ${value} is not an integer; wrap floats with float()`)
    return { name, type: AttributeType.INT, i: value }
  }
  if ("float" in value) return { name, type: AttributeType.FLOAT, f: value.float }
  return { name, type: AttributeType.INTS, ints: [...value] }
}

const rawBytes = (data: TensorData): Uint8Array => {
  // ONNX raw_data is little-endian, which is the byte order of typed arrays on every platform Node runs on.
  return new Uint8Array(data.buffer, data.byteOffset, data.byteLength)
}

const expectedArray: Record<DataType, string> = {
  float32: "Float32Array",
  float16: "Uint16Array",
  float64: "Float64Array",
  int64: "BigInt64Array",
  int32: "Int32Array",
  int16: "Int16Array",
  int8: "Int8Array",
  uint8: "Uint8Array",
  bool: "Uint8Array"
}

/** The domain of ONNX Runtime's contrib operators (MatMulNBits, MatMulBnb4, ...). */
export const microsoftDomain = "com.microsoft"

/** Where initializers of at least `minBytes` go instead of the model file (ONNX external data). */
export interface ExternalDataOptions {
  /** The data file's name, beside the model file ("model.onnx_data"). */
  readonly location: string
  readonly minBytes: number
}

export class Graph {
  private readonly nodes: Array<onnxProto.onnx.INodeProto> = []
  private readonly initializers: Array<onnxProto.onnx.ITensorProto> = []
  private readonly inputs: Array<onnxProto.onnx.IValueInfoProto> = []
  private readonly outputs: Array<onnxProto.onnx.IValueInfoProto> = []
  private readonly usedNames = new Set<string>()
  /** Values that nodes compute (not inputs or initializers). */
  private readonly computed = new Set<string>()
  /** Computed values renamed to the graph output they are, as exporters name them. */
  private readonly renamed = new Map<string, string>()
  private readonly domains = new Set<string>()
  private scopePath: ReadonlyArray<string> = []
  private counter = 0

  constructor(readonly name: string) {}

  /** Runs `build` with `prefix` added to the names of the weights and nodes it creates. */
  scope<A>(prefix: string, build: () => A): A {
    const outer = this.scopePath
    this.scopePath = [...outer, prefix]
    try {
      return build()
    } finally {
      this.scopePath = outer
    }
  }

  input(name: string, dataType: DataType, shape: ReadonlyArray<Dim>): Value {
    this.claim(name)
    this.inputs.push(valueInfo(name, dataType, shape))
    return { name }
  }

  /**
   * Declares `value` as a graph output called `name`. A value a node computes takes that name, as
   * exporters write it (an Identity node would copy the tensor on every run: a KV cache, each
   * step); an input, an initializer or a value already output under another name goes through an
   * Identity node.
   */
  output(value: Value, name: string, dataType: DataType, shape: ReadonlyArray<Dim>): void {
    if (value.name !== name) {
      this.claim(name)
      if (this.computed.has(value.name) && !this.renamed.has(value.name)) this.renamed.set(value.name, name)
      else this.nodes.push({ opType: "Identity", name: `${name}/Identity`, input: [value.name], output: [name] })
    }
    this.outputs.push(valueInfo(name, dataType, shape))
  }

  /** A named initializer, e.g. `weight("q_proj.weight", ...)` inside scope "layers.0". */
  weight(name: string, dataType: DataType, dims: ReadonlyArray<number>, data: TensorData): Value {
    const fullName = this.scoped(name)
    const size = dims.reduce((a, b) => a * b, 1)
    if (data.length !== size) throw new Error(`weight ${fullName}: ${data.length} values for dims [${dims.join(", ")}]`)
    if (data.constructor.name !== expectedArray[dataType]) {
      throw new Error(
        `weight ${fullName}: ${dataType} needs a ${expectedArray[dataType]}, got ${data.constructor.name}`
      )
    }
    this.claim(fullName)
    this.initializers.push({
      name: fullName,
      dims: [...dims],
      dataType: elementTypes[dataType],
      rawData: rawBytes(data)
    })
    return { name: fullName }
  }

  /** An anonymous constant (shapes, axes, scalars). */
  constant(dataType: DataType, dims: ReadonlyArray<number>, data: TensorData): Value {
    return this.weight(`const_${this.counter++}`, dataType, dims, data)
  }

  int64s(values: ReadonlyArray<number>): Value {
    return this.constant("int64", [values.length], BigInt64Array.from(values, BigInt))
  }

  int64Scalar(value: number): Value {
    return this.constant("int64", [], BigInt64Array.of(BigInt(value)))
  }

  floatScalar(value: number): Value {
    return this.constant("float32", [], Float32Array.of(value))
  }

  /** Adds a node with one output. An `undefined` input is an omitted optional input. */
  op(
    opType: string,
    inputs: ReadonlyArray<Value | undefined>,
    attributes: Record<string, AttributeValue> = {},
    domain = ""
  ): Value {
    const [output] = this.opWithOutputs(opType, inputs, 1, attributes, domain)
    return output!
  }

  opWithOutputs(
    opType: string,
    inputs: ReadonlyArray<Value | undefined>,
    outputCount: number,
    attributes: Record<string, AttributeValue> = {},
    domain = ""
  ): ReadonlyArray<Value> {
    if (domain !== "") this.domains.add(domain)
    const nodeName = this.scoped(`${opType}_${this.counter++}`)
    const outputs = Array.from({ length: outputCount }, (_, index) => {
      const name = outputCount === 1 ? nodeName : `${nodeName}:${index}`
      this.claim(name)
      this.computed.add(name)
      return { name }
    })
    this.nodes.push({
      opType,
      name: nodeName,
      input: inputs.map((input) => input?.name ?? ""),
      output: outputs.map((output) => output.name),
      ...(domain === "" ? {} : { domain }),
      attribute: Object.entries(attributes).map(([name, value]) => attributeProto(name, value))
    })
    return outputs
  }

  /** The serialized ModelProto. */
  toBytes(docString = ""): Uint8Array {
    return this.toFiles({ docString }).model
  }

  /**
   * The serialized ModelProto and, with `externalData`, the external data file that holds its
   * large initializers (what exporters write for models over protobuf's 2 GB limit).
   */
  toFiles(options: { readonly docString?: string; readonly externalData?: ExternalDataOptions } = {}): {
    readonly model: Uint8Array
    /** The external data file, as the initializers' own bytes one after another (not copied). */
    readonly data?: ReadonlyArray<Uint8Array>
  } {
    const external = options.externalData
    const chunks: Array<Uint8Array> = []
    let offset = 0
    const initializers =
      external === undefined
        ? this.initializers
        : this.initializers.map((tensor) => {
            const raw = tensor.rawData as Uint8Array
            if (raw.byteLength < external.minBytes) return tensor
            chunks.push(raw)
            const entry = {
              ...tensor,
              rawData: null,
              dataLocation: onnx.TensorProto.DataLocation.EXTERNAL,
              externalData: [
                { key: "location", value: external.location },
                { key: "offset", value: String(offset) },
                { key: "length", value: String(raw.byteLength) }
              ]
            }
            offset += raw.byteLength
            return entry
          })
    const model = onnx.ModelProto.create({
      irVersion,
      opsetImport: [
        { domain: "", version: opsetVersion },
        ...[...this.domains].sort().map((domain) => ({ domain, version: 1 }))
      ],
      producerName: "cornserve",
      producerVersion: "1",
      docString: options.docString ?? "",
      graph: {
        name: this.name,
        node: this.renamed.size === 0 ? this.nodes : this.nodes.map((node) => this.withOutputNames(node)),
        initializer: initializers,
        input: this.inputs,
        output: this.outputs
      }
    })
    const bytes = onnx.ModelProto.encode(model).finish()
    return external === undefined ? { model: bytes } : { model: bytes, data: chunks }
  }

  private withOutputNames(node: onnxProto.onnx.INodeProto): onnxProto.onnx.INodeProto {
    const named = (value: string) => this.renamed.get(value) ?? value
    return { ...node, input: (node.input ?? []).map(named), output: (node.output ?? []).map(named) }
  }

  private scoped(name: string): string {
    return [...this.scopePath, name].join(".")
  }

  private claim(name: string): void {
    if (this.usedNames.has(name)) throw new Error(`graph ${this.name}: the name ${name} is used twice`)
    this.usedNames.add(name)
  }
}

/**
 * The dims of a model file's graph input `name` (a number where the file fixes it, the dim's name
 * where it does not), read from the file without an inference session; undefined if it has no
 * such input.
 */
export const onnxInputDims = (bytes: Uint8Array, name: string): ReadonlyArray<Dim> | undefined => {
  const input = onnx.ModelProto.decode(bytes).graph?.input?.find((value) => value.name === name)
  const dims = input?.type?.tensorType?.shape?.dim
  if (dims == null) return undefined
  return dims.map((d) => (d.dimValue != null && d.dimParam == null ? Number(d.dimValue) : (d.dimParam ?? "")))
}
