import { Graph, type Value } from "../onnx/Graph.js"
import { Random } from "../Random.js"
import { type LlamaConfig, llamaGraphs } from "./Llama.js"

/**
 * A talker: an LLM that reads another LLM's hidden states (the thinker's) and writes the frames
 * of a neural audio codec, all codebooks of a frame per step, as Qwen3-Omni's talker and Sesame
 * CSM do: the decoder predicts a frame's first code from its last hidden state, and a small depth
 * head predicts the frame's other codes from that hidden state and the first code. Four graphs:
 *
 * - `onnx/thinker_projection.onnx`: thinker_hidden_states [batch, rows, thinker hidden] →
 *   inputs_embeds [batch, rows, hidden] (a two-layer MLP with SiLU, Qwen3-Omni's
 *   `hidden_projection`); the talker's prompt.
 * - `onnx/decoder_model_merged.onnx`: a Llama decoder over inputs_embeds (the split layout's
 *   names: attention_mask, position_ids, past_key_values.N.key/value) → logits [batch, sequence,
 *   codebook size + 2] over the first codebook and its two specials (begin and end of speech),
 *   last_hidden_state, present.N.key/value.
 * - `onnx/code_predictor.onnx`: last_hidden_state [batch, hidden] and first_code [batch] → codes
 *   [batch, codebooks - 1]: the depth head, unrolled: x = h + E₀[first]; for each later codebook q,
 *   code_q = argmax(tanh(x)·W_q), x += E_q[code_q]. It chooses greedily.
 * - `onnx/codec_embed.onnx`: codes [batch, sequence, codebooks] → inputs_embeds [batch,
 *   sequence, hidden], the sum of each codebook's embedding of its code: a frame as the
 *   decoder's next input.
 */

export interface TalkerSize {
  readonly decoder: LlamaConfig
  readonly thinkerHiddenSize: number
  readonly codebooks: number
  readonly codebookSize: number
}

/** The rows of the first codebook's tables: its codes, then the begin and the end of speech. */
export const talkerVocabulary = (size: TalkerSize): number => size.codebookSize + 2
export const talkerBeginCode = (size: TalkerSize): number => size.codebookSize
export const talkerEndCode = (size: TalkerSize): number => size.codebookSize + 1

export interface TalkerExport {
  readonly seed: number
  readonly std: number
  /**
   * Added to the end-of-speech logit: very negative makes a random-weight talker speak until its
   * frame limit, which keeps its answers' lengths checkable.
   */
  readonly endBias: number
}

const thinkerProjectionGraph = (size: TalkerSize, random: Random): Graph => {
  const g = new Graph("thinker_projection")
  const hidden = size.decoder.hiddenSize
  const thinker = g.input("thinker_hidden_states", "float32", ["batch_size", "sequence_length", size.thinkerHiddenSize])
  const linear = (x: Value, name: string, inputs: number, outputs: number) =>
    g.op("Add", [
      g.op("MatMul", [
        x,
        g.weight(
          `${name}.weight`,
          "float32",
          [inputs, outputs],
          random.normals(inputs * outputs, 1 / Math.sqrt(inputs))
        )
      ]),
      g.weight(`${name}.bias`, "float32", [outputs], random.normals(outputs, 0.01))
    ])
  const up = linear(thinker, "hidden_projection.linear_fc1", size.thinkerHiddenSize, 2 * hidden)
  const silu = g.op("Mul", [up, g.op("Sigmoid", [up])])
  g.output(linear(silu, "hidden_projection.linear_fc2", 2 * hidden, hidden), "inputs_embeds", "float32", [
    "batch_size",
    "sequence_length",
    hidden
  ])
  return g
}

/** Each codebook's table, [codebooks · (codebook size + 2), hidden]: a frame's codes index them at q · rows + code. */
const codecTables = (size: TalkerSize, random: Random, std: number): Float32Array =>
  random.normals(size.codebooks * talkerVocabulary(size) * size.decoder.hiddenSize, std)

