import {
  type MimiConv,
  type MimiLayer,
  type MimiSize,
  type MimiWeights,
  mimiDecoderGraph,
  mimiStageChannels,
  mimiUpsampleStride
} from "../architectures/Mimi.js"
import { Random } from "../Random.js"
import { matrix } from "../Weights.js"
import { jsonFile, type ModelFiles, type ModelRecipe, recipeStamp } from "./Recipe.js"
import { unitLayerNorm } from "./RandomWeights.js"

/**
 * A random-weight Mimi codec decoder in the community's export layout (onnx-community/kyutai-mimi-ONNX:
 * MimiConfig's config.json, the EnCodec feature extractor's preprocessor_config.json and
 * onnx/decoder_model.onnx), at Mimi's rates: 24 kHz, 12.5 code frames a second.
 */

export interface RandomMimiOptions extends Partial<MimiSize> {
  readonly seed?: number
  /** More fields for config.json (a built-in recipe's stamp). */
  readonly config?: Readonly<Record<string, unknown>>
}

export interface RandomMimi {
  readonly files: ModelFiles
  readonly size: MimiSize
}

/** The geometry of kyutai/mimi. */
export const mimiGeometry: MimiSize = {
  hidden: 512,
  numFilters: 64,
  upsamplingRatios: [8, 6, 5, 4],
  kernelSize: 7,
  lastKernelSize: 3,
  residualKernelSize: 3,
  dilationGrowthRate: 2,
  numResidualLayers: 1,
  compress: 2,
  codebookSize: 2048,
  codebookDim: 256,
  numQuantizers: 32,
  numSemanticQuantizers: 1,
  layers: 8,
  heads: 8,
  headDim: 64,
  intermediate: 2048,
  slidingWindow: 250,
  ropeTheta: 10000,
  normEps: 1e-5,
  maxPositions: 8000,
  samplingRate: 24000,
  frameRate: 12.5
}

/** A small Mimi: the same rates and layers, a few channels wide. */
export const tinyMimiGeometry: MimiSize = {
  ...mimiGeometry,
  hidden: 32,
  numFilters: 4,
  codebookSize: 64,
  codebookDim: 16,
  numQuantizers: 8,
  layers: 2,
  heads: 2,
  headDim: 16,
  intermediate: 64,
  slidingWindow: 16
}

const randomMimiWeights = (random: Random, size: MimiSize): MimiWeights => {
  const { hidden, codebookDim } = size
  const square = (rows: number, cols: number, gain = 1) =>
    matrix(rows, cols, random.normals(rows * cols, gain / Math.sqrt(rows)))
  const conv = (outputs: number, inputs: number, kernel: number, gain = Math.SQRT2): MimiConv => ({
    kernel: random.normals(outputs * inputs * kernel, gain / Math.sqrt(inputs * kernel)),
    bias: random.normals(outputs, 0.01)
  })
  return {
    codebooks: Array.from({ length: size.numQuantizers }, () => random.normals(size.codebookSize * codebookDim, 1)),
    semanticProjection: square(codebookDim, hidden),
    acousticProjection: square(codebookDim, hidden, 1 / Math.sqrt(size.numQuantizers)),
    upsample: { kernel: random.normals(hidden * 2 * mimiUpsampleStride, 0.7) },
    layers: Array.from(
      { length: size.layers },
      (): MimiLayer => ({
        inputNorm: unitLayerNorm(hidden, size.normEps),
        query: square(hidden, size.heads * size.headDim),
        key: square(hidden, size.heads * size.headDim),
        value: square(hidden, size.heads * size.headDim),
        output: square(size.heads * size.headDim, hidden),
        attentionScale: random.normals(hidden, 0.3),
        postNorm: unitLayerNorm(hidden, size.normEps),
        up: square(hidden, size.intermediate),
        down: square(size.intermediate, hidden),
        mlpScale: random.normals(hidden, 0.3)
      })
    ),
    firstConv: conv(mimiStageChannels(size, 0), hidden, size.kernelSize, 1),
    stages: size.upsamplingRatios.map((ratio, stage) => {
      const channels = mimiStageChannels(size, stage)
      const narrow = channels / 2 / size.compress
      return {
        // A ConvTranspose kernel is [in, out, kernel]; its fan-in per output is in × kernel / stride.
        upsample: {
          kernel: random.normals(channels * (channels / 2) * 2 * ratio, Math.SQRT2 / Math.sqrt(channels * 2)),
          bias: random.normals(channels / 2, 0.01)
        },
        residuals: Array.from({ length: size.numResidualLayers }, () => ({
          narrow: conv(narrow, channels / 2, size.residualKernelSize),
          wide: conv(channels / 2, narrow, 1, 0.5)
        }))
      }
    }),
    lastConv: conv(1, size.numFilters, size.lastKernelSize, 0.12)
  }
}

