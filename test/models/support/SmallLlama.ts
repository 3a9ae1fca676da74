import type { LlamaConfig } from "../../../src/models/architectures/Llama.js"

/**
 * A small Llama-family decoder for the community-layout tests: GQA (4 query heads on 2 KV heads)
 * with a head_dim that is not hidden / heads.
 */
export const smallLlamaConfig: LlamaConfig = {
  hiddenSize: 64,
  intermediateSize: 96,
  layers: 2,
  heads: 4,
  kvHeads: 2,
  headDim: 24,
  vocabSize: 512,
  maxPositions: 128,
  ropeTheta: 10000,
  rmsNormEps: 1e-5
}
