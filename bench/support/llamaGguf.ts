/**
 * The weights of a community-layout Llama export (onnx/model.onnx in fp32, or
 * onnx/model_quantized.onnx in q8), written as a GGUF file that llama.cpp runs: the same model, so
 * that a bench compares engines and not weights.
 *
 * - fp32 → F32 tensors. q8 (one int8 scale per tensor) → Q8_0, each block's scale the tensor's:
 *   the same values up to the scale's fp16 rounding, and the same bytes per weight read.
 * - ONNX MatMul weights are [in, out]; GGUF's are out rows of in values, so they are transposed.
 * - HF's rotary embedding rotates a head's two halves; llama.cpp's rotates adjacent pairs. Like
 *   llama.cpp's own converter, the q and k projections' rows are permuted within each head
 *   (row s·d/2 + j goes to 2j + s), which gives the same attention.
 * - The tokenizer (byte-level BPE) goes into tokenizer.ggml.* metadata. The benches feed token ids,
 *   so llama.cpp's tokenizer only has to load.
 */
import { readFile } from "node:fs/promises"
import { join } from "node:path"
import onnxProto from "onnx-proto"
import type { LlamaConfig } from "../../src/models/architectures/Llama.js"
import { type GgufTensor, type GgufValue, writeGguf } from "./gguf.js"

type Initializers = ReadonlyMap<string, onnxProto.onnx.ITensorProto>

const floats = (tensor: onnxProto.onnx.ITensorProto): Float32Array => {
  const raw = tensor.rawData!
  return new Float32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength))
}
const int8s = (tensor: onnxProto.onnx.ITensorProto): Int8Array => {
  const raw = tensor.rawData!
  return new Int8Array(raw.buffer, raw.byteOffset, raw.byteLength)
}

/** [rows, cols] row-major → [cols, rows]. */
const transpose = <T extends Float32Array | Int8Array>(
  data: T,
  rows: number,
  cols: number,
  make: (n: number) => T
): T => {
  const out = make(data.length)
  for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++) out[c * rows + r] = data[r * cols + c]!
  return out
}

/** Rows of [heads·headDim, in] reordered within each head from halves to interleaved pairs. */
const permuteHeads = <T extends Float32Array | Int8Array>(
  data: T,
  heads: number,
  headDim: number,
  inputs: number,
  make: (n: number) => T
): T => {
  const out = make(data.length)
  const half = headDim / 2
  for (let h = 0; h < heads; h++)
    for (let s = 0; s < 2; s++)
      for (let j = 0; j < half; j++) {
        const from = (h * headDim + s * half + j) * inputs
        const to = (h * headDim + 2 * j + s) * inputs
        out.set(data.subarray(from, from + inputs), to)
      }
  return out
}

/** A linear layer's weight as GGUF wants it ([out][in]), at the export's precision. */
const linear = (
  initializers: Initializers,
  scope: string,
  name: string,
  inputs: number,
  outputs: number,
  permute?: { readonly heads: number; readonly headDim: number }
): GgufTensor => {
  const plain = initializers.get(`${scope}.weight`)
  if (plain !== undefined) {
    let data = transpose(floats(plain), inputs, outputs, (n) => new Float32Array(n))
    if (permute !== undefined)
      data = permuteHeads(data, permute.heads, permute.headDim, inputs, (n) => new Float32Array(n))
    return { name, dims: [inputs, outputs], type: "F32", data }
  }
  const codes = initializers.get(`${scope}.weight_quantized`)
  const scale = initializers.get(`${scope}.weight_scale`)
  const zero = initializers.get(`${scope}.weight_zero_point`)
  if (codes === undefined || scale === undefined || zero === undefined || codes.dataType !== 3)
    throw new Error(`${scope}: neither an fp32 weight nor int8 codes with a per-tensor scale`)
  if (int8s(zero)[0] !== 0) throw new Error(`${scope}: a non-zero weight zero point`)
  let data = transpose(int8s(codes), inputs, outputs, (n) => new Int8Array(n))
  if (permute !== undefined) data = permuteHeads(data, permute.heads, permute.headDim, inputs, (n) => new Int8Array(n))
  return {
    name,
    dims: [inputs, outputs],
    type: "Q8_0",
    codes: data,
    scales: new Float32Array(data.length / 32).fill(floats(scale)[0]!)
  }
}

const vector = (initializers: Initializers, scope: string, name: string): GgufTensor => {
  const tensor = initializers.get(scope)
  if (tensor === undefined) throw new Error(`no initializer ${scope}`)
  const data = floats(tensor)
  return { name, dims: [data.length], type: "F32", data }
}

