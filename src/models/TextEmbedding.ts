import { readFile } from "node:fs/promises"
import { join } from "node:path"
import * as Either from "effect/Either"
import * as Schema from "effect/Schema"
import { type Dtype, dtypePreference, onnxFileName } from "./Dtype.js"
import { decodeConfig, InvalidModelDirectory, type ModelDirectory } from "./ModelDirectory.js"

/**
 * A model directory as a text embedding model, in the layout the community exports
 * sentence-embedding models for transformers.js (Xenova/all-MiniLM-L6-v2, BAAI/bge-small-en-v1.5,
 * onnx-community/Qwen3-Embedding-0.6B-ONNX): onnx/model.onnx in its dtypes (model_fp16.onnx,
 * model_quantized.onnx, ...) answering last_hidden_state, a tokenizer.json, and the
 * sentence-transformers files that say how token embeddings become one vector: modules.json, its
 * Pooling module's config (1_Pooling/config.json) and whether a Normalize module follows, and
 * sentence_bert_config.json's max_seq_length.
 */

/** How a sequence's token embeddings become one vector: their mean, the first ([CLS]), or the last. */
export const Pooling = Schema.Literal("mean", "cls", "last")
export type Pooling = typeof Pooling.Type

export interface TextEmbeddingSpec {
  readonly hiddenSize: number
  readonly vocabSize: number
  /** Tokens one input may have, the tokenizer's special tokens included. */
  readonly maxTokens: number
  /** As the sentence-transformers files say; undefined when they say nothing (see `poolingSource`). */
  readonly pooling: Pooling | undefined
  /** Whether modules.json ends in a Normalize module; undefined without modules.json. */
  readonly normalize: boolean | undefined
  /** Where `pooling` comes from, or why it is not known. */
  readonly poolingSource: string
  /**
   * Sizes the vectors may be cut to (Matryoshka representation learning): the ones config.json's
   * `matryoshka_dimensions` lists, "any" size for `is_matryoshka: true`, or undefined: none.
   */
  readonly matryoshka: ReadonlyArray<number> | "any" | undefined
}

const Count = Schema.Int.pipe(Schema.positive())

const EmbeddingConfig = Schema.Struct({
  hidden_size: Count,
  vocab_size: Count,
  max_position_embeddings: Schema.optional(Count),
  is_matryoshka: Schema.optional(Schema.Boolean),
  matryoshka_dimensions: Schema.optional(Schema.Array(Count))
})

const Module = Schema.Struct({ path: Schema.String, type: Schema.String })
const Modules = Schema.Array(Module)

const PoolingConfig = Schema.Struct({
  pooling_mode_cls_token: Schema.optional(Schema.Boolean),
  pooling_mode_mean_tokens: Schema.optional(Schema.Boolean),
  pooling_mode_max_tokens: Schema.optional(Schema.Boolean),
  pooling_mode_mean_sqrt_len_tokens: Schema.optional(Schema.Boolean),
  pooling_mode_weightedmean_tokens: Schema.optional(Schema.Boolean),
  pooling_mode_lasttoken: Schema.optional(Schema.Boolean)
})

const SentenceBertConfig = Schema.Struct({ max_seq_length: Schema.optional(Count) })

/** Longer than any real context: tokenizers whose tokenizer_config.json sets no limit say 1e30. */
const noLimit = 10_000_000

const readJson = async (dir: string, file: string): Promise<unknown> => {
  let text: string
  try {
    text = await readFile(join(dir, file), "utf8")
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return undefined
    throw new InvalidModelDirectory({ path: dir, reason: `cannot read ${file}: ${(error as Error).message}` })
  }
  try {
    return JSON.parse(text) as unknown
  } catch (error) {
    throw new InvalidModelDirectory({ path: dir, reason: `${file} is not valid JSON: ${(error as Error).message}` })
  }
}

const decodeFile = <A, I>(schema: Schema.Schema<A, I>, value: unknown, path: string, file: string): A =>
  Either.getOrThrowWith(
    decodeConfig(schema, value),
    (reason) => new InvalidModelDirectory({ path, reason: `${file}: ${reason}` })
  )

const moduleType = (module: typeof Module.Type) => module.type.split(".").pop()

/** The pooling a Pooling module's config turns on; sentence-transformers' other modes are refused by name. */
const poolingOf = (config: typeof PoolingConfig.Type, path: string, file: string): Pooling => {
  const modes: ReadonlyArray<readonly [keyof typeof PoolingConfig.Type, Pooling | undefined]> = [
    ["pooling_mode_cls_token", "cls"],
    ["pooling_mode_mean_tokens", "mean"],
    ["pooling_mode_lasttoken", "last"],
    ["pooling_mode_max_tokens", undefined],
    ["pooling_mode_mean_sqrt_len_tokens", undefined],
    ["pooling_mode_weightedmean_tokens", undefined]
  ]
  const on = modes.filter(([field]) => config[field] === true)
  if (on.length !== 1 || on[0]![1] === undefined) {
    throw new InvalidModelDirectory({
      path,
      reason: `${file} turns on ${on.length === 0 ? "no pooling mode" : on.map(([field]) => field).join(" and ")}; supported: exactly one of pooling_mode_cls_token, pooling_mode_mean_tokens, pooling_mode_lasttoken`
    })
  }
  return on[0]![1]
}

