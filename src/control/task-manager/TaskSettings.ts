import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import { LlmSettings } from "../../app-runtime/tasks/EngineSettings.js"
import type { UnitTaskSpec } from "../../app-runtime/driver/protocol.js"
import { defaultEngineSettings, type EngineDefaults } from "../../config/ServeConfig.js"
import type { ExecutorSettings } from "../../contracts/ExecutorSettings.js"

/** What a task's executors run with, but their threads (each executor's share of its device). */
export type TaskSettings = Omit<ExecutorSettings, "threadsPerDevice">

/** The engine settings a task's config names (it was checked when its app loaded). */
const decodeNamed = Schema.decodeUnknownOption(LlmSettings)

/**
 * A text embedder's and a speech recognizer's batches take what is queued when the worker is
 * free, without waiting to fill: a lone request runs at once, and requests that arrive during a
 * batch form the next.
 */
const runsAtOnce = new Set(["text-embedder", "speech-recognizer"])

/**
 * The settings a task's executors run with: the task's own fields over `serve`'s defaults. The
 * KV cache's fields are the LLM's alone. What `tasks list` shows and what each executor is sent.
 */
export const taskSettings = (task: UnitTaskSpec, defaults: EngineDefaults = defaultEngineSettings): TaskSettings => {
  const named = Option.getOrElse(decodeNamed(task.config), () => ({}) as typeof LlmSettings.Type)
  const base = {
    maxBatchSize: named.maxBatchSize ?? (task.kind === "llm" ? defaults.llmMaxBatchSize : 1),
    maxBatchDelayMs: named.maxBatchDelayMs ?? (runsAtOnce.has(task.kind) ? 0 : defaults.maxBatchDelayMs),
    preprocessThreads: named.preprocessThreads ?? defaults.preprocessThreads
  }
  if (task.kind !== "llm") {
    // An encoder's adapters: the models whose projectors it runs over its tower (EncoderTask).
    const adapters =
      task.kind === "encoder" ? (task.config as { readonly adapters?: ReadonlyArray<string> }).adapters : undefined
    return adapters === undefined || adapters.length === 0 ? base : { ...base, adapters }
  }
  const kvCacheBytes = named.kvCacheBytes ?? defaults.kvCacheBytes
  const prefixCacheBytes = named.prefixCacheBytes ?? defaults.prefixCacheBytes
  const prefillChunkTokens = named.prefillChunkTokens ?? defaults.prefillChunkTokens
  const kvCacheMode = named.kvCacheMode ?? defaults.kvCacheMode
  const quantizedRows = named.quantizedRows ?? defaults.quantizedRows
  const q4Activations = named.q4Activations ?? defaults.q4Activations
  return {
    ...base,
    ...(kvCacheBytes === undefined ? {} : { kvCacheBytes }),
    ...(prefixCacheBytes === undefined ? {} : { prefixCacheBytes }),
    ...(prefillChunkTokens === undefined ? {} : { prefillChunkTokens }),
    ...(kvCacheMode === undefined ? {} : { kvCacheMode }),
    ...(quantizedRows === undefined ? {} : { quantizedRows }),
    ...(q4Activations === undefined ? {} : { q4Activations })
  }
}
