import type { Tensor } from "../../sidecar/Tensor.js"
import type { ExecutorConfig } from "./ExecutorConfig.js"
import type { BatchItem } from "./wire.js"

/**
 * One worker's view of a batch: its items' inputs, stacked, and a way to stream partial results.
 * `Meta` is what the kind's engine puts on each item, `Partial` what the worker streams of a result:
 * the kind's wire types, which its router and engine write with the same types.
 */
export interface WorkerBatch<Meta = unknown, Partial = unknown> {
  readonly inputs: Readonly<Record<string, Tensor>>
  /** Its items, with `rows` relative to `inputs`. */
  readonly items: ReadonlyArray<BatchItem<Meta>>
  /** Sends a piece of item `item`'s result (its index in `items`) before the batch ends. */
  readonly emit: (item: number, value: Partial) => void
  /** Whether item `item`'s request was cancelled while the batch runs (told only to models that run batches side by side). */
  readonly cancelled: (item: number) => boolean
}

/** A model loaded on one device; what each executor kind supplies for its workers, typed by its wire. */
export interface WorkerModel<Meta = unknown, Result = unknown, Partial = unknown> {
  /** One result per item, in order. */
  run(batch: WorkerBatch<Meta, Partial>): Promise<ReadonlyArray<Result>>
  close(): Promise<void>
  /**
   * The model makes its own spans of its items (the LLM's, whose request spans many steps). Otherwise
   * each batch is one span per request in it, and the items' `trace` the model sees is that span.
   */
  readonly tracesItsItems?: boolean
  /**
   * The model runs a batch while others run (its runs interleave on the device): the worker hands
   * it each batch as it arrives instead of after the last one ended. For batches that last as long
   * as their output streams, so that a new request does not wait for the end of another's.
   */
  readonly concurrentBatches?: boolean
}

export interface WorkerContext {
  readonly config: ExecutorConfig
  readonly rank: number
  readonly device: string
}

/** The module `executors/<kind>/worker.ts` exports this, typed by its kind's wire. */
export type LoadWorkerModel<Meta = unknown, Result = unknown, Partial = unknown> = (
  context: WorkerContext
) => Promise<WorkerModel<Meta, Result, Partial>>

/** Whether every item of a batch has meta of one shape (a kind whose batches hold one shape each). */
export const everyItem = <Meta, Narrow extends Meta>(
  items: ReadonlyArray<BatchItem<Meta>>,
  is: (meta: Meta) => meta is Narrow
): items is ReadonlyArray<BatchItem<Narrow>> => items.every((item) => is(item.meta))
