import { closeSync, openSync, readSync } from "node:fs"
import { open } from "node:fs/promises"
import { basename, join } from "node:path"
import type onnxProto from "onnx-proto"

/**
 * An ONNX model file read without its weights: the graph, with every large initializer turned
 * into an external-data reference to where its bytes already are, in the file itself.
 *
 * A model file holds its weights inline up to protobuf's 2 GB limit (the community's q4 and q8
 * exports of 1B-class models: 1 to 2 GB). Parsing such a file to rewrite its graph would hold the
 * weights in JavaScript (the file read whole, then the rewritten model encoded again, then ONNX
 * Runtime's own copy: three times their size). Here the file is walked field by field with
 * positioned reads: the graph and small tensors are read, and each large tensor's `raw_data` is
 * skipped and described instead (`data_location: EXTERNAL`, `location` the file's own name,
 * `offset` and `length` those of its bytes in the file). The result is a valid ModelProto of a few
 * MB; opened with the file's folder as its external data folder, ONNX Runtime reads each weight
 * from the file once, into its own memory, and nothing else holds it.
 *
 * Protobuf's wire format: each field is a varint key (number << 3 | wire type) then its value
 * (0: varint, 1: 8 bytes, 2: varint length then bytes, 5: 4 bytes). ModelProto.graph is field 7,
 * GraphProto.initializer field 5, and in TensorProto raw_data is 9, external_data 13 (repeated
 * StringStringEntryProto: key 1, value 2) and data_location 14 (1: EXTERNAL).
 */

const wire = { varint: 0, fixed64: 1, bytes: 2, fixed32: 5 } as const
const modelGraph = 7
const graphInitializer = 5
const tensorRawData = 9
const tensorExternalData = 13
const tensorDataLocation = 14
const external = 1

export interface GraphInPlace {
  /** The ModelProto with large weights as references into `file`. */
  readonly bytes: Uint8Array
  /** How many tensors now point into the file, and their bytes. */
  readonly tensors: number
  readonly weightBytes: number
}

/** Reads the file forward through one reused window of `chunk` bytes; skips without reading. */
class Cursor {
  private readonly buffer: Buffer
  private window: Buffer
  private windowStart = 0
  position = 0

  constructor(
    private readonly handle: Awaited<ReturnType<typeof open>>,
    readonly size: number,
    private readonly chunk = 1 << 16
  ) {
    this.buffer = Buffer.allocUnsafe(chunk)
    this.window = this.buffer.subarray(0, 0)
  }

  /** Makes the window hold `count` bytes from the position (at most `chunk`: longer values are read apart). */
  private async ensure(count: number): Promise<void> {
    const end = this.position + count
    if (this.position >= this.windowStart && end <= this.windowStart + this.window.length) return
    if (end > this.size) throw new Error(`truncated at byte ${this.position}: ${count} more bytes expected`)
    const length = Math.min(this.chunk, this.size - this.position)
    const { bytesRead } = await this.handle.read(this.buffer, 0, length, this.position)
    if (bytesRead < count) throw new Error(`short read at byte ${this.position}`)
    this.window = this.buffer.subarray(0, bytesRead)
    this.windowStart = this.position
  }

  async byte(): Promise<number> {
    await this.ensure(1)
    return this.window[this.position++ - this.windowStart]!
  }

  /** A varint of up to 64 bits, as a number (lengths and offsets in a file stay below 2^53). */
  async varint(): Promise<number> {
    let value = 0
    let scale = 1
    for (let index = 0; index < 10; index++) {
      const byte = await this.byte()
      value += (byte & 0x7f) * scale
      if ((byte & 0x80) === 0) return value
      scale *= 128
    }
    throw new Error(`a varint of over 10 bytes at byte ${this.position}`)
  }

  /** `count` bytes, copied out of the window. */
  async bytes(count: number): Promise<Uint8Array> {
    if (count > this.chunk) {
      const out = Buffer.allocUnsafe(count)
      const { bytesRead } = await this.handle.read(out, 0, count, this.position)
      if (bytesRead < count) throw new Error(`short read at byte ${this.position}`)
      this.position += count
      return out
    }
    await this.ensure(count)
    const start = this.position - this.windowStart
    this.position += count
    return Uint8Array.from(this.window.subarray(start, start + count))
  }

  skip(count: number): void {
    if (this.position + count > this.size) throw new Error(`truncated at byte ${this.position}`)
    this.position += count
  }
}

const varintBytes = (value: number): Array<number> => {
  const out: Array<number> = []
  let rest = value
  while (rest >= 0x80) {
    out.push((rest % 128) | 0x80)
    rest = Math.floor(rest / 128)
  }
  out.push(rest)
  return out
}

/** Pieces of a message being written again, and their total length. */
class Writer {
  readonly pieces: Array<Uint8Array> = []
  length = 0

  raw(bytes: Uint8Array): void {
    this.pieces.push(bytes)
    this.length += bytes.length
  }

  varint(value: number): void {
    this.raw(Uint8Array.from(varintBytes(value)))
  }

  key(field: number, type: number): void {
    this.varint(field * 8 + type)
  }

  lengthDelimited(field: number, body: Writer | Uint8Array): void {
    this.key(field, wire.bytes)
    if (body instanceof Uint8Array) {
      this.varint(body.length)
      this.raw(body)
      return
    }
    this.varint(body.length)
    for (const piece of body.pieces) this.raw(piece)
  }

