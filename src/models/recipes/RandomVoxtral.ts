import { llamaConfigJson, llamaGraphs } from "../architectures/Llama.js"
import { type WhisperSize, whisperEncoderStates, whisperInputFrames } from "../architectures/Whisper.js"
import { type ByteLevelBpe, byteLevelBpe } from "../ByteLevelBpe.js"
import { Graph } from "../onnx/Graph.js"
import { gelu, linear } from "../onnx/Layers.js"
import { Random } from "../Random.js"
import { matrix } from "../Weights.js"
import { randomBlocks, unitLayerNorm, WeightDraw } from "./RandomWeights.js"
import { whisperPreprocessorConfig } from "./RandomWhisper.js"
import { jsonFile, type ModelFiles } from "./Recipe.js"

/**
 * A random-weight Voxtral in the layout transformers.js's VoxtralForConditionalGeneration loads
 * (onnx-community/Voxtral-Mini-3B-2507-ONNX): onnx/audio_encoder.onnx, onnx/embed_tokens.onnx and
 * onnx/decoder_model_merged.onnx (a Llama), with config.json (model_type voxtral, a voxtral_encoder
 * audio_config, a llama text_config, audio_token_id, projector_hidden_act),
 * preprocessor_config.json (Whisper's feature extractor: 128 mel bins, 30 s, 3000 frames), a
 * byte-level BPE tokenizer holding Voxtral's control tokens, and a chat template.
 *
 * The audio encoder is Voxtral's at a tiny width but with its real lengths: audio_values
 * [chunks, mel bins, 3000] (each 30 s chunk's features) through Whisper's encoder (two
 * convolutions, the second of stride 2, 1500 positions, pre-norm blocks, a final norm), whose
 * [chunks, 1500, d] states are read 4 frames a row as [chunks · 375, 4·d] and projected
 * (linear, GELU, linear, no biases) to the decoder's width: audio_features [chunks · 375, hidden],
 * as Voxtral's get_audio_features answers them, the rows VoxtralProcessor writes 375 [AUDIO]
 * tokens a chunk for.
 *
 * The chat template is a plain one in Mistral's shape (not Voxtral's own, which also writes a
 * dated system prompt): `<s>`, then `[INST]…[/INST]` for each user turn, where an audio part is
 * `[AUDIO]` and a text part its text, an answer followed by `</s>`, and a system message as
 * `[SYSTEM_PROMPT]…[/SYSTEM_PROMPT]`. transformers.js's apply_chat_template renders
 * `[{ role: "user", content: [{ type: "audio" }, { type: "text", text }] }]` as
 * `<s>[INST][AUDIO]text[/INST]`, which VoxtralProcessor then expands.
 */

export const voxtralAudioToken = "[AUDIO]"
export const voxtralBeginAudioToken = "[BEGIN_AUDIO]"

export const voxtralSpecialTokens = [
  "<unk>",
  "<s>",
  "</s>",
  "[INST]",
  "[/INST]",
  voxtralAudioToken,
  voxtralBeginAudioToken,
  "[SYSTEM_PROMPT]",
  "[/SYSTEM_PROMPT]"
] as const

export const voxtralChatTemplate =
  "{{ bos_token }}{% for message in messages %}" +
  "{% if message['role'] == 'system' %}[SYSTEM_PROMPT]{{ message['content'] }}[/SYSTEM_PROMPT]" +
  "{% elif message['role'] == 'user' %}[INST]" +
  "{% if message['content'] is string %}{{ message['content'] }}" +
  "{% else %}{% for block in message['content'] %}" +
  "{% if block['type'] == 'audio' %}[AUDIO]{% elif block['type'] == 'text' %}{{ block['text'] }}{% endif %}" +
  "{% endfor %}{% endif %}[/INST]" +
  "{% elif message['role'] == 'assistant' %}{{ message['content'] }}{{ eos_token }}{% endif %}" +
  "{% endfor %}"

export const voxtralVocabulary = (): ByteLevelBpe =>
  byteLevelBpe({
    words: ["What", " is", " said", " in", " this", " clip", " Listen", " Hello", " Describe", " the", " sound"],
    specialTokens: [...voxtralSpecialTokens]
  })

/** The rows Voxtral's projector reads a row from: its encoder's frames, 4 at a time. */
const framesPerRow = 4

export interface RandomVoxtralOptions {
  readonly seed?: number
  readonly audioHidden?: number
  readonly textHidden?: number
}

export interface RandomVoxtral {
  readonly files: ModelFiles
  readonly tokenId: (text: string) => number
}

