import * as Schema from "effect/Schema"

/**
 * How a task's executors run, as an app may set it in the task's config. A field left out takes
 * `cornserve serve`'s default (its flags of the same names); tasks that differ in them are
 * different deployments. The platform sends the merged values to each executor as one record.
 */

/** Batches and threads, for every kind of task. */
export const BatchSettings = {
  /** How long a batch that is not full may wait to fill (ms). */
  maxBatchDelayMs: Schema.optional(Schema.Number.pipe(Schema.between(0, 60_000))),
  /** Threads of the executor's router that decode and preprocess media (and long prompts). */
  preprocessThreads: Schema.optional(Schema.Int.pipe(Schema.between(1, 256)))
}

/** The LLM executor's engine: its batch and its KV cache. */
export const LlmEngineSettings = {
  /** Requests decoding together on a device. */
  maxBatchSize: Schema.optional(Schema.Int.pipe(Schema.between(1, 4096))),
  /**
   * Bytes of KV cache per device, the running requests' and the prefix cache's together: requests
   * are admitted by it, the cache never grows past it, and a request that cannot fit even alone is
   * refused (400) with the bytes it needs.
   */
  kvCacheBytes: Schema.optional(Schema.Int.pipe(Schema.positive())),
  /** Of those, the bytes kept for prompts' prefixes (a repeated system prompt, a chat's earlier turns); 0 keeps none. */
  prefixCacheBytes: Schema.optional(Schema.Int.pipe(Schema.nonNegative())),
  /** Prompt tokens a step prefills while other requests decode; 0 prefills each prompt whole. */
  prefillChunkTokens: Schema.optional(Schema.Int.pipe(Schema.between(0, 1_048_576))),
  /** The KV cache in buffers the executor owns, read in place ("shared"), or the decoder as exported ("copies"). */
  kvCacheMode: Schema.optional(Schema.Literal("shared", "copies")),
  /** 8-bit exports that quantise activations per tensor: each request apart (exact), or decode steps batched per row. */
  quantizedRows: Schema.optional(Schema.Literal("apart", "per-row")),
  /** 4-bit exports (MatMulNBits): activations in fp32 as exported (exact), or in 8 bits per row (about 2× the decode speed). */
  q4Activations: Schema.optional(Schema.Literal("exported", "int8")),
  ...BatchSettings
}

/** The prefix cache takes its bytes out of the KV cache's: a share as large as the whole leaves running requests none. */
export const prefixWithinKvCache = (settings: {
  readonly kvCacheBytes?: number | undefined
  readonly prefixCacheBytes?: number | undefined
}) =>
  settings.kvCacheBytes !== undefined &&
  settings.prefixCacheBytes !== undefined &&
  settings.prefixCacheBytes >= settings.kvCacheBytes
    ? {
        path: ["prefixCacheBytes"],
        message: `must be less than kvCacheBytes (${settings.kvCacheBytes}), of which it is the prefix cache's share`
      }
    : undefined

/** An LLM's engine settings as one object (an MLLMTask passes them on to its LLM). */
export const LlmSettings = Schema.Struct(LlmEngineSettings).pipe(Schema.filter(prefixWithinKvCache))
export type LlmSettings = typeof LlmSettings.Encoded

/** An encoder's settings as one object (an MLLMTask passes them on to its encoders). */
export const EncoderSettings = Schema.Struct({
  maxBatchSize: Schema.optional(Schema.Int.pipe(Schema.between(1, 4096))),
  ...BatchSettings
})
export type EncoderSettings = typeof EncoderSettings.Encoded
