import { llamaConfigJson, llamaGraphs } from "../architectures/Llama.js"
import { type ByteLevelBpe, byteLevelBpe } from "../ByteLevelBpe.js"
import { Graph, type Value } from "../onnx/Graph.js"
import { gelu } from "../onnx/Layers.js"
import { Random } from "../Random.js"
import { whisperPreprocessorConfig } from "./RandomWhisper.js"
import { jsonFile, type ModelFiles } from "./Recipe.js"

/**
 * A random-weight Ultravox in the layout transformers.js's UltravoxModel loads
 * (onnx-community/ultravox-v0_5-llama-3_2-1b-ONNX): onnx/audio_encoder.onnx, onnx/embed_tokens.onnx
 * and onnx/decoder_model_merged.onnx (a Llama), with config.json (model_type ultravox, a llama
 * text_config, audio_token_id), preprocessor_config.json (Whisper's feature extractor),
 * processor_config.json (audio_placeholder, encoder_ds_factor, stack_factor), a byte-level BPE
 * tokenizer and a Llama-3-style chat template.
 *
 * The audio encoder takes audio_values [1, mel bins, frames] (Whisper features, not padded to 30 s)
 * and gives audio_features [1, 1 + ⌈⌈frames / 2⌉ / stack⌉, hidden]: as Ultravox's does, one row
 * more than the Whisper encoder's frames (halved by its stride-2 convolution) stacked `stack` at a
 * time, which is the count UltravoxProcessor repeats <|audio|> for. Inside, a stand-in for
 * Whisper and the projector, with the same shapes: a per-frame projection of the mel bins, frames
 * paired (the stride-2 convolution), stacked, projected to the LLM's width, after a learned first
 * row.
 */

export const ultravoxAudioPlaceholder = "<|audio|>"

export const ultravoxSpecialTokens = [
  "<|begin_of_text|>",
  "<|end_of_text|>",
  "<|start_header_id|>",
  "<|end_header_id|>",
  "<|eot_id|>",
  ultravoxAudioPlaceholder
] as const

/** A Llama-3 chat template, content as text (Ultravox's prompts spell <|audio|> in the text). */
export const ultravoxChatTemplate =
  "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"

export const ultravoxVocabulary = (): ByteLevelBpe =>
  byteLevelBpe({
    words: ["system", "user", "assistant", "What", " is", " said", " in", " this", " clip", " Listen", " Hello"],
    specialTokens: [...ultravoxSpecialTokens]
  })

export interface RandomUltravoxOptions {
  readonly seed?: number
  readonly melBins?: number
  readonly audioHidden?: number
  readonly textHidden?: number
  readonly stackFactor?: number
}

export interface RandomUltravox {
  readonly files: ModelFiles
  readonly tokenId: (text: string) => number
  readonly stackFactor: number
}

/** The audio encoder described above: audio_values → audio_features. */
const audioEncoderGraph = (
  random: Random,
  melBins: number,
  audioHidden: number,
  textHidden: number,
  stack: number
): Graph => {
  const g = new Graph("audio_encoder")
  const std = (inputs: number) => 1 / Math.sqrt(inputs)
  const weight = (name: string, rows: number, cols: number) =>
    g.weight(name, "float32", [rows, cols], random.normals(rows * cols, std(rows)))
  const bias = (name: string, width: number) => g.weight(name, "float32", [width], random.normals(width, 0.1))
  const int64s = (values: ReadonlyArray<number>) =>
    g.constant("int64", [values.length], BigInt64Array.from(values, BigInt))
  /** Rows of x [rows, width] padded with zeros to a multiple of `multiple`. */
  const padRows = (x: Value, multiple: number): Value => {
    const rows = g.op("Gather", [g.op("Shape", [x]), g.constant("int64", [], BigInt64Array.of(0n))])
    const m = g.constant("int64", [], BigInt64Array.of(BigInt(multiple)))
    const missing = g.op("Mod", [g.op("Sub", [m, g.op("Mod", [rows, m])]), m])
    const pads = g.op("Concat", [int64s([0, 0]), g.op("Unsqueeze", [missing, int64s([0])]), int64s([0])], { axis: 0 })
    return g.op("Pad", [x, pads])
  }
  const input = g.input("audio_values", "float32", ["batch_size", melBins, "num_frames"])
  const frames = g.op("Squeeze", [g.op("Transpose", [input], { perm: [0, 2, 1] }), int64s([0])])
  const perFrame = gelu(
    g,
    g.op("Add", [
      g.op("MatMul", [frames, weight("frame.weight", melBins, audioHidden)]),
      bias("frame.bias", audioHidden)
    ])
  )
  const paired = g.op("Reshape", [padRows(perFrame, 2), int64s([-1, 2 * audioHidden])])
  const strided = gelu(
    g,
    g.op("Add", [
      g.op("MatMul", [paired, weight("stride.weight", 2 * audioHidden, audioHidden)]),
      bias("stride.bias", audioHidden)
    ])
  )
  const stacked = g.op("Reshape", [padRows(strided, stack), int64s([-1, stack * audioHidden])])
  const projected = g.op("MatMul", [stacked, weight("projector.weight", stack * audioHidden, textHidden)])
  const first = g.weight("projector.first_row", "float32", [1, textHidden], random.normals(textHidden, 1))
  const rows = g.op("Concat", [first, projected], { axis: 0 })
  g.output(g.op("Unsqueeze", [rows, int64s([0])]), "audio_features", "float32", [
    "batch_size",
    "audio_tokens",
    textHidden
  ])
  return g
}

