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

/** KV cache positions per device: as configured, else a full batch at the full context length. */
export const kvCacheTokens = (config: ExecutorConfig, model: ModelDirectory): number =>
  config.kvCacheTokens ?? config.maxBatchSize * contextLength(model)
