/**
 * A GGUF (version 3) writer, for the benches that run llama.cpp on the same weights as the ONNX
 * export: a header, key-value metadata, tensor infos, then each tensor's data aligned to 32 bytes.
 * Dims are listed as GGUF lists them: the contiguous one first. Tensor types, in ggml's layouts:
 *
 * - F32 (ggml type 0): little-endian float32 values; F16 (type 1): IEEE half bits.
 * - Q4_0 (type 2): blocks of 32 values along the contiguous dim, 18 bytes each: an fp16 scale `d`,
 *   then 16 bytes `qs` whose byte j holds element j in its low nibble and element j + 16 in its high
 *   one; value = (nibble − 8) · d (ggml's block_q4_0).
 * - Q8_0 (type 8): blocks of 32, 34 bytes each: an fp16 scale `d`, then 32 int8 codes; value =
 *   code · d (ggml's block_q8_0).
 *
 * Tensors are written streamed: the infos (type, dims, hence byte size) first, then each tensor's
 * bytes, produced only when its turn comes and dropped once written, so the writer holds about one
 * tensor at a time and never the whole file.
 */
import { open } from "node:fs/promises"

export type GgufValue =
  | { readonly type: "u32"; readonly value: number }
  | { readonly type: "i32"; readonly value: number }
  | { readonly type: "f32"; readonly value: number }
  | { readonly type: "bool"; readonly value: boolean }
  | { readonly type: "string"; readonly value: string }
  | { readonly type: "strings"; readonly value: ReadonlyArray<string> }
  | { readonly type: "i32s"; readonly value: ReadonlyArray<number> }

export type GgufTensorType = "F32" | "F16" | "Q4_0" | "Q8_0"

export interface GgufTensor {
  readonly name: string
  readonly dims: ReadonlyArray<number>
  readonly type: GgufTensorType
  /** The tensor's bytes in ggml's layout for `type` (`ggufTensorBytes` of them), made when written. */
  readonly data: () => Uint8Array | Promise<Uint8Array>
}

const alignment = 32
const valueTypes = { u32: 4, i32: 5, f32: 6, bool: 7, string: 8, array: 9 } as const
const tensorTypes = { F32: 0, F16: 1, Q4_0: 2, Q8_0: 8 } as const
/** Block size in values and bytes per block of each type. */
const layouts = {
  F32: { values: 1, bytes: 4 },
  F16: { values: 1, bytes: 2 },
  Q4_0: { values: 32, bytes: 18 },
  Q8_0: { values: 32, bytes: 34 }
} as const

/** The data size of a tensor of `type` and `dims` (the contiguous dim a whole number of blocks). */
export const ggufTensorBytes = (type: GgufTensorType, dims: ReadonlyArray<number>): number => {
  const { values, bytes } = layouts[type]
  if ((dims[0] ?? 1) % values !== 0) throw new Error(`${type}: a row of ${dims[0]} values is not whole blocks`)
  return (dims.reduce((a, b) => a * b, 1) / values) * bytes
}

/** The bytes of a typed array, without a copy. */
export const bytesOf = (array: ArrayBufferView): Uint8Array =>
  new Uint8Array(array.buffer, array.byteOffset, array.byteLength)

/** Q8_0 blocks of `codes` (rows along the contiguous dim, whole blocks), every block with the fp16 scale `half`. */
export const q8_0Blocks = (codes: Int8Array, half: number): Uint8Array => {
  const blocks = codes.length / 32
  const out = new Uint8Array(blocks * 34)
  const bytes = new Uint8Array(codes.buffer, codes.byteOffset, codes.byteLength)
  for (let block = 0; block < blocks; block++) {
    const at = block * 34
    out[at] = half & 0xff
    out[at + 1] = half >>> 8
    out.set(bytes.subarray(block * 32, block * 32 + 32), at + 2)
  }
  return out
}

