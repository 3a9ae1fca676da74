/**
 * Where the LLM runner's KV cache lies, behind one interface: the runner says what a decoder run
 * is (prompts whole, a prompt's piece, a decode step, a prompt alone for its hidden states), and
 * the layout answers its past, mask and (for a rewritten decoder) its rows' lengths, then takes
 * the run's presents. Two layouts implement it:
 *
 * - SharedKvLayout.ts: the decoder's attention rewritten onto a cache the runner owns, a row per
 *   request (KvStore.ts): a decode step reads the batch's rows in place, each at its own length
 *   with no padding and no mask, and ONNX Runtime hands out only the step's new keys and values,
 *   which go into the rows;
 * - CopiedKvLayout.ts: the decoder as exported: each run's present, the whole cache copied, is
 *   the next run's past, rows right-aligned under a mask (PastCache.ts) and gathered anew when the
 *   batch changes.
 */
import type * as ort from "onnxruntime-node"
import type { CachedRow, PastData } from "./PastCache.js"
import type { PrefixCacheGeometry } from "./PrefixCache.js"
import { cacheTensor } from "./Tensors.js"

/** Cache tensors (a key and a value per layer), each [batch, heads, width, headDim], and their precision. */
export type KvGeometry = PrefixCacheGeometry

/** A decoder run, as the layout lays out its past. */
export type KvRun =
  /** Prompts with nothing cached, whole, left-padded to `width`, rows in `ids`' order (where `batchesPrompts`). */
  | {
      readonly kind: "prompts"
      readonly ids: ReadonlyArray<string>
      readonly lengths: ReadonlyArray<number>
      readonly width: number
    }
  /** Positions [from, to) of one request's prompt, over its own past. */
  | { readonly kind: "piece"; readonly id: string; readonly from: number; readonly to: number }
  /** One token for each of `ids`, whose caches hold `lengths` positions. */
  | { readonly kind: "decode"; readonly ids: ReadonlyArray<string>; readonly lengths: ReadonlyArray<number> }
  /**
   * A prompt's first `length` positions alone, keeping nothing (its hidden states, or its keys and
   * values for another executor): from nothing cached, or after `after`, a dense past of its first
   * positions (prefix cache blocks), [1, heads, after.width, headDim] a tensor.
   */
  | { readonly kind: "alone"; readonly length: number; readonly after?: PastData }

/** What a run takes besides its tokens and positions. */
export interface RunPast {
  readonly past: ReadonlyArray<ort.Tensor>
  readonly mask: BigInt64Array
  /** For a decoder on the shared cache: each row's length after the run, less one, and the longest. */
  readonly lengths?: { readonly seqlens: Int32Array; readonly total: number }
}

export interface KvLayout {
  /** Whether prompts with nothing cached may be prefilled as one batch, left-padded. */
  readonly batchesPrompts: boolean
  /** Bytes its own buffers take (the copies' tensors are ONNX Runtime's, counted as none). */
  readonly bytes: number
  /** A request joins with room for its prompt, starting from the positions of `cached` (the prefix cache's). */
  join(id: string, promptLength: number, cached: PastData | undefined): void
  /** The past of a run, which it may lay out anew first. */
  past(run: KvRun): RunPast
  /** Keeps a run's presents, the decoder's outputs in cache order. */
  write(run: KvRun, presents: ReadonlyArray<ort.Tensor>): void
  /** Where a request's first `length` positions lie, for the prefix cache to copy. */
  row(id: string, length: number): CachedRow & { readonly start?: number }
  /** Frees a request's cache; `longest` is the most positions a request left holds, plus one. */
  release(id: string, longest: number): void
  close(): void
}

/** A past of no positions for `batch` requests. */
export const emptyPast = (geometry: KvGeometry, batch: number): ReadonlyArray<ort.Tensor> => {
  const empty = cacheTensor(geometry.half ? new Uint16Array(0) : new Float32Array(0), [
    batch,
    geometry.heads,
    0,
    geometry.headDim
  ])
  return Array.from({ length: geometry.tensors }, () => empty)
}

/** An "alone" run's past: `after`'s tensors as they are, or none. */
export const alonePast = (geometry: KvGeometry, after: PastData | undefined): ReadonlyArray<ort.Tensor> =>
  after === undefined
    ? emptyPast(geometry, 1)
    : after.tensors.map((data) => cacheTensor(data, [1, geometry.heads, after.width, geometry.headDim]))

/** A mask that shows every one of `length` positions of one row. */
export const wholeRow = (length: number): BigInt64Array => new BigInt64Array(length).fill(1n)
