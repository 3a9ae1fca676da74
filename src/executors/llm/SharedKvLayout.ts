/**
 * The KV layout of a decoder rewritten onto a shared cache (SharedCacheRewrite.ts): each request
 * holds a row of KvStore.ts's buffers, which the decoder reads in place; a run's presents are its
 * new positions alone, written into the rows. A request alone reads its row where it is; a batch
 * is first arranged into the first rows.
 */
import type * as ort from "onnxruntime-node"
import { alonePast, type KvGeometry, type KvLayout, type KvRun, type RunPast, wholeRow } from "./KvLayout.js"
import { KvStore } from "./KvStore.js"
import { kvBlockTokens } from "./Limits.js"
import { type CacheArray, type PastData, rightAlignedMask } from "./PastCache.js"
import { cacheTensor } from "./Tensors.js"

export class SharedKvLayout implements KvLayout {
  readonly batchesPrompts = false
  private readonly store: KvStore

  constructor(
    private readonly geometry: KvGeometry,
    /** Bytes the rows may take (default: no bound). */
    maxBytes?: number
  ) {
    const { tensors, heads, headDim, half } = geometry
    this.store = new KvStore(tensors, heads, headDim, half, kvBlockTokens, maxBytes)
  }

  get bytes(): number {
    return this.store.bytes
  }

  join(id: string, promptLength: number, cached: PastData | undefined): void {
    const row = this.store.acquire(id)
    // Room for the whole prompt at once: its chunks then write into the rows as they are.
    this.store.ensureWidth(promptLength + 1)
    if (cached === undefined) return
    this.store.ensureWidth(cached.width)
    this.store.writePast(cached.tensors, row, cached.width)
  }

  past(run: KvRun): RunPast {
    const store = this.store
    switch (run.kind) {
      case "prompts":
        throw new Error("the shared cache prefills each prompt over its own row")
      case "alone":
        return {
          past: alonePast(this.geometry, run.after),
          mask: wholeRow(run.length),
          lengths: { seqlens: Int32Array.of(run.length - 1), total: run.length }
        }
      case "piece":
        store.ensureWidth(run.to)
        return {
          past: this.rows(store.row(run.id), 1),
          mask: wholeRow(run.to),
          lengths: { seqlens: Int32Array.of(run.to - 1), total: run.to }
        }
      case "decode": {
        const { ids, lengths } = run
        if (ids.length > 1) store.arrange(ids)
        const total = Math.max(...lengths) + 1
        store.ensureWidth(total)
        return {
          past: this.rows(this.firstRow(ids), ids.length),
          mask: rightAlignedMask(
            lengths.map((length) => length + 1),
            total
          ),
          lengths: { seqlens: Int32Array.from(lengths), total }
        }
      }
    }
  }

  write(run: KvRun, presents: ReadonlyArray<ort.Tensor>): void {
    const store = this.store
    if (run.kind === "piece") {
      const row = store.row(run.id)
      presents.forEach((present, t) => store.write(t, row, run.from, present.data as CacheArray, 0, run.to - run.from))
    } else if (run.kind === "decode") {
      const first = this.firstRow(run.ids)
      presents.forEach((present, t) =>
        run.lengths.forEach((length, row) => store.write(t, first + row, length, present.data as CacheArray, row, 1))
      )
    }
  }

  row(id: string, length: number) {
    const store = this.store
    return { past: { tensors: store.data, width: store.width }, row: store.row(id), length, start: 0 }
  }

  /** Frees a request's row; the rows left give back room they no longer need. */
  release(id: string, longest: number): void {
    if (!this.store.has(id)) return
    this.store.release(id)
    this.store.fit(longest)
  }

  close(): void {
    for (const id of this.store.held) this.store.release(id)
  }

  /** A request alone reads its row where it is (requests run apart take this path every step); a batch, the first rows. */
  private firstRow(ids: ReadonlyArray<string>): number {
    return ids.length === 1 ? this.store.row(ids[0]!) : 0
  }

  /** Rows [from, from + count) as the decoder's past, as they lie. */
  private rows(from: number, count: number): ReadonlyArray<ort.Tensor> {
    const { heads, headDim, tensors } = this.geometry
    const dims = [count, heads, this.store.width, headDim]
    return Array.from({ length: tensors }, (_, t) => cacheTensor(this.store.view(t, from, count), dims))
  }
}