const codecEmbedGraph = (size: TalkerSize, tables: Float32Array): Graph => {
  const g = new Graph("codec_embed")
  const rows = talkerVocabulary(size)
  const codes = g.input("codes", "int64", ["batch_size", "sequence_length", size.codebooks])
  const table = g.weight("codec_embedding.weight", "float32", [size.codebooks * rows, size.decoder.hiddenSize], tables)
  const offsets = g.constant(
    "int64",
    [size.codebooks],
    BigInt64Array.from({ length: size.codebooks }, (_, q) => BigInt(q * rows))
  )
  const embedded = g.op("Gather", [table, g.op("Add", [codes, offsets])], { axis: 0 })
  g.output(g.op("ReduceSum", [embedded, g.int64s([2])], { keepdims: 0 }), "inputs_embeds", "float32", [
    "batch_size",
    "sequence_length",
    size.decoder.hiddenSize
  ])
  return g
}

const codePredictorGraph = (size: TalkerSize, tables: Float32Array, random: Random, std: number): Graph => {
  const g = new Graph("code_predictor")
  const hidden = size.decoder.hiddenSize
  const rows = talkerVocabulary(size)
  const state = g.input("last_hidden_state", "float32", ["batch_size", hidden])
  const first = g.input("first_code", "int64", ["batch_size"])
  const table = (q: number) =>
    g.weight(
      `embedding.${q}.weight`,
      "float32",
      [rows, hidden],
      tables.subarray(q * rows * hidden, (q + 1) * rows * hidden)
    )
  let x = g.op("Add", [state, g.op("Gather", [table(0), first], { axis: 0 })])
  const codes: Array<Value> = []
  for (let q = 1; q < size.codebooks; q++) {
    // Heads over the codes alone: a frame's later codes are never specials.
    const head = g.weight(
      `lm_head.${q}.weight`,
      "float32",
      [hidden, size.codebookSize],
      random.normals(hidden * size.codebookSize, std)
    )
    const code = g.op("ArgMax", [g.op("MatMul", [g.op("Tanh", [x]), head])], { axis: -1, keepdims: 0 })
    codes.push(g.op("Unsqueeze", [code, g.int64s([1])]))
    x = g.op("Add", [x, g.op("Gather", [table(q), code], { axis: 0 })])
  }
  g.output(g.op("Concat", codes, { axis: 1 }), "codes", "int64", ["batch_size", size.codebooks - 1])
  return g
}

/** The decoder, its end-of-speech logit moved by `endBias`. */
const decoderGraph = (size: TalkerSize, options: TalkerExport): Graph => {
  const logitBias = new Float32Array(talkerVocabulary(size))
  logitBias[talkerEndCode(size)] = options.endBias
  return llamaGraphs(
    size.decoder,
    {
      layout: "split",
      dtype: "fp32",
      positionIds: true,
      pastPrefix: "past_key_values",
      seed: options.seed,
      std: options.std,
      output: "both",
      logitBias
    },
    (name) => new Graph(name)
  ).get("decoder_model_merged")!
}

/** The talker's graphs by their onnx/ stem. */
export const talkerGraphs = (size: TalkerSize, options: TalkerExport): ReadonlyMap<string, Graph> => {
  if (size.codebooks < 2) throw new Error(`a talker writes frames of at least 2 codebooks, not ${size.codebooks}`)
  const random = new Random(options.seed + 1)
  const tables = codecTables(size, random, options.std * 4)
  return new Map([
    ["thinker_projection", thinkerProjectionGraph(size, random)],
    ["decoder_model_merged", decoderGraph(size, options)],
    ["code_predictor", codePredictorGraph(size, tables, random, 2 / Math.sqrt(size.decoder.hiddenSize))],
    ["codec_embed", codecEmbedGraph(size, tables)]
  ])
}
