/**
 * The weights of a community-layout Llama export (onnx/model.onnx in fp32, model_fp16.onnx,
 * model_quantized.onnx in q8 or model_q4.onnx), written as a GGUF file that llama.cpp runs: the
 * same model, so that a bench compares engines and not weights.
 *
 * - fp32 → F32 tensors, fp16 → F16 (the same half bits; norms as F32, exact). q8 (one int8 scale
 *   per tensor) → Q8_0, each block's scale the tensor's. q4 (MatMulNBits: blocks of 32 along the
 *   input axis, one float32 scale each, the default zero point 8) → Q4_0, the same codes per block.
 * - Where the numbers differ: Q8_0 and Q4_0 store each block's scale as fp16, so llama.cpp's weights
 *   are the export's up to that rounding of the scale (relative error ≤ 2⁻¹¹). Beyond the weights,
 *   llama.cpp's CPU kernels quantize activations (to Q8_0 blocks for Q8_0 and Q4_0 weights, to fp16
 *   for F16 ones), where ONNX Runtime computes those products in float32 (or, for q8, quantizes
 *   activations per tensor to uint8): near-ties in the logits can part the greedy tokens.
 * - ONNX MatMul weights are [in, out]; GGUF's are out rows of in values, so they are transposed.
 *   MatMulNBits weights are already rows of outputs.
 * - HF's rotary embedding rotates a head's two halves; llama.cpp's rotates adjacent pairs. Like
 *   llama.cpp's own converter, the q and k projections' rows are permuted within each head
 *   (row s·d/2 + j goes to 2j + s), which gives the same attention.
 * - The tokenizer (byte-level BPE) goes into tokenizer.ggml.* metadata. The benches feed token ids,
 *   so llama.cpp's tokenizer only has to load.
 *
 * Large exports keep their weights in external data (`<file>_data`, read per tensor at its offset
 * when that tensor is written); the model file itself is read once and its inline initializers are
 * views of it. With GGUF's streamed writer, memory holds the model file, one tensor's input and
 * its converted bytes, never the whole model.
 */
import { type FileHandle, open, readFile } from "node:fs/promises"
import { join } from "node:path"
import onnxProto from "onnx-proto"
import type { LlamaConfig } from "../../src/models/architectures/Llama.js"
import { floatsOf, toHalf } from "../../src/models/Float16.js"
import { bytesOf, type GgufTensor, type GgufValue, q8_0Blocks, writeGguf } from "./gguf.js"

export type LlamaGgufDtype = "fp32" | "fp16" | "q8" | "q4"

const files: Readonly<Record<LlamaGgufDtype, string>> = {
  fp32: "model.onnx",
  fp16: "model_fp16.onnx",
  q8: "model_quantized.onnx",
  q4: "model_q4.onnx"
}
/** llama_ftype: ALL_F32, MOSTLY_F16, MOSTLY_Q8_0, MOSTLY_Q4_0. */
const fileTypes: Readonly<Record<LlamaGgufDtype, number>> = { fp32: 0, fp16: 1, q8: 7, q4: 2 }

const dataTypes = { float: 1, uint8: 2, int8: 3, float16: 10 } as const

/** Reads `into.byteLength` bytes of `file` from `position`, in calls of at most 1 GiB. */
const readInto = async (file: FileHandle, into: Uint8Array, position: number): Promise<void> => {
  for (let at = 0; at < into.byteLength; ) {
    const { bytesRead } = await file.read(into, at, Math.min(into.byteLength - at, 1 << 30), position + at)
    if (bytesRead === 0) throw new Error(`a short read at ${position + at}`)
    at += bytesRead
  }
}

/** A whole file in one buffer (readFile stops at 2 GiB). */
const readWhole = async (path: string): Promise<Uint8Array> => {
  const file = await open(path, "r")
  try {
    const bytes = new Uint8Array((await file.stat()).size)
    await readInto(file, bytes, 0)
    return bytes
  } finally {
    await file.close()
  }
}