class Bytes {
  private readonly chunks: Array<Buffer> = []
  length = 0
  push(buffer: Buffer): void {
    this.chunks.push(buffer)
    this.length += buffer.length
  }
  u32(value: number) {
    const b = Buffer.alloc(4)
    b.writeUInt32LE(value)
    this.push(b)
  }
  i32(value: number) {
    const b = Buffer.alloc(4)
    b.writeInt32LE(value)
    this.push(b)
  }
  u64(value: number) {
    const b = Buffer.alloc(8)
    b.writeBigUInt64LE(BigInt(value))
    this.push(b)
  }
  f32(value: number) {
    const b = Buffer.alloc(4)
    b.writeFloatLE(value)
    this.push(b)
  }
  string(value: string) {
    const bytes = Buffer.from(value, "utf8")
    this.u64(bytes.length)
    this.push(bytes)
  }
  pad() {
    const rest = (alignment - (this.length % alignment)) % alignment
    if (rest > 0) this.push(Buffer.alloc(rest))
  }
  get buffer(): Buffer {
    return Buffer.concat(this.chunks)
  }
}

const padding = (length: number) => (alignment - (length % alignment)) % alignment

/** Writes a GGUF file of `metadata` and `tensors`, each tensor's data made and written in turn. */
export const writeGguf = async (
  path: string,
  metadata: ReadonlyArray<readonly [string, GgufValue]>,
  tensors: ReadonlyArray<GgufTensor>
): Promise<void> => {
  const head = new Bytes()
  head.push(Buffer.from("GGUF", "ascii"))
  head.u32(3)
  head.u64(tensors.length)
  head.u64(metadata.length)
  for (const [key, entry] of metadata) {
    head.string(key)
    switch (entry.type) {
      case "u32":
        head.u32(valueTypes.u32)
        head.u32(entry.value)
        break
      case "i32":
        head.u32(valueTypes.i32)
        head.i32(entry.value)
        break
      case "f32":
        head.u32(valueTypes.f32)
        head.f32(entry.value)
        break
      case "bool":
        head.u32(valueTypes.bool)
        head.push(Buffer.of(entry.value ? 1 : 0))
        break
      case "string":
        head.u32(valueTypes.string)
        head.string(entry.value)
        break
      case "strings":
        head.u32(valueTypes.array)
        head.u32(valueTypes.string)
        head.u64(entry.value.length)
        for (const item of entry.value) head.string(item)
        break
      case "i32s":
        head.u32(valueTypes.array)
        head.u32(valueTypes.i32)
        head.u64(entry.value.length)
        for (const item of entry.value) head.i32(item)
        break
    }
  }
  const sizes = tensors.map((tensor) => ggufTensorBytes(tensor.type, tensor.dims))
  let offset = 0
  tensors.forEach((tensor, index) => {
    head.string(tensor.name)
    head.u32(tensor.dims.length)
    for (const dim of tensor.dims) head.u64(dim)
    head.u32(tensorTypes[tensor.type])
    head.u64(offset)
    offset += sizes[index]!
    offset += padding(offset)
  })
  head.pad()
  const file = await open(path, "w")
  try {
    let position = 0
    const write = async (bytes: Uint8Array) => {
      // One write call takes at most 2 GiB; a short write goes on from where it stopped.
      for (let at = 0; at < bytes.byteLength; ) {
        const { bytesWritten } = await file.write(bytes, at, Math.min(bytes.byteLength - at, 1 << 30), position)
        at += bytesWritten
        position += bytesWritten
      }
    }
    await write(head.buffer)
    for (const [index, tensor] of tensors.entries()) {
      const data = await tensor.data()
      if (data.byteLength !== sizes[index])
        throw new Error(`${tensor.name}: ${data.byteLength} bytes of data, ${sizes[index]} expected`)
      await write(data)
      const rest = padding(data.byteLength)
      if (rest > 0) await write(new Uint8Array(rest))
    }
  } finally {
    await file.close()
  }
}
