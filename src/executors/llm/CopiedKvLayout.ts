/**
 * The KV layout of a decoder run as exported: a run's presents, its whole cache, are the next
 * run's past. Each request's cache is a row of some run's presents; a decode step of the batch
 * the last one ran takes its presents as they are, and any other batch gathers its rows anew,
 * right-aligned under a mask (PastCache.ts).
 */
import type * as ort from "onnxruntime-node"
import { alonePast, type KvGeometry, type KvLayout, type KvRun, emptyPast, type RunPast, wholeRow } from "./KvLayout.js"
import { type CacheArray, type CachedRow, gatherRows, type PastData, rightAlignedMask } from "./PastCache.js"
import { cacheTensor } from "./Tensors.js"

/** A past as the decoder takes it, and its width. */
interface Past {
  readonly tensors: ReadonlyArray<ort.Tensor>
  readonly width: number
}

export class CopiedKvLayout implements KvLayout {
  readonly batchesPrompts = true
  readonly bytes = 0
  /** Each request's cache: a row of a past. */
  private readonly caches = new Map<string, { readonly past: Past; readonly row: number }>()
  /** The batch the last decode step ran, in row order, and its output past. */
  private batch: { readonly order: ReadonlyArray<string>; readonly past: Past } | undefined

  constructor(private readonly geometry: KvGeometry) {}

  join(id: string, _promptLength: number, cached: PastData | undefined): void {
    const { heads, headDim } = this.geometry
    const past: Past =
      cached === undefined
        ? { tensors: emptyPast(this.geometry, 1), width: 0 }
        : {
            tensors: cached.tensors.map((data) => cacheTensor(data, [1, heads, cached.width, headDim])),
            width: cached.width
          }
    this.caches.set(id, { past, row: 0 })
  }

  past(run: KvRun): RunPast {
    switch (run.kind) {
      case "prompts":
        return { past: emptyPast(this.geometry, run.ids.length), mask: rightAlignedMask(run.lengths, run.width) }
      case "alone":
        return { past: alonePast(this.geometry, run.after), mask: wholeRow(run.length) }
      case "piece":
        return { past: this.caches.get(run.id)!.past.tensors, mask: wholeRow(run.to) }
      case "decode": {
        const past = this.batchPast(run.ids, run.lengths)
        return {
          past: past.tensors,
          mask: rightAlignedMask(
            run.lengths.map((length) => length + 1),
            past.width + 1
          )
        }
      }
    }
  }

  write(run: KvRun, presents: ReadonlyArray<ort.Tensor>): void {
    // A present holds the whole cache: the past and the run's positions.
    const past: Past = { tensors: presents, width: presents[0]!.dims[2]! }
    if (run.kind === "prompts") run.ids.forEach((id, row) => this.caches.set(id, { past, row }))
    else if (run.kind === "piece") this.caches.set(run.id, { past, row: 0 })
    else if (run.kind === "decode") {
      this.batch = { order: run.ids, past }
      run.ids.forEach((id, row) => this.caches.set(id, { past, row }))
    }
  }

  row(id: string, length: number): CachedRow {
    const { past, row } = this.caches.get(id)!
    return {
      past: { tensors: past.tensors.map((tensor) => tensor.data as CacheArray), width: past.width },
      row,
      length
    }
  }

  release(id: string): void {
    this.caches.delete(id)
  }

  close(): void {
    this.caches.clear()
    this.batch = undefined
  }

  /** The past for a decode of `ids`: the last batch's as it is when the batch is unchanged, else its rows gathered anew. */
  private batchPast(ids: ReadonlyArray<string>, lengths: ReadonlyArray<number>): Past {
    const caches = ids.map((id) => this.caches.get(id)!)
    // A request alone whose past is its own, unpadded: as it is (requests run apart take this path).
    const only = caches.length === 1 ? caches[0]! : undefined
    if (only !== undefined && only.row === 0 && only.past.tensors[0]?.dims[0] === 1 && only.past.width === lengths[0])
      return only.past
    const previous = this.batch
    if (
      previous !== undefined &&
      previous.order.length === ids.length &&
      previous.order.every((id, i) => id === ids[i]) &&
      caches.every((cache, row) => cache.past === previous.past && cache.row === row)
    )
      return previous.past
    const { heads, headDim } = this.geometry
    const rows: Array<CachedRow> = caches.map((cache, i) => ({
      past: { tensors: cache.past.tensors.map((tensor) => tensor.data as CacheArray), width: cache.past.width },
      row: cache.row,
      length: lengths[i]!
    }))
    const gathered = gatherRows(rows, heads, headDim)
    const dims = [ids.length, heads, gathered.width, headDim]
    return { tensors: gathered.tensors.map((data) => cacheTensor(data, dims)), width: gathered.width }
  }
}
