/**
 * A tensor as the sidecar moves it: an element type, a shape and a typed array in row-major order.
 * The names of the element types are ONNX Runtime's, so a received tensor feeds a session as is.
 */

/** The typed array that holds each element type. */
export interface ArrayTypes {
  readonly float32: Float32Array
  readonly float64: Float64Array
  /** IEEE 754 half-precision bits: Node 20 has no Float16Array. */
  readonly float16: Uint16Array
  /** The upper 16 bits of a float32, as ONNX Runtime stores bfloat16. */
  readonly bfloat16: Uint16Array
  readonly int8: Int8Array
  readonly uint8: Uint8Array
  readonly int16: Int16Array
  readonly uint16: Uint16Array
  readonly int32: Int32Array
  readonly uint32: Uint32Array
  readonly int64: BigInt64Array
  readonly uint64: BigUint64Array
  /** One byte per element, 0 or 1. */
  readonly bool: Uint8Array
}

export type DType = keyof ArrayTypes
export type TensorData = ArrayTypes[DType]

type ArrayConstructorOf<D extends DType> = {
  new (buffer: ArrayBufferLike, byteOffset: number, length: number): ArrayTypes[D]
  new (length: number): ArrayTypes[D]
  readonly BYTES_PER_ELEMENT: number
}

const arrayConstructors: { readonly [D in DType]: ArrayConstructorOf<D> } = {
  float32: Float32Array,
  float64: Float64Array,
  float16: Uint16Array,
  bfloat16: Uint16Array,
  int8: Int8Array,
  uint8: Uint8Array,
  int16: Int16Array,
  uint16: Uint16Array,
  int32: Int32Array,
  uint32: Uint32Array,
  int64: BigInt64Array,
  uint64: BigUint64Array,
  bool: Uint8Array
}

export const dtypes = Object.keys(arrayConstructors) as ReadonlyArray<DType>

export const bytesPerElement = (dtype: DType): number => arrayConstructors[dtype].BYTES_PER_ELEMENT

/** The number of elements of a shape; 1 for a 0-d tensor (a scalar). */
export const elementCount = (shape: ReadonlyArray<number>): number => shape.reduce((count, dim) => count * dim, 1)

const checkShape = (shape: ReadonlyArray<number>) => {
  for (const dim of shape) {
    if (!Number.isSafeInteger(dim) || dim < 0)
      throw new RangeError(`a tensor's dimensions are whole numbers ≥ 0, got [${shape.join(", ")}]`)
  }
}

export class Tensor<D extends DType = DType> {
  readonly shape: ReadonlyArray<number>

  constructor(
    readonly dtype: D,
    shape: ReadonlyArray<number>,
    readonly data: ArrayTypes[D]
  ) {
    checkShape(shape)
    const arrayType = arrayConstructors[dtype]
    if (arrayType === undefined)
      throw new TypeError(`unknown dtype "${String(dtype)}"; use one of ${dtypes.join(", ")}`)
    if (!(data instanceof arrayType))
      throw new TypeError(`a ${dtype} tensor holds a ${arrayType.name}, got ${data.constructor.name}`)
    const count = elementCount(shape)
    if (data.length !== count)
      throw new RangeError(`shape [${shape.join(", ")}] has ${count} elements, the data ${data.length}`)
    this.shape = Object.freeze([...shape])
  }

  /** A zero-filled tensor in its own memory. */
  static zeros<D extends DType>(dtype: D, shape: ReadonlyArray<number>): Tensor<D> {
    checkShape(shape)
    return new Tensor(dtype, shape, new arrayConstructors[dtype](elementCount(shape)))
  }

  /** A tensor over existing memory (the arena), without copying. */
  static view<D extends DType>(
    dtype: D,
    shape: ReadonlyArray<number>,
    buffer: ArrayBufferLike,
    byteOffset: number
  ): Tensor<D> {
    checkShape(shape)
    return new Tensor(dtype, shape, new arrayConstructors[dtype](buffer, byteOffset, elementCount(shape)))
  }

  get byteLength(): number {
    return this.data.byteLength
  }

  /** The tensor's bytes, without copying. */
  get bytes(): Uint8Array {
    return new Uint8Array(this.data.buffer, this.data.byteOffset, this.data.byteLength)
  }
}

/** The byte length of a tensor of this dtype and shape. */
export const tensorByteLength = (dtype: DType, shape: ReadonlyArray<number>): number =>
  elementCount(shape) * bytesPerElement(dtype)
