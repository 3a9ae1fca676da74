import { decoderGraph, embedTokensGraph } from "../architectures/Decoder.js"
import { Random } from "../Random.js"
import { type DecoderWeights, matrix } from "../Weights.js"
import { chatVocabulary, specialTokens, tokenizerConfig } from "./ChatVocabulary.js"
import { initStd, randomBlocks, type TransformerSize, unitLayerNorm } from "./RandomWeights.js"
import { jsonFile, type ModelRecipe, recipeStamp } from "./Recipe.js"

/**
 * bench/decoder-125m: a decoder-only LM the size of OPT-125m (12 layers, d = 768, 12 heads, MLP
 * 3072, vocabulary 50272, tied embeddings; ~500 MB of files) with seeded random weights, in the
 * same layout as tiny-color-vlm's decoder (embed_tokens.onnx + decoder_model_merged.onnx with a
 * KV cache), for benchmarking the LLM executor at a realistic size. Its tokenizer is the chat
 * vocabulary padded to 50272 tokens, so every id it generates decodes to text.
 */

export interface DecoderPreset extends TransformerSize {
  readonly vocabSize: number
  readonly maxPositions: number
  readonly seed: number
}

const layerNormEpsilon = 1e-5

export const decoder125m: DecoderPreset = {
  hidden: 768,
  layers: 12,
  heads: 12,
  intermediate: 3072,
  vocabSize: 50272,
  maxPositions: 2048,
  seed: 125
}

export const randomDecoderWeights = (preset: DecoderPreset): DecoderWeights => {
  const random = new Random(preset.seed)
  const { hidden, vocabSize } = preset
  const embedTokens = matrix(vocabSize, hidden, random.normals(vocabSize * hidden, initStd))
  const lmHead = matrix(hidden, vocabSize)
  for (let v = 0; v < vocabSize; v++) {
    for (let d = 0; d < hidden; d++) lmHead.data[d * vocabSize + v] = embedTokens.data[v * hidden + d]!
  }
  return {
    embedTokens,
    positions: matrix(preset.maxPositions, hidden, random.normals(preset.maxPositions * hidden, initStd)),
    layers: randomBlocks(random, preset, layerNormEpsilon),
    finalNorm: unitLayerNorm(hidden, layerNormEpsilon),
    lmHead
  }
}

/** A decoder recipe of any size; tests build a small one, the bench preset the real size. */
export const decoderRecipe = (name: string, preset: DecoderPreset): ModelRecipe => {
  const version = 1
  const build = () => {
    const vocabulary = chatVocabulary(preset.vocabSize)
    const config = {
      architectures: ["CornserveDecoder"],
      model_type: "cornserve_decoder",
      cornserve: recipeStamp({ name, version }),
      hidden_size: preset.hidden,
      intermediate_size: preset.intermediate,
      num_hidden_layers: preset.layers,
      num_attention_heads: preset.heads,
      num_key_value_heads: preset.heads,
      head_dim: preset.hidden / preset.heads,
      vocab_size: preset.vocabSize,
      max_position_embeddings: preset.maxPositions,
      layer_norm_eps: layerNormEpsilon,
      hidden_act: "gelu",
      tie_word_embeddings: true,
      eos_token_id: vocabulary.tokenId(specialTokens.imEnd),
      pad_token_id: vocabulary.tokenId(specialTokens.endOfText),
      torch_dtype: "float32"
    }
    const weights = randomDecoderWeights(preset)
    return new Map([
      ["config.json", jsonFile(config)],
      [
        "generation_config.json",
        jsonFile({ eos_token_id: config.eos_token_id, pad_token_id: config.pad_token_id, do_sample: false })
      ],
      ["tokenizer.json", jsonFile(vocabulary.tokenizerJson)],
      ["tokenizer_config.json", jsonFile(tokenizerConfig(vocabulary, preset.maxPositions))],
      ["onnx/embed_tokens.onnx", embedTokensGraph(weights).toBytes()],
      ["onnx/decoder_model_merged.onnx", decoderGraph(weights).toBytes()]
    ])
  }
  return { name, version, build }
}

export const benchDecoder125m = decoderRecipe("bench/decoder-125m", decoder125m)
