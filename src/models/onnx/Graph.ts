import onnxProto from "onnx-proto"

const { onnx } = onnxProto

/**
 * A small typed builder for ONNX graphs (opset 17, IR version 8), so that models are written as
 * TypeScript and serialized with onnx-proto. Names are derived from a counter and the current
 * scope only, so the same sequence of calls always yields byte-identical files.
 */

export type DataType = "float32" | "float64" | "int64" | "int32" | "int16" | "bool"

/** A dimension: a fixed size, or a symbolic name such as "batch_size". */
export type Dim = number | string

export type TensorData = Float32Array | Float64Array | BigInt64Array | Int32Array | Int16Array | Uint8Array

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
  float64: onnx.TensorProto.DataType.DOUBLE,
  int64: onnx.TensorProto.DataType.INT64,
  int32: onnx.TensorProto.DataType.INT32,
  int16: onnx.TensorProto.DataType.INT16,
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
  float64: "Float64Array",
  int64: "BigInt64Array",
  int32: "Int32Array",
  int16: "Int16Array",
  bool: "Uint8Array"
}

export class Graph {
  private readonly nodes: Array<onnxProto.onnx.INodeProto> = []
  private readonly initializers: Array<onnxProto.onnx.ITensorProto> = []
  private readonly inputs: Array<onnxProto.onnx.IValueInfoProto> = []
  private readonly outputs: Array<onnxProto.onnx.IValueInfoProto> = []
  private readonly usedNames = new Set<string>()
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

  /** Declares `value` as a graph output called `name` (through an Identity node if it has another name). */
  output(value: Value, name: string, dataType: DataType, shape: ReadonlyArray<Dim>): void {
    if (value.name !== name) {
      this.claim(name)
      this.nodes.push({ opType: "Identity", name: `${name}/Identity`, input: [value.name], output: [name] })
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
  op(opType: string, inputs: ReadonlyArray<Value | undefined>, attributes: Record<string, AttributeValue> = {}): Value {
    const [output] = this.opWithOutputs(opType, inputs, 1, attributes)
    return output!
  }

  opWithOutputs(
    opType: string,
    inputs: ReadonlyArray<Value | undefined>,
    outputCount: number,
    attributes: Record<string, AttributeValue> = {}
  ): ReadonlyArray<Value> {
    const nodeName = this.scoped(`${opType}_${this.counter++}`)
    const outputs = Array.from({ length: outputCount }, (_, index) => {
      const name = outputCount === 1 ? nodeName : `${nodeName}:${index}`
      this.claim(name)
      return { name }
    })
    this.nodes.push({
      opType,
      name: nodeName,
      input: inputs.map((input) => input?.name ?? ""),
      output: outputs.map((output) => output.name),
      attribute: Object.entries(attributes).map(([name, value]) => attributeProto(name, value))
    })
    return outputs
  }

  /** The serialized ModelProto. */
  toBytes(docString = ""): Uint8Array {
    const model = onnx.ModelProto.create({
      irVersion,
      opsetImport: [{ domain: "", version: opsetVersion }],
      producerName: "cornserve",
      producerVersion: "1",
      docString,
      graph: {
        name: this.name,
        node: this.nodes,
        initializer: this.initializers,
        input: this.inputs,
        output: this.outputs
      }
    })
    return onnx.ModelProto.encode(model).finish()
  }

  private scoped(name: string): string {
    return [...this.scopePath, name].join(".")
  }

  private claim(name: string): void {
    if (this.usedNames.has(name)) throw new Error(`graph ${this.name}: the name ${name} is used twice`)
    this.usedNames.add(name)
  }
}
