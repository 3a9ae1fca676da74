import { Schema } from "effect"
import { dtypes } from "../../models/Dtype.js"
import { MediaLimits } from "./media/MediaLimits.js"

/**
 * What an executor's three roles (router, engine, workers) are told. The router gets it on its
 * command line and hands it to the engine, which hands it to its workers, as JSON in the
 * environment.
 */
export const ExecutorConfig = Schema.Struct({
  kind: Schema.Literal("eric", "geri", "llm"),
  /** The model id as asked for (a built-in name or a directory). */
  model: Schema.String,
  /** The model's directory on this node. */
  modelDir: Schema.String,
  /** Which of the model's ONNX exports to run; by default fp32, or the closest there is. */
  dtype: Schema.optional(Schema.Literal(...dtypes)),
  devices: Schema.Array(Schema.String),
  threadsPerDevice: Schema.Int.pipe(Schema.positive()),
  host: Schema.String,
  port: Schema.Int.pipe(Schema.between(0, 65535)),
  /** A private directory for the executor's sockets and shared memory names. */
  runDir: Schema.String,
  maxBatchSize: Schema.Int.pipe(Schema.positive()),
  maxBatchDelayMs: Schema.Number.pipe(Schema.nonNegative()),
  maxQueuedRequests: Schema.Int.pipe(Schema.positive()),
  batchSlotBytes: Schema.Int.pipe(Schema.positive()),
  preprocessThreads: Schema.Int.pipe(Schema.positive()),
  /** The node's sidecar, when tensors go to or come from other executors. */
  sidecarSocket: Schema.optional(Schema.String),
  /** Directory below which file: media URLs may be read. */
  mediaRoot: Schema.optional(Schema.String),
  allowPrivateHosts: Schema.Boolean,
  maxMediaBytes: Schema.Int.pipe(Schema.positive()),
  /** Media items one request may carry (Eric's items, the media parts of an LLM request's messages). */
  maxMediaItems: Schema.Int.pipe(Schema.positive()),
  ...MediaLimits.fields,
  /** How long Geri waits for an embedding to arrive through the sidecar. */
  embeddingWaitMs: Schema.Int.pipe(Schema.positive()),
  /** LLM: KV cache positions per device (default: maxBatchSize requests at the model's context length). */
  kvCacheTokens: Schema.optional(Schema.Int.pipe(Schema.positive())),
  /** LLM: bytes of KV cache blocks kept for prompts' prefixes, per device; 0 keeps none (default 512 MiB). */
  prefixCacheBytes: Schema.optional(Schema.Int.pipe(Schema.nonNegative())),
  /**
   * LLM: prompt tokens a step prefills while other requests decode; absent, sized to take no
   * longer than their decode step; 0 prefills each prompt whole.
   */
  prefillChunkTokens: Schema.optional(Schema.Int.pipe(Schema.nonNegative())),
  /**
   * LLM, a decoder that quantises activations per tensor (8-bit exports): each request's runs
   * apart (exact; the default), or decode steps batched with a scale per row.
   */
  quantizedRows: Schema.optional(Schema.Literal("apart", "per-row")),
  /**
   * LLM: the KV cache in buffers the runner owns, the decoder's attention rewritten to read them
   * in place (the default, where the graph matches), or the decoder as exported.
   */
  kvCacheMode: Schema.optional(Schema.Literal("shared", "copies"))
})
export type ExecutorConfig = typeof ExecutorConfig.Type

export const configEnvName = "CORNSERVE_EXECUTOR_CONFIG"

export const decodeConfig = Schema.decodeUnknownSync(Schema.parseJson(ExecutorConfig))

export const ipcPath = (config: ExecutorConfig, name: string) => `ipc://${config.runDir}/${name}.sock`