type Typed = Float32Array | Uint16Array | Int8Array
type TypedConstructor<T extends Typed> = {
  new (length: number): T
  new (buffer: ArrayBufferLike, byteOffset: number, length: number): T
  readonly BYTES_PER_ELEMENT: number
}

/** `bytes` as elements of `make`, a view when aligned, else a copy. */
const viewAs = <T extends Typed>(bytes: Uint8Array, make: TypedConstructor<T>): T => {
  if (bytes.byteOffset % make.BYTES_PER_ELEMENT === 0)
    return new make(bytes.buffer, bytes.byteOffset, bytes.byteLength / make.BYTES_PER_ELEMENT)
  const copy = new Uint8Array(bytes.byteLength)
  copy.set(bytes)
  return new make(copy.buffer, 0, copy.byteLength / make.BYTES_PER_ELEMENT)
}

/** An export's initializers by name, their bytes read only when asked for. */
class Initializers {
  private readonly byName: ReadonlyMap<string, onnxProto.onnx.ITensorProto>
  /** MatMulNBits nodes by their weight input. */
  readonly nBits: ReadonlyMap<string, onnxProto.onnx.INodeProto>

  constructor(
    private readonly dir: string,
    graph: onnxProto.onnx.IGraphProto
  ) {
    this.byName = new Map((graph.initializer ?? []).map((tensor) => [tensor.name!, tensor]))
    this.nBits = new Map(
      (graph.node ?? []).filter((node) => node.opType === "MatMulNBits").map((node) => [node.input![1]!, node])
    )
  }

  find(name: string): onnxProto.onnx.ITensorProto | undefined {
    return this.byName.get(name)
  }

  /** Initializer `name`, checked to be of `dataType` and shape `dims`. */
  get(name: string, dataType: number, dims?: ReadonlyArray<number>): onnxProto.onnx.ITensorProto {
    const tensor = this.byName.get(name)
    if (tensor === undefined) throw new Error(`no initializer ${name}`)
    if (tensor.dataType !== dataType) throw new Error(`${name}: data type ${tensor.dataType}, not ${dataType}`)
    const shape = (tensor.dims ?? []).map(Number)
    if (dims !== undefined && shape.join(",") !== dims.join(","))
      throw new Error(`${name}: dims [${shape}], not [${dims}]`)
    return tensor
  }

  /** The raw little-endian bytes of `tensor`: a view of the model file's, or read from its external data. */
  async bytes(tensor: onnxProto.onnx.ITensorProto): Promise<Uint8Array> {
    if (tensor.dataLocation !== onnxProto.onnx.TensorProto.DataLocation.EXTERNAL) {
      if (tensor.rawData === null || tensor.rawData === undefined) throw new Error(`${tensor.name}: no raw data`)
      return tensor.rawData
    }
    const entries = new Map((tensor.externalData ?? []).map((entry) => [entry.key!, entry.value!]))
    const location = entries.get("location")
    const length = entries.get("length")
    if (location === undefined || length === undefined)
      throw new Error(`${tensor.name}: external data without a location and length`)
    const file = await open(join(this.dir, location), "r")
    try {
      const bytes = new Uint8Array(Number(length))
      await readInto(file, bytes, Number(entries.get("offset") ?? 0))
      return bytes
    } finally {
      await file.close()
    }
  }
}

/** For each output row of a linear layer, the row it becomes in GGUF (q and k: reordered within each head). */
const targetRows = (outputs: number, permute?: { readonly heads: number; readonly headDim: number }): Int32Array => {
  const rows = Int32Array.from({ length: outputs }, (_, row) => row)
  if (permute === undefined) return rows
  const { heads, headDim } = permute
  if (heads * headDim !== outputs) throw new Error(`${heads} heads of ${headDim} are not ${outputs} rows`)
  const half = headDim / 2
  for (let h = 0; h < heads; h++)
    for (let s = 0; s < 2; s++)
      for (let j = 0; j < half; j++) rows[h * headDim + s * half + j] = h * headDim + 2 * j + s
  return rows
}

