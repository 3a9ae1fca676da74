import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import { Arena } from "../../sidecar/Arena.js"
import { bytesPerElement, elementCount, Tensor, type TensorData } from "../../sidecar/Tensor.js"
import type { BatchInput, WorkItem } from "./wire.js"

const alignment = 64
const align = (offset: number) => Math.ceil(offset / alignment) * alignment

export { batchBufferEnvName, batchBufferPathOf, batchBufferPrefix } from "./EarlySpawn.js"

/**
 * Batches in flight between an engine and its workers, each in a slot of the buffer: two, so that
 * the next batch is written while one runs; eight for Geri, whose batches last as long as their
 * output streams (an utterance spoken as it is generated) and whose speech worker runs them side
 * by side, so that a request arriving mid-utterance starts at once. The buffer is sparse: a slot
 * costs memory only for the largest batch written in it, committed as it first comes.
 */
export const batchSlots = (kind: "eric" | "geri" | "llm"): number => (kind === "geri" ? 8 : 2)

/**
 * Shared memory between an executor's engine and its workers: `slots` regions of `slotBytes`. The
 * engine stacks a batch's inputs into a free slot and tells the workers where they are; the
 * workers read them in place. A slot is reused only once every worker is done with its batch.
 */
export class BatchBuffer {
  private readonly free: Array<number>
  private readonly waiting: Array<(slot: number) => void> = []

  private constructor(
    private readonly arena: Arena,
    readonly slots: number,
    readonly slotBytes: number
  ) {
    this.free = Array.from({ length: slots }, (_, slot) => slot)
  }

  /** The engine's side: creates the file (unlinked when the scope closes). */
  static create(path: string, slots: number, slotBytes: number): Effect.Effect<BatchBuffer, Error, Scope.Scope> {
    return Arena.create(path, slots * slotBytes).pipe(
      Effect.map((arena) => new BatchBuffer(arena, slots, slotBytes)),
      Effect.mapError((error) => new Error(error.message))
    )
  }

  /** A worker's side: maps the engine's file. */
  static open(path: string, slots: number, slotBytes: number): BatchBuffer {
    return new BatchBuffer(Arena.open(path), slots, slotBytes)
  }

  get path(): string {
    return this.arena.path
  }

  /** The bytes of the buffer that hold memory (the engine's side). */
  get committedBytes(): number {
    return this.arena.committedBytes
  }

  /** A free slot, once there is one. */
  acquire(): Promise<number> {
    const slot = this.free.shift()
    if (slot !== undefined) return Promise.resolve(slot)
    return new Promise((resolve) => this.waiting.push(resolve))
  }

  release(slot: number): void {
    const next = this.waiting.shift()
    if (next !== undefined) next(slot)
    else this.free.push(slot)
  }

  /**
   * Stacks the items' inputs along their first axis into `slot`. Every item must give the same
   * inputs, each with the same dtype and trailing dimensions. A batch larger than a slot, or one
   * that /dev/shm has no room for, travels inline in the message instead.
   */
  write(
    slot: number,
    items: ReadonlyArray<WorkItem>
  ): { readonly inputs: Record<string, BatchInput>; readonly rows: ReadonlyArray<readonly [number, number]> } {
    const names = Object.keys(items[0]!.inputs).sort()
    const rows: Array<readonly [number, number]> = []
    let firstRow = 0
    for (const item of items) {
      const itemNames = Object.keys(item.inputs).sort()
      if (itemNames.join() !== names.join())
        throw new Error(`items of one batch must have the same inputs: [${names}] vs [${itemNames}]`)
      const count = item.inputs[names[0]!]!.shape[0] ?? 1
      rows.push([firstRow, firstRow + count])
      firstRow += count
    }
    const layouts = names.map((name) => {
      const first = items[0]!.inputs[name]!
      const trailing = first.shape.slice(1)
      for (const item of items) {
        const tensor = item.inputs[name]!
        if (tensor.dtype !== first.dtype || tensor.shape.slice(1).join() !== trailing.join()) {
          throw new Error(`input ${name}: items of one batch must share dtype and trailing shape`)
        }
      }
      const shape = [firstRow, ...trailing]
      return { name, dtype: first.dtype, shape, bytes: elementCount(shape) * bytesPerElement(first.dtype) }
    })
    const total = layouts.reduce((sum, layout) => align(sum) + layout.bytes, 0)
    const inSlot = total <= this.slotBytes && this.arena.commit(slot * this.slotBytes, total)
    const inputs: Record<string, BatchInput> = {}
    let offset = slot * this.slotBytes
    for (const layout of layouts) {
      offset = align(offset)
      if (!inSlot) {
        const joined = Tensor.zeros(layout.dtype, layout.shape)
        const target = joined.bytes
        let at = 0
        for (const item of items) {
          const source = bytesOf(item.inputs[layout.name]!.data)
          target.set(source, at)
          at += source.length
        }
        inputs[layout.name] = { dtype: layout.dtype, shape: layout.shape, offset: -1, inline: joined.data }
      } else {
        const target = this.arena.view(offset, layout.bytes)
        let at = 0
        for (const item of items) {
          const source = bytesOf(item.inputs[layout.name]!.data)
          target.set(source, at)
          at += source.length
        }
        inputs[layout.name] = { dtype: layout.dtype, shape: layout.shape, offset }
        offset += layout.bytes
      }
    }
    return { inputs, rows }
  }

  /** Rows [from, to) of a batch input, in place in shared memory (or in the message). */
  read(input: BatchInput, from: number, to: number): Tensor {
    const trailing = input.shape.slice(1)
    const rowBytes = elementCount(trailing) * bytesPerElement(input.dtype)
    const shape = [to - from, ...trailing]
    if (input.inline !== undefined) {
      return Tensor.view(input.dtype, shape, input.inline.buffer, input.inline.byteOffset + from * rowBytes)
    }
    const bytes = this.arena.view(input.offset + from * rowBytes, (to - from) * rowBytes)
    return Tensor.view(input.dtype, shape, bytes.buffer, bytes.byteOffset)
  }
}

const bytesOf = (data: TensorData): Uint8Array => new Uint8Array(data.buffer, data.byteOffset, data.byteLength)
