import type { Tensor } from "../../sidecar/Tensor.js"
import type { ExecutorConfig } from "./ExecutorConfig.js"
import type { BatchItem } from "./wire.js"

/** One worker's view of a batch: its items' inputs, stacked, and a way to stream partial results. */
export interface WorkerBatch {
  readonly inputs: Readonly<Record<string, Tensor>>
  /** Its items, with `rows` relative to `inputs`. */
  readonly items: ReadonlyArray<BatchItem>
  /** Sends a piece of item `item`'s result (its index in `items`) before the batch ends. */
  readonly emit: (item: number, value: unknown) => void
  /** Whether item `item`'s request was cancelled while the batch runs (told only to models that run batches side by side). */
  readonly cancelled: (item: number) => boolean
}

/** A model loaded on one device; what each executor kind supplies for its workers. */
export interface WorkerModel {
  /** One result per item, in order. */
  run(batch: WorkerBatch): Promise<ReadonlyArray<unknown>>
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

/** The module `executors/<kind>/worker.ts` exports this. */
export type LoadWorkerModel = (context: WorkerContext) => Promise<WorkerModel>