/** [inputs, outputs] row-major → [outputs][inputs], output row c written at row `target[c]`. In tiles, for the cache. */
const transposed = <T extends Typed>(
  data: T,
  inputs: number,
  outputs: number,
  target: Int32Array,
  make: TypedConstructor<T>
): T => {
  const out = new make(data.length)
  const tile = 64
  for (let r0 = 0; r0 < inputs; r0 += tile) {
    const r1 = Math.min(r0 + tile, inputs)
    for (let c0 = 0; c0 < outputs; c0 += tile) {
      const c1 = Math.min(c0 + tile, outputs)
      for (let c = c0; c < c1; c++) {
        const to = target[c]! * inputs
        for (let r = r0; r < r1; r++) out[to + r] = data[r * outputs + c]!
      }
    }
  }
  return out
}

/**
 * MatMulNBits 4-bit rows (row n: `blocks` blocks of 16 bytes, byte j holding element 2j in its low
 * nibble and 2j + 1 in its high one; value (code − 8) · scale) as Q4_0 blocks (byte j: element j low,
 * j + 16 high; value (q − 8) · d, d the scale rounded to fp16), row n written at row `target[n]`.
 */
const q4_0Rows = (packed: Uint8Array, scales: Float32Array, blocks: number, target: Int32Array): Uint8Array => {
  const rows = target.length
  const out = new Uint8Array(rows * blocks * 18)
  for (let n = 0; n < rows; n++)
    for (let b = 0; b < blocks; b++) {
      const from = (n * blocks + b) * 16
      const at = (target[n]! * blocks + b) * 18
      const half = toHalf(scales[n * blocks + b]!)
      out[at] = half & 0xff
      out[at + 1] = half >>> 8
      for (let j = 0; j < 16; j++) {
        // Elements j and j + 16 share a parity, so the same nibble of source bytes j/2 and 8 + j/2.
        const shift = (j & 1) * 4
        const low = (packed[from + (j >> 1)]! >> shift) & 0x0f
        const high = (packed[from + 8 + (j >> 1)]! >> shift) & 0x0f
        out[at + 2 + j] = low | (high << 4)
      }
    }
  return out
}

const intAttribute = (node: onnxProto.onnx.INodeProto, name: string): number | undefined => {
  const attribute = (node.attribute ?? []).find((a) => a.name === name)
  return attribute?.i === undefined || attribute.i === null ? undefined : Number(attribute.i)
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
  const dims = [inputs, outputs]
  const plain = initializers.find(`${scope}.weight`)
  if (plain !== undefined) {
    if (plain.dataType === dataTypes.float) {
      const tensor = initializers.get(`${scope}.weight`, dataTypes.float, [inputs, outputs])
      return {
        name,
        dims,
        type: "F32",
        data: async () =>
          bytesOf(
            transposed(
              viewAs(await initializers.bytes(tensor), Float32Array),
              inputs,
              outputs,
              targetRows(outputs, permute),
              Float32Array
            )
          )
      }
    }
    const tensor = initializers.get(`${scope}.weight`, dataTypes.float16, [inputs, outputs])
    return {
      name,
      dims,
      type: "F16",
      data: async () =>
        bytesOf(
          transposed(
            viewAs(await initializers.bytes(tensor), Uint16Array),
            inputs,
            outputs,
            targetRows(outputs, permute),
            Uint16Array
          )
        )
    }
  }

  const packed = initializers.find(`${scope}.weight_q4`)
  if (packed !== undefined) {
    const node = initializers.nBits.get(`${scope}.weight_q4`)
    const blocks = inputs / 32
    if (
      node === undefined ||
      intAttribute(node, "bits") !== 4 ||
      intAttribute(node, "block_size") !== 32 ||
      intAttribute(node, "K") !== inputs ||
      intAttribute(node, "N") !== outputs ||
      (node.input ?? []).slice(3).some((input) => input !== "") ||
      node.input?.[2] !== `${scope}.weight_scales` ||
      !Number.isInteger(blocks)
    )
      throw new Error(`${scope}: not a 4-bit MatMulNBits in blocks of 32 without zero points or groups`)
    const weight = initializers.get(`${scope}.weight_q4`, dataTypes.uint8, [outputs, blocks, 16])
    const scales = initializers.get(`${scope}.weight_scales`, dataTypes.float, [outputs * blocks])
    return {
      name,
      dims,
      type: "Q4_0",
      data: async () =>
        q4_0Rows(
          await initializers.bytes(weight),
          viewAs(await initializers.bytes(scales), Float32Array),
          blocks,
          targetRows(outputs, permute)
        )
    }
  }

  const codes = initializers.get(`${scope}.weight_quantized`, dataTypes.int8, [inputs, outputs])
  const scale = initializers.get(`${scope}.weight_scale`, dataTypes.float, [])
  const zero = initializers.get(`${scope}.weight_zero_point`, dataTypes.int8, [])
  return {
    name,
    dims,
    type: "Q8_0",
    data: async () => {
      if ((await initializers.bytes(zero))[0] !== 0) throw new Error(`${scope}: a non-zero weight zero point`)
      const rows = transposed(
        viewAs(await initializers.bytes(codes), Int8Array),
        inputs,
        outputs,
        targetRows(outputs, permute),
        Int8Array
      )
      return q8_0Blocks(rows, toHalf(viewAs(await initializers.bytes(scale), Float32Array)[0]!))
    }
  }
}