export const randomUltravoxFiles = (options: RandomUltravoxOptions = {}): RandomUltravox => {
  const seed = options.seed ?? 1
  const melBins = options.melBins ?? 80
  const audioHidden = options.audioHidden ?? 16
  const textHidden = options.textHidden ?? 32
  const stack = options.stackFactor ?? 8
  const vocabulary = ultravoxVocabulary()
  const id = vocabulary.tokenId
  const text = {
    hiddenSize: textHidden,
    intermediateSize: textHidden * 2,
    layers: 2,
    heads: 4,
    kvHeads: 2,
    headDim: textHidden / 4,
    vocabSize: vocabulary.vocabSize,
    maxPositions: 2048,
    ropeTheta: 500000,
    rmsNormEps: 1e-5
  }
  const language = llamaGraphs(
    text,
    { layout: "split", dtype: "fp32", positionIds: true, pastPrefix: "past_key_values", seed: seed + 1, std: 0.5 },
    (name) => new Graph(name)
  )
  const eos = id("<|eot_id|>")
  const files = new Map<string, Uint8Array>([
    [
      "config.json",
      jsonFile({
        architectures: ["UltravoxModel"],
        model_type: "ultravox",
        audio_token_id: id(ultravoxAudioPlaceholder),
        stack_factor: stack,
        hidden_size: textHidden,
        vocab_size: vocabulary.vocabSize,
        eos_token_id: eos,
        bos_token_id: id("<|begin_of_text|>"),
        pad_token_id: id("<|end_of_text|>"),
        text_config: llamaConfigJson(text, { eos_token_id: eos, bos_token_id: id("<|begin_of_text|>") }),
        audio_config: { model_type: "whisper", num_mel_bins: melBins, d_model: audioHidden }
      })
    ],
    [
      "generation_config.json",
      jsonFile({ bos_token_id: id("<|begin_of_text|>"), eos_token_id: [eos, id("<|end_of_text|>")], do_sample: false })
    ],
    ["preprocessor_config.json", jsonFile(whisperPreprocessorConfig("UltravoxProcessor", melBins))],
    [
      "processor_config.json",
      jsonFile({
        processor_class: "UltravoxProcessor",
        audio_placeholder: ultravoxAudioPlaceholder,
        encoder_ds_factor: 320,
        stack_factor: stack
      })
    ],
    ["tokenizer.json", jsonFile(vocabulary.tokenizerJson)],
    [
      "tokenizer_config.json",
      jsonFile({
        tokenizer_class: "PreTrainedTokenizerFast",
        bos_token: "<|begin_of_text|>",
        eos_token: "<|eot_id|>",
        pad_token: "<|end_of_text|>",
        model_max_length: text.maxPositions,
        clean_up_tokenization_spaces: false,
        chat_template: ultravoxChatTemplate
      })
    ],
    ["onnx/audio_encoder.onnx", audioEncoderGraph(new Random(seed), melBins, audioHidden, textHidden, stack).toBytes()]
  ])
  for (const [stem, graph] of language) files.set(`onnx/${stem}.onnx`, graph.toBytes())
  return { files, tokenId: id, stackFactor: stack }
}
