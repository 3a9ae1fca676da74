import { type Dtype, onnxFileName } from "../Dtype.js"
import { type LlamaConfig, type LlamaExport, llamaConfigJson, llamaGraphs } from "../architectures/Llama.js"
import { Graph } from "../onnx/Graph.js"
import { chatVocabulary, specialTokens, tokenizerConfig } from "./ChatVocabulary.js"
import { jsonFile, type ModelFiles, type ModelRecipe, recipeStamp } from "./Recipe.js"

/**
 * Model directories of a random-weight Llama in the community's layouts, at any size and dtype:
 * test fixtures and the benchmark's SmolLM2-sized model. Each dtype is its own file
 * (`onnx/model_q4.onnx`, ...), as exporters publish them; several can share one directory.
 */

export interface RandomLlamaOptions {
  readonly config: LlamaConfig
  readonly layout: LlamaExport["layout"]
  /** The files to write: one per dtype, all from the same seed. */
  readonly dtypes: ReadonlyArray<Dtype>
  readonly positionIds?: boolean
  readonly pastPrefix?: LlamaExport["pastPrefix"]
  readonly attention?: LlamaExport["attention"]
  readonly seed?: number
  /** Initializers at least this large go to `<file>_data` (external data), as exporters do for big models. */
  readonly externalDataMinBytes?: number
  /** The tokenizer files; by default the project's chat vocabulary padded to the model's vocabulary. */
  readonly tokenizer?: {
    readonly json: unknown
    readonly config: unknown
    readonly eosTokenId: number | ReadonlyArray<number>
    readonly bosTokenId?: number
  }
  /** Fields added to config.json. */
  readonly extraConfig?: Record<string, unknown>
  /** Extra files (a chat_template.jinja, a generation_config.json that replaces the default). */
  readonly extraFiles?: ReadonlyMap<string, Uint8Array>
}

export const randomLlamaFiles = (options: RandomLlamaOptions): ModelFiles => {
  const { config } = options
  const tokenizer: NonNullable<RandomLlamaOptions["tokenizer"]> =
    options.tokenizer ??
    (() => {
      const vocabulary = chatVocabulary(config.vocabSize)
      return {
        json: vocabulary.tokenizerJson,
        config: tokenizerConfig(vocabulary, config.maxPositions),
        eosTokenId: vocabulary.tokenId(specialTokens.imEnd)!
      }
    })()
  const files = new Map<string, Uint8Array>([
    [
      "config.json",
      jsonFile(
        llamaConfigJson(config, {
          eos_token_id: tokenizer.eosTokenId,
          ...(tokenizer.bosTokenId === undefined ? {} : { bos_token_id: tokenizer.bosTokenId }),
          ...options.extraConfig
        })
      )
    ],
    [
      "generation_config.json",
      jsonFile({
        eos_token_id: tokenizer.eosTokenId,
        ...(tokenizer.bosTokenId === undefined ? {} : { bos_token_id: tokenizer.bosTokenId }),
        do_sample: false
      })
    ],
    ["tokenizer.json", jsonFile(tokenizer.json)],
    ["tokenizer_config.json", jsonFile(tokenizer.config)]
  ])
  for (const dtype of options.dtypes) {
    const graphs = llamaGraphs(
      config,
      {
        layout: options.layout,
        dtype,
        positionIds: options.positionIds ?? true,
        pastPrefix: options.pastPrefix ?? "past_key_values",
        ...(options.attention === undefined ? {} : { attention: options.attention }),
        seed: options.seed ?? 1,
        std: 0.1
      },
      (name) => new Graph(name)
    )
    for (const [stem, graph] of graphs) {
      const file = onnxFileName(stem, dtype)
      if (options.externalDataMinBytes === undefined) {
        files.set(`onnx/${file}`, graph.toBytes())
        continue
      }
      const { model, data } = graph.toFiles({
        externalData: { location: `${file}_data`, minBytes: options.externalDataMinBytes }
      })
      files.set(`onnx/${file}`, model)
      if (data !== undefined) files.set(`onnx/${file}_data`, data)
    }
  }
  for (const [path, bytes] of options.extraFiles ?? []) files.set(path, bytes)
  return files
}

/** SmolLM2-135M's geometry: 30 layers, hidden 576, 9 query heads sharing 3 KV heads, vocabulary 49152. */
export const smolLm2Geometry: LlamaConfig = {
  hiddenSize: 576,
  intermediateSize: 1536,
  layers: 30,
  heads: 9,
  kvHeads: 3,
  headDim: 64,
  vocabSize: 49152,
  maxPositions: 8192,
  ropeTheta: 100000,
  rmsNormEps: 1e-5
}

/** bench/smollm2-135m: random weights at SmolLM2-135M's size, in the decoder-only layout (fp32 and q8). */
export const benchSmolLm2: ModelRecipe = {
  name: "bench/smollm2-135m",
  // 2: graph outputs are named at the node that computes them (no Identity copy of the cache).
  // 3: a q8 export (model_quantized.onnx) beside the fp32 one.
  version: 3,
  build: () =>
    randomLlamaFiles({
      config: smolLm2Geometry,
      layout: "decoder-only",
      dtypes: ["fp32", "q8"],
      seed: 135,
      extraConfig: { cornserve: recipeStamp({ name: "bench/smollm2-135m", version: 3 }) }
    })
}
