/**
 * A GGUF (version 3) writer, for the benches that run llama.cpp on the same weights as the ONNX
 * export: a header, key-value metadata, tensor infos, then each tensor's data aligned to 32 bytes.
 * Tensors are F32 or Q8_0 (blocks of 32 int8 values with an fp16 scale). Dims are listed as GGUF
 * lists them: the contiguous one first.
 */
import { open } from "node:fs/promises"
import { halvesOf } from "../../src/models/Float16.js"

export type GgufValue =
  | { readonly type: "u32"; readonly value: number }
  | { readonly type: "i32"; readonly value: number }
  | { readonly type: "f32"; readonly value: number }
  | { readonly type: "bool"; readonly value: boolean }
  | { readonly type: "string"; readonly value: string }
  | { readonly type: "strings"; readonly value: ReadonlyArray<string> }
  | { readonly type: "i32s"; readonly value: ReadonlyArray<number> }

export type GgufTensor =
  | { readonly name: string; readonly dims: ReadonlyArray<number>; readonly type: "F32"; readonly data: Float32Array }
  /** Q8_0: values = scale(block) × code, one scale per 32 values along the contiguous dim. */
  | {
      readonly name: string
      readonly dims: ReadonlyArray<number>
      readonly type: "Q8_0"
      readonly codes: Int8Array
      readonly scales: Float32Array
    }

const alignment = 32
const valueTypes = { u32: 4, i32: 5, f32: 6, bool: 7, string: 8, array: 9 } as const
const tensorTypes = { F32: 0, Q8_0: 8 } as const

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

const tensorBytes = (tensor: GgufTensor): Buffer => {
  if (tensor.type === "F32") return Buffer.from(tensor.data.buffer, tensor.data.byteOffset, tensor.data.byteLength)
  const blocks = tensor.codes.length / 32
  const out = Buffer.alloc(blocks * 34)
  const halves = halvesOf(tensor.scales)
  for (let block = 0; block < blocks; block++) {
    out.writeUInt16LE(halves[block]!, block * 34)
    for (let i = 0; i < 32; i++) out.writeInt8(tensor.codes[block * 32 + i]!, block * 34 + 2 + i)
  }
  return out
}

/** Writes a GGUF file of `metadata` and `tensors`. */
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
  const datas = tensors.map(tensorBytes)
  let offset = 0
  tensors.forEach((tensor, index) => {
    head.string(tensor.name)
    head.u32(tensor.dims.length)
    for (const dim of tensor.dims) head.u64(dim)
    head.u32(tensorTypes[tensor.type])
    head.u64(offset)
    offset += datas[index]!.length
    offset += (alignment - (offset % alignment)) % alignment
  })
  head.pad()
  const file = await open(path, "w")
  try {
    await file.write(head.buffer)
    for (const data of datas) {
      await file.write(data)
      const rest = (alignment - (data.length % alignment)) % alignment
      if (rest > 0) await file.write(Buffer.alloc(rest))
    }
  } finally {
    await file.close()
  }
}