export const randomMimiFiles = (options: RandomMimiOptions = {}): RandomMimi => {
  const { seed, config, ...overrides } = options
  const random = new Random(seed ?? 1)
  const size: MimiSize = { ...tinyMimiGeometry, ...overrides }
  const weights = randomMimiWeights(random, size)
  const files: ModelFiles = new Map([
    [
      "config.json",
      jsonFile({
        architectures: ["MimiModel"],
        model_type: "mimi",
        audio_channels: 1,
        sampling_rate: size.samplingRate,
        frame_rate: size.frameRate,
        hidden_size: size.hidden,
        num_filters: size.numFilters,
        num_residual_layers: size.numResidualLayers,
        upsampling_ratios: size.upsamplingRatios,
        kernel_size: size.kernelSize,
        last_kernel_size: size.lastKernelSize,
        residual_kernel_size: size.residualKernelSize,
        dilation_growth_rate: size.dilationGrowthRate,
        use_causal_conv: true,
        pad_mode: "constant",
        compress: size.compress,
        trim_right_ratio: 1.0,
        codebook_size: size.codebookSize,
        codebook_dim: size.codebookDim,
        num_quantizers: size.numQuantizers,
        num_semantic_quantizers: size.numSemanticQuantizers,
        vector_quantization_hidden_dimension: size.codebookDim,
        use_conv_shortcut: false,
        upsample_groups: size.hidden,
        num_hidden_layers: size.layers,
        num_attention_heads: size.heads,
        num_key_value_heads: size.heads,
        head_dim: size.headDim,
        intermediate_size: size.intermediate,
        hidden_act: "gelu",
        sliding_window: size.slidingWindow,
        rope_theta: size.ropeTheta,
        norm_eps: size.normEps,
        max_position_embeddings: size.maxPositions,
        layer_scale_initial_scale: 0.01,
        attention_bias: false,
        use_cache: false,
        ...config
      })
    ],
    [
      "preprocessor_config.json",
      jsonFile({
        feature_extractor_type: "EncodecFeatureExtractor",
        feature_size: 1,
        padding_side: "right",
        padding_value: 0,
        return_attention_mask: true,
        sampling_rate: size.samplingRate,
        chunk_length_s: null,
        overlap: null
      })
    ],
    ["onnx/decoder_model.onnx", mimiDecoderGraph(size, weights).toBytes()]
  ])
  return { files, size }
}

/**
 * cornserve/tiny-mimi: the random Mimi decoder above (2 transformer layers at 32 wide, a SEANet of
 * 4 to 64 channels, 8 codebooks of 64 codes), the built-in codec the examples use. It turns codes
 * into noise shaped by them; for real speech, name the community's onnx-community/kyutai-mimi-ONNX
 * and give it the codes a Mimi-speaking model writes (Moshi, Sesame CSM, Kyutai TTS).
 */
export const tinyMimi: ModelRecipe = {
  name: "cornserve/tiny-mimi",
  version: 1,
  build: () =>
    randomMimiFiles({ seed: 12, config: { cornserve: recipeStamp({ name: "cornserve/tiny-mimi", version: 1 }) } }).files
}
