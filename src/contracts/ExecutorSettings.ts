import * as Schema from "effect/Schema"

/**
 * How one executor runs its work: its batches, threads and, for the LLM executor, its KV cache.
 * The control plane merges a task's settings over `serve`'s defaults into this record and sends
 * it with the executor's placement (NodeRpcs.ts); the executor's router decodes it, and its
 * config (src/executors/common/ExecutorConfig.ts) holds these fields as they are. One record, one
 * schema: no setting is rebuilt as command-line flags on the way.
 */
export const ExecutorSettings = Schema.Struct({
  /** ONNX Runtime threads of each worker: its share of its device's threads. */
  threadsPerDevice: Schema.Int.pipe(Schema.between(1, 1024)),
  /** Items in one batch (Eric, Geri); requests decoding together on a device (the LLM). */
  maxBatchSize: Schema.Int.pipe(Schema.between(1, 4096)),
  /** How long a batch that is not full may wait to fill. */
  maxBatchDelayMs: Schema.Number.pipe(Schema.between(0, 60_000)),
  /** The router's threads that decode and preprocess media (and long prompts). */
  preprocessThreads: Schema.Int.pipe(Schema.between(1, 256)),
  /**
   * LLM: bytes per device for the KV cache, the running requests' and the prefix cache's
   * together; the engine admits requests by it and the cache never grows past it (default: a
   * full batch at the model's context length, and the prefix cache's bytes).
   */
  kvCacheBytes: Schema.optional(Schema.Int.pipe(Schema.positive())),
  /** LLM: of the KV cache's bytes, those kept for prompts' prefixes per device; 0 keeps none (default 512 MiB). */
  prefixCacheBytes: Schema.optional(Schema.Int.pipe(Schema.nonNegative())),
  /**
   * LLM: prompt tokens a step prefills while other requests decode; absent, sized to take no
   * longer than their decode step; 0 prefills each prompt whole.
   */
  prefillChunkTokens: Schema.optional(Schema.Int.pipe(Schema.between(0, 1_048_576))),
  /**
   * LLM: the KV cache in buffers the runner owns, the decoder's attention rewritten to read them
   * in place (the default, where the graph matches), or the decoder as exported.
   */
  kvCacheMode: Schema.optional(Schema.Literal("shared", "copies")),
  /**
   * LLM, a decoder that quantises activations per tensor (8-bit exports): each request's runs
   * apart (exact; the default), or decode steps batched with a scale per row.
   */
  quantizedRows: Schema.optional(Schema.Literal("apart", "per-row")),
  /**
   * LLM, a 4-bit decoder (MatMulNBits): activations as the export computes them (fp32, exact; the
   * default), or quantised to 8 bits per row (about 2× the decode speed; tokens may part from
   * transformers.js's at near-ties).
   */
  q4Activations: Schema.optional(Schema.Literal("exported", "int8")),
  /**
   * Eric: other models whose vision encoders hold this model's tower and differ in the projector
   * alone (Gemma 3's sizes): the executor runs the tower once for all and each model's projector
   * apart (the original Cornserve's encoder adapters). Sorted, without the executor's own model.
   */
  adapters: Schema.optional(Schema.Array(Schema.NonEmptyTrimmedString).pipe(Schema.maxItems(16)))
})
export type ExecutorSettings = typeof ExecutorSettings.Type

/** Whether two records ask for the same executor (their fields equal, whatever their order). */
export const sameSettings = (a: ExecutorSettings, b: ExecutorSettings): boolean => {
  const keys = new Set([...Object.keys(a), ...Object.keys(b)]) as Set<keyof ExecutorSettings>
  return [...keys].every((key) =>
    key === "adapters" ? (a.adapters ?? []).join("\n") === (b.adapters ?? []).join("\n") : a[key] === b[key]
  )
}