  string(field: number, value: string): void {
    this.lengthDelimited(field, new TextEncoder().encode(value))
  }

  concat(): Uint8Array {
    return Buffer.concat(this.pieces, this.length)
  }
}

/** One field's key, and its value's extent in the file. */
const readKey = async (cursor: Cursor) => {
  const key = await cursor.varint()
  return { field: Math.floor(key / 8), type: key % 8 }
}

/** Copies a field whose key was just read (the key written again, then its value). */
const copyField = async (cursor: Cursor, out: Writer, field: number, type: number): Promise<void> => {
  out.key(field, type)
  switch (type) {
    case wire.varint:
      out.varint(await cursor.varint())
      return
    case wire.fixed64:
      out.raw(await cursor.bytes(8))
      return
    case wire.fixed32:
      out.raw(await cursor.bytes(4))
      return
    case wire.bytes: {
      const length = await cursor.varint()
      out.varint(length)
      out.raw(await cursor.bytes(length))
      return
    }
    default:
      throw new Error(`wire type ${type} (groups or corruption) at byte ${cursor.position}`)
  }
}

interface Walk {
  readonly location: string
  readonly minBytes: number
  tensors: number
  weightBytes: number
}

const tensor = async (cursor: Cursor, end: number, walk: Walk): Promise<Writer> => {
  const out = new Writer()
  let moved: { readonly offset: number; readonly length: number } | undefined
  while (cursor.position < end) {
    const { field, type } = await readKey(cursor)
    if (field === tensorRawData && type === wire.bytes) {
      const length = await cursor.varint()
      if (length >= walk.minBytes) {
        moved = { offset: cursor.position, length }
        cursor.skip(length)
        continue
      }
      out.key(field, type)
      out.varint(length)
      out.raw(await cursor.bytes(length))
      continue
    }
    await copyField(cursor, out, field, type)
  }
  if (moved !== undefined) {
    for (const [key, value] of [
      ["location", walk.location],
      ["offset", String(moved.offset)],
      ["length", String(moved.length)]
    ] as const) {
      const entry = new Writer()
      entry.string(1, key)
      entry.string(2, value)
      out.lengthDelimited(tensorExternalData, entry)
    }
    out.key(tensorDataLocation, wire.varint)
    out.varint(external)
    walk.tensors++
    walk.weightBytes += moved.length
  }
  return out
}

/**
 * The fields of a message up to `end`, written again: each one copied, but the length-delimited
 * fields numbered `field`, which `inner` walks and writes.
 */
const message = async (
  cursor: Cursor,
  end: number,
  field: number,
  inner: (cursor: Cursor, end: number) => Promise<Writer>
): Promise<Writer> => {
  const out = new Writer()
  while (cursor.position < end) {
    const key = await readKey(cursor)
    if (key.field === field && key.type === wire.bytes) {
      const length = await cursor.varint()
      out.lengthDelimited(field, await inner(cursor, cursor.position + length))
      continue
    }
    await copyField(cursor, out, key.field, key.type)
  }
  return out
}

/**
 * The model at `path` with every inline tensor of at least `minBytes` (by default 4 KiB: weights
 * and their scales, not the graph's small constants, which rewrites read) left in the file and
 * referenced from there. A tensor already in an external data file keeps its reference.
 */
export const graphWithWeightsInPlace = async (
  path: string,
  options: { readonly minBytes?: number } = {}
): Promise<GraphInPlace> => {
  const handle = await open(path, "r")
  try {
    const cursor = new Cursor(handle, (await handle.stat()).size)
    const walk: Walk = { location: basename(path), minBytes: options.minBytes ?? 4096, tensors: 0, weightBytes: 0 }
    // ModelProto → its graph → the graph's initializers, each walked by `tensor`.
    const out = await message(cursor, cursor.size, modelGraph, (inGraph, graphEnd) =>
      message(inGraph, graphEnd, graphInitializer, (inTensor, tensorEnd) => tensor(inTensor, tensorEnd, walk))
    )
    return { bytes: out.concat(), tensors: walk.tensors, weightBytes: walk.weightBytes }
  } finally {
    await handle.close()
  }
}

/**
 * An initializer's bytes, wherever they are: inline, or read (synchronously, one tensor at a time)
 * from the external data file its reference names, below `folder`. Undefined when neither.
 */
export const initializerBytes =
  (folder: string) =>
  (tensor: onnxProto.onnx.ITensorProto): Uint8Array | undefined => {
    if (tensor.rawData != null && tensor.rawData.length > 0) return tensor.rawData
    const entry = Object.fromEntries((tensor.externalData ?? []).map(({ key, value }) => [key, value]))
    if (entry.location === undefined || entry.location.includes("..")) return undefined
    const length = Number(entry.length)
    const offset = Number(entry.offset ?? 0)
    if (!Number.isSafeInteger(length) || !Number.isSafeInteger(offset)) return undefined
    const fd = openSync(join(folder, entry.location), "r")
    try {
      const bytes = Buffer.allocUnsafe(length)
      return readSync(fd, bytes, 0, length, offset) === length ? bytes : undefined
    } finally {
      closeSync(fd)
    }
  }