/** The audio encoder described above: audio_values → audio_features. */
const audioEncoderGraph = (random: Random, size: WhisperSize, textHidden: number): Graph => {
  const g = new Graph("audio_encoder")
  const draw = new WeightDraw(random)
  const conv = (inputs: number) => ({
    kernel: random.normals(size.dModel * inputs * 3, 1 / Math.sqrt(inputs * 3)),
    bias: random.normals(size.dModel, 0.05)
  })
  const epsilon = 1e-5
  const encoder = {
    conv1: conv(size.melBins),
    conv2: conv(size.dModel),
    encoderPositions: matrix(
      size.sourcePositions,
      size.dModel,
      random.normals(size.sourcePositions * size.dModel, 0.1)
    ),
    encoderLayers: randomBlocks(
      random,
      { hidden: size.dModel, layers: size.encoderLayers, heads: size.heads, intermediate: size.ffn },
      epsilon
    ),
    encoderNorm: unitLayerNorm(size.dModel, epsilon)
  }
  const features = g.input("audio_values", "float32", ["batch_size", size.melBins, whisperInputFrames(size)])
  const states = g.scope("audio_tower", () => whisperEncoderStates(g, features, size, encoder))
  const rows = g.op("Reshape", [states, g.int64s([-1, framesPerRow * size.dModel])])
  const projected = g.scope("multi_modal_projector", () => {
    const hidden = gelu(g, linear(g, rows, draw.linear(framesPerRow * size.dModel, textHidden, false), "linear_1"))
    return linear(g, hidden, draw.linear(textHidden, textHidden, false), "linear_2")
  })
  g.output(projected, "audio_features", "float32", ["num_audio_tokens", textHidden])
  return g
}

export const randomVoxtralFiles = (options: RandomVoxtralOptions = {}): RandomVoxtral => {
  const seed = options.seed ?? 1
  const audioHidden = options.audioHidden ?? 16
  const textHidden = options.textHidden ?? 32
  const vocabulary = voxtralVocabulary()
  const id = vocabulary.tokenId
  const audio: WhisperSize = {
    melBins: 128,
    dModel: audioHidden,
    heads: 2,
    encoderLayers: 1,
    decoderLayers: 0,
    ffn: audioHidden * 2,
    vocabSize: vocabulary.vocabSize,
    sourcePositions: 1500,
    targetPositions: 0
  }
  const text = {
    hiddenSize: textHidden,
    intermediateSize: textHidden * 2,
    layers: 2,
    heads: 4,
    kvHeads: 2,
    headDim: textHidden / 4,
    vocabSize: vocabulary.vocabSize,
    maxPositions: 4096,
    ropeTheta: 100000000,
    rmsNormEps: 1e-5
  }
  const language = llamaGraphs(
    text,
    { layout: "split", dtype: "fp32", positionIds: true, pastPrefix: "past_key_values", seed: seed + 1, std: 0.5 },
    (name) => new Graph(name)
  )
  const bos = id("<s>")
  const eos = id("</s>")
  const files = new Map<string, Uint8Array>([
    [
      "config.json",
      jsonFile({
        architectures: ["VoxtralForConditionalGeneration"],
        model_type: "voxtral",
        audio_token_id: id(voxtralAudioToken),
        projector_hidden_act: "gelu",
        hidden_size: textHidden,
        vocab_size: vocabulary.vocabSize,
        audio_config: {
          model_type: "voxtral_encoder",
          num_mel_bins: audio.melBins,
          hidden_size: audio.dModel,
          intermediate_size: framesPerRow * audio.dModel,
          num_hidden_layers: audio.encoderLayers,
          num_attention_heads: audio.heads,
          max_source_positions: audio.sourcePositions,
          activation_function: "gelu",
          vocab_size: 51866
        },
        text_config: llamaConfigJson(text, { bos_token_id: bos, eos_token_id: eos })
      })
    ],
    ["generation_config.json", jsonFile({ bos_token_id: bos, eos_token_id: eos, do_sample: false })],
    ["preprocessor_config.json", jsonFile(whisperPreprocessorConfig("VoxtralProcessor", audio.melBins))],
    ["tokenizer.json", jsonFile(vocabulary.tokenizerJson)],
    [
      "tokenizer_config.json",
      jsonFile({
        tokenizer_class: "PreTrainedTokenizerFast",
        bos_token: "<s>",
        eos_token: "</s>",
        unk_token: "<unk>",
        model_max_length: text.maxPositions,
        clean_up_tokenization_spaces: false,
        chat_template: voxtralChatTemplate
      })
    ],
    ["onnx/audio_encoder.onnx", audioEncoderGraph(new Random(seed), audio, textHidden).toBytes()]
  ])
  for (const [stem, graph] of language) files.set(`onnx/${stem}.onnx`, graph.toBytes())
  return { files, tokenId: id }
}