const poolingFiles = async (
  model: ModelDirectory
): Promise<Pick<TextEmbeddingSpec, "pooling" | "normalize" | "poolingSource">> => {
  const modulesJson = await readJson(model.path, "modules.json")
  if (modulesJson === undefined) {
    return { pooling: undefined, normalize: undefined, poolingSource: "the model has no modules.json" }
  }
  const modules = decodeFile(Modules, modulesJson, model.path, "modules.json")
  const supported = new Set(["Transformer", "Pooling", "Normalize"])
  const other = modules.find((module) => !supported.has(moduleType(module) ?? ""))
  if (other !== undefined) {
    throw new InvalidModelDirectory({
      path: model.path,
      reason: `modules.json has a ${moduleType(other)} module (${other.path}); supported: Transformer, Pooling, Normalize`
    })
  }
  const normalize = modules.some((module) => moduleType(module) === "Normalize")
  const poolingModule = modules.find((module) => moduleType(module) === "Pooling")
  if (poolingModule === undefined) {
    return { pooling: undefined, normalize, poolingSource: "modules.json has no Pooling module" }
  }
  const file = `${poolingModule.path.replace(/\/+$/, "")}/config.json`
  const config = await readJson(model.path, file)
  if (config === undefined) {
    return { pooling: undefined, normalize, poolingSource: `modules.json names ${file}, which is missing` }
  }
  return {
    pooling: poolingOf(decodeFile(PoolingConfig, config, model.path, file), model.path, file),
    normalize,
    poolingSource: file
  }
}

/** What a text embedding model's files say; a directory that is not one is refused with the reason. */
export const textEmbeddingSpec = async (model: ModelDirectory): Promise<TextEmbeddingSpec> => {
  if (model.tokenizer === undefined) {
    throw new InvalidModelDirectory({ path: model.path, reason: "a text embedding model needs a tokenizer.json" })
  }
  const section = model.rawConfig.text_config ?? model.rawConfig
  const config = decodeFile(EmbeddingConfig, section, model.path, "config.json")
  const sentenceBert = await readJson(model.path, "sentence_bert_config.json")
  const seqLength =
    sentenceBert === undefined
      ? undefined
      : decodeFile(SentenceBertConfig, sentenceBert, model.path, "sentence_bert_config.json").max_seq_length
  const tokenizerLimit = model.tokenizer.rawConfig.model_max_length
  const limits = [
    typeof tokenizerLimit === "number" && tokenizerLimit > 0 && tokenizerLimit < noLimit ? tokenizerLimit : undefined,
    config.max_position_embeddings
  ].filter((limit): limit is number => limit !== undefined)
  const maxTokens = seqLength ?? (limits.length === 0 ? undefined : Math.min(...limits))
  if (maxTokens === undefined) {
    throw new InvalidModelDirectory({
      path: model.path,
      reason:
        "its longest input is not known: none of sentence_bert_config.json's max_seq_length, tokenizer_config.json's model_max_length, config.json's max_position_embeddings"
    })
  }
  const matryoshka =
    config.matryoshka_dimensions !== undefined
      ? config.matryoshka_dimensions
      : config.is_matryoshka === true
        ? ("any" as const)
        : undefined
  return {
    hiddenSize: config.hidden_size,
    vocabSize: config.vocab_size,
    maxTokens: Math.floor(maxTokens),
    matryoshka,
    ...(await poolingFiles(model))
  }
}

/** The dtypes onnx/model*.onnx is there in, the least lossy first. */
const textEmbeddingDtypes = (model: ModelDirectory): ReadonlyArray<Dtype> =>
  dtypePreference.filter((dtype) => model.onnx.has(modelStem(dtype)))

const modelStem = (dtype: Dtype) => onnxFileName("model", dtype).slice(0, -".onnx".length)

/** Whether the directory has an onnx/model*.onnx, the file a text embedding model runs. */
export const hasTextEmbeddingGraph = (model: ModelDirectory): boolean => textEmbeddingDtypes(model).length > 0

/**
 * The onnx/model*.onnx to run: at `requested`, else fp32 when there, else the dtype that loses the
 * least precision; a missing dtype is refused naming those there.
 */
export const textEmbeddingFile = (
  model: ModelDirectory,
  requested?: Dtype
): { readonly path: string; readonly dtype: Dtype } => {
  const available = textEmbeddingDtypes(model)
  const listing = [...model.onnx.keys()].map((stem) => `onnx/${stem}.onnx`).join(", ")
  if (available.length === 0) {
    throw new InvalidModelDirectory({
      path: model.path,
      reason: `a text embedding model needs onnx/model.onnx (or one of its dtypes: model_fp16.onnx, model_quantized.onnx, ...); it has ${listing}`
    })
  }
  if (requested !== undefined && !available.includes(requested)) {
    throw new InvalidModelDirectory({
      path: model.path,
      reason: `it has no ${requested} export (onnx/${onnxFileName("model", requested)}); the dtypes it has: ${available.join(", ")}`
    })
  }
  const dtype = requested ?? available[0]!
  return { path: model.onnx.get(modelStem(dtype))!, dtype }
}