/** Writes `modelDir`'s export at `dtype` as the GGUF file `path`. */
export const writeLlamaGguf = async (
  modelDir: string,
  config: LlamaConfig,
  dtype: "fp32" | "q8",
  path: string
): Promise<void> => {
  const file = join(modelDir, "onnx", dtype === "fp32" ? "model.onnx" : "model_quantized.onnx")
  const graph = onnxProto.onnx.ModelProto.decode(await readFile(file)).graph!
  const initializers: Initializers = new Map((graph.initializer ?? []).map((tensor) => [tensor.name!, tensor]))
  const { hiddenSize: hidden, heads, kvHeads, headDim, layers, intermediateSize: ff, vocabSize } = config
  const tensors: Array<GgufTensor> = [
    { ...vector(initializers, "model.embed_tokens.weight", "token_embd.weight"), dims: [hidden, vocabSize] },
    vector(initializers, "model.norm.weight", "output_norm.weight"),
    linear(initializers, "lm_head", "output.weight", hidden, vocabSize)
  ]
  for (let i = 0; i < layers; i++) {
    const scope = `model.layers.${i}`
    tensors.push(
      vector(initializers, `${scope}.input_layernorm.weight`, `blk.${i}.attn_norm.weight`),
      linear(initializers, `${scope}.self_attn.q_proj`, `blk.${i}.attn_q.weight`, hidden, heads * headDim, {
        heads,
        headDim
      }),
      linear(initializers, `${scope}.self_attn.k_proj`, `blk.${i}.attn_k.weight`, hidden, kvHeads * headDim, {
        heads: kvHeads,
        headDim
      }),
      linear(initializers, `${scope}.self_attn.v_proj`, `blk.${i}.attn_v.weight`, hidden, kvHeads * headDim),
      linear(initializers, `${scope}.self_attn.o_proj`, `blk.${i}.attn_output.weight`, heads * headDim, hidden),
      vector(initializers, `${scope}.post_attention_layernorm.weight`, `blk.${i}.ffn_norm.weight`),
      linear(initializers, `${scope}.mlp.gate_proj`, `blk.${i}.ffn_gate.weight`, hidden, ff),
      linear(initializers, `${scope}.mlp.up_proj`, `blk.${i}.ffn_up.weight`, hidden, ff),
      linear(initializers, `${scope}.mlp.down_proj`, `blk.${i}.ffn_down.weight`, ff, hidden)
    )
  }

  const tokenizer = JSON.parse(await readFile(join(modelDir, "tokenizer.json"), "utf8")) as {
    readonly model: {
      readonly vocab: Record<string, number>
      readonly merges: ReadonlyArray<string | [string, string]>
    }
    readonly added_tokens: ReadonlyArray<{ readonly id: number; readonly content: string; readonly special: boolean }>
  }
  const tokens = new Array<string>(vocabSize).fill("")
  for (const [token, id] of Object.entries(tokenizer.model.vocab)) if (id < vocabSize) tokens[id] = token
  const types = new Array<number>(vocabSize).fill(1)
  for (const added of tokenizer.added_tokens) {
    tokens[added.id] = added.content
    if (added.special) types[added.id] = 3
  }
  // Unused ids of a padded vocabulary get names of their own, as llama.cpp maps names to ids.
  tokens.forEach((token, id) => {
    if (token === "") {
      tokens[id] = `[PAD${id}]`
      types[id] = 5
    }
  })
  const modelConfig = JSON.parse(await readFile(join(modelDir, "config.json"), "utf8")) as {
    readonly eos_token_id: number | ReadonlyArray<number>
  }
  const eos = Array.isArray(modelConfig.eos_token_id) ? modelConfig.eos_token_id[0]! : modelConfig.eos_token_id
  const metadata: Array<readonly [string, GgufValue]> = [
    ["general.architecture", { type: "string", value: "llama" }],
    ["general.name", { type: "string", value: `cornserve bench ${dtype}` }],
    ["general.file_type", { type: "u32", value: dtype === "fp32" ? 0 : 7 }],
    ["llama.context_length", { type: "u32", value: config.maxPositions }],
    ["llama.embedding_length", { type: "u32", value: hidden }],
    ["llama.block_count", { type: "u32", value: layers }],
    ["llama.feed_forward_length", { type: "u32", value: ff }],
    ["llama.attention.head_count", { type: "u32", value: heads }],
    ["llama.attention.head_count_kv", { type: "u32", value: kvHeads }],
    ["llama.attention.key_length", { type: "u32", value: headDim }],
    ["llama.attention.value_length", { type: "u32", value: headDim }],
    ["llama.rope.dimension_count", { type: "u32", value: headDim }],
    ["llama.rope.freq_base", { type: "f32", value: config.ropeTheta }],
    ["llama.attention.layer_norm_rms_epsilon", { type: "f32", value: config.rmsNormEps }],
    ["llama.vocab_size", { type: "u32", value: vocabSize }],
    ["tokenizer.ggml.model", { type: "string", value: "gpt2" }],
    ["tokenizer.ggml.pre", { type: "string", value: "smollm" }],
    ["tokenizer.ggml.tokens", { type: "strings", value: tokens }],
    ["tokenizer.ggml.token_type", { type: "i32s", value: types }],
    [
      "tokenizer.ggml.merges",
      {
        type: "strings",
        value: tokenizer.model.merges.map((merge) => (typeof merge === "string" ? merge : merge.join(" ")))
      }
    ],
    ["tokenizer.ggml.eos_token_id", { type: "u32", value: eos }],
    ["tokenizer.ggml.bos_token_id", { type: "u32", value: eos }],
    ["tokenizer.ggml.add_bos_token", { type: "bool", value: false }]
  ]
  await writeGguf(path, metadata, tensors)
}
