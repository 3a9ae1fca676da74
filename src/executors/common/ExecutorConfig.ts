import * as Schema from "effect/Schema"
import { ExecutorSettings } from "../../contracts/ExecutorSettings.js"
import { dtypes } from "../../models/Dtype.js"
import { MediaLimits } from "./media/MediaLimits.js"

/**
 * What an executor's router, engine and workers are told. The router gets it on its command line,
 * runs the engine with it and hands it to its workers, as JSON in the environment.
 */
export const ExecutorConfig = Schema.Struct({
  kind: Schema.Literal("eric", "geri", "llm"),
  /** The model id as asked for (a built-in name or a directory). */
  model: Schema.String,
  /** The model's directory on this node. */
  modelDir: Schema.String,
  /** Eric: the directories of `adapters` (see ExecutorSettings), on this node, in their order. */
  adapterDirs: Schema.optional(Schema.Array(Schema.String)),
  /** Which of the model's ONNX exports to run; by default fp32, or the closest there is. */
  dtype: Schema.optional(Schema.Literal(...dtypes)),
  devices: Schema.Array(Schema.String),
  host: Schema.String,
  port: Schema.Int.pipe(Schema.between(0, 65535)),
  /** A private directory for the executor's sockets and shared memory names. */
  runDir: Schema.String,
  maxQueuedRequests: Schema.Int.pipe(Schema.positive()),
  batchSlotBytes: Schema.Int.pipe(Schema.positive()),
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
  /** Batches, threads and the LLM's KV cache: the record the control plane sends with the placement. */
  ...ExecutorSettings.fields
})
export type ExecutorConfig = typeof ExecutorConfig.Type

/** `--devices cpu:0,cpu:1` as a list: the names between its commas, blanks dropped. */
export const deviceList = (text: string): ReadonlyArray<string> =>
  text
    .split(",")
    .map((device) => device.trim())
    .filter((device) => device.length > 0)

/**
 * What `cornserve internal executor` takes when a flag is not given: the CLI's defaults, and a
 * platform-started router's (see `platformLaunch` in ExecutorCommand.ts), which the platform starts
 * with the flags of its placement alone.
 */
export const executorDefaults = {
  devices: "cpu:0",
  threadsPerDevice: 1,
  host: "127.0.0.1",
  port: 0,
  maxBatchSize: 8,
  maxBatchDelayMs: 2,
  maxQueuedRequests: 256,
  preprocessThreads: 2,
  maxMediaBytes: 32 * 1024 * 1024,
  batchSlotBytes: 64 * 1024 * 1024,
  embeddingWaitMs: 30_000
} as const

export const decodeConfig = Schema.decodeUnknownSync(Schema.parseJson(ExecutorConfig))

/**
 * An executor started by hand, without `--run-dir`, keeps its sockets in
 * `cornserve-executor-<pid>` in the temporary directory (a platform gives each executor a
 * directory inside its node agent's own).
 */
export const standaloneRunDirPrefix = "cornserve-executor-"

export const ipcPath = (config: ExecutorConfig, name: string) => `ipc://${config.runDir}/${name}.sock`