/** A norm's weight as F32 (exact from fp16). */
const vector = (initializers: Initializers, scope: string, name: string, length: number): GgufTensor => {
  const half = initializers.find(scope)?.dataType === dataTypes.float16
  const tensor = initializers.get(scope, half ? dataTypes.float16 : dataTypes.float, [length])
  return {
    name,
    dims: [length],
    type: "F32",
    data: async () => {
      const bytes = await initializers.bytes(tensor)
      return half ? bytesOf(floatsOf(viewAs(bytes, Uint16Array))) : bytes
    }
  }
}

/** Writes `modelDir`'s export at `dtype` as the GGUF file `path`. */
export const writeLlamaGguf = async (
  modelDir: string,
  config: LlamaConfig,
  dtype: LlamaGgufDtype,
  path: string
): Promise<void> => {
  const onnxDir = join(modelDir, "onnx")
  const graph = onnxProto.onnx.ModelProto.decode(await readWhole(join(onnxDir, files[dtype]))).graph!
  const initializers = new Initializers(onnxDir, graph)
  const { hiddenSize: hidden, heads, kvHeads, headDim, layers, intermediateSize: ff, vocabSize } = config

  // The token embedding's rows are already GGUF's (hidden values per token): its bytes as they are.
  const embedHalf = initializers.find("model.embed_tokens.weight")?.dataType === dataTypes.float16
  const embed = initializers.get("model.embed_tokens.weight", embedHalf ? dataTypes.float16 : dataTypes.float, [
    vocabSize,
    hidden
  ])
  const tensors: Array<GgufTensor> = [
    {
      name: "token_embd.weight",
      dims: [hidden, vocabSize],
      type: embedHalf ? "F16" : "F32",
      data: () => initializers.bytes(embed)
    },
    vector(initializers, "model.norm.weight", "output_norm.weight", hidden),
    linear(initializers, "lm_head", "output.weight", hidden, vocabSize)
  ]
  for (let i = 0; i < layers; i++) {
    const scope = `model.layers.${i}`
    tensors.push(
      vector(initializers, `${scope}.input_layernorm.weight`, `blk.${i}.attn_norm.weight`, hidden),
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
      vector(initializers, `${scope}.post_attention_layernorm.weight`, `blk.${i}.ffn_norm.weight`, hidden),
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
    ["general.file_type", { type: "u32", value: fileTypes[dtype] }],
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
    // The pre-tokenizer llama.cpp names for this vocabulary: Llama 3's (the 1B geometry's) or SmolLM's.
    [
      "tokenizer.ggml.pre",
      {
        type: "string",
        value: tokenizer.added_tokens.some((added) => added.content === "<|begin_of_text|>") ? "llama-bpe" : "smollm"
      }
    ],
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
