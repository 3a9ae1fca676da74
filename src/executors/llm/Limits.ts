import type { ModelDirectory } from "../../models/ModelDirectory.js"
import type { ExecutorConfig } from "../common/ExecutorConfig.js"

/** Positions a sequence may have, prompt and completion together, when the config names none. */
const defaultContextLength = 2048

/** The model's context length: its max_position_embeddings, else its tokenizer's model_max_length. */
export const contextLength = (model: ModelDirectory): number => {
  if (model.decoder?.maxPositions !== undefined) return model.decoder.maxPositions
  const fromTokenizer = model.tokenizer?.rawConfig.model_max_length
  return typeof fromTokenizer === "number" && Number.isSafeInteger(fromTokenizer) && fromTokenizer > 0
    ? fromTokenizer
    : defaultContextLength
}

/** Positions the KV store's rows grow by: the unit a request's room in it is counted in. */
export const kvBlockTokens = 256

/** The prefix cache's bytes when nothing bounds the KV cache. */
export const defaultPrefixCacheBytes = 512 * 1024 * 1024

/**
 * One device's KV cache, in bytes: what its running requests' rows may hold (the engine admits
 * requests by it, and the worker's store never grows past it) and what its prefix cache may keep.
 */
export interface KvBudget {
  /** Bytes one position of one sequence takes: every layer's key and value. */
  readonly bytesPerPosition: number
  /** Running requests' and prefix cache's together (`kvCacheBytes`). */
  readonly totalBytes: number
  /** The prefix cache's share. */
  readonly prefixBytes: number
  /** The running requests' rows: the rest. */
  readonly rowBytes: number
  readonly blockTokens: number
}

/** A float16 export keeps its cache in float16; the others (fp32 and the 8-bit and 4-bit ones) in float32. */
const cacheElementBytes = (config: ExecutorConfig) => (config.dtype === "fp16" || config.dtype === "q4f16" ? 2 : 4)

/**
 * The budget the config sets, or by default room for a full batch at the model's context length
 * plus 512 MiB of prefix cache. Given a budget but no prefix share, the prefix cache takes a
 * quarter of it (at most 512 MiB).
 */
export const kvBudget = (config: ExecutorConfig, model: ModelDirectory): KvBudget => {
  const spec = model.decoder
  const bytesPerPosition =
    spec === undefined ? 0 : 2 * spec.layers * spec.keyValueHeads * spec.headDim * cacheElementBytes(config)
  const fullBatch =
    config.maxBatchSize * Math.ceil(contextLength(model) / kvBlockTokens) * kvBlockTokens * bytesPerPosition
  const totalBytes = config.kvCacheBytes ?? fullBatch + (config.prefixCacheBytes ?? defaultPrefixCacheBytes)
  const prefixBytes =
    config.prefixCacheBytes ??
    (config.kvCacheBytes === undefined
      ? defaultPrefixCacheBytes
      : Math.min(defaultPrefixCacheBytes, Math.floor(totalBytes / 4)))
  // Without a budget given, the rows get a full batch's bytes: none where the decoder's geometry is
  // not known (Janus's image-token LLM), whose rows are then counted as holding nothing.
  if (config.kvCacheBytes !== undefined && prefixBytes >= totalBytes)
    throw new Error(
      `the prefix cache's ${prefixBytes} bytes leave nothing of the KV cache's ${totalBytes} bytes to running requests: give --kv-cache-bytes more than --prefix-cache-bytes`
    )
  return { bytesPerPosition, totalBytes, prefixBytes, rowBytes: totalBytes - prefixBytes, blockTokens: kvBlockTokens }
}

/** Bytes `rows` requests hold when the longest holds `positions`: the store is rows × the longest's blocks. */
export const rowsBytes = (
  budget: Pick<KvBudget, "bytesPerPosition" | "blockTokens">,
  rows: number,
  positions: number
): number => rows * Math.ceil(positions / budget.blockTokens) * budget.blockTokens * budget.bytesPerPosition
