import { visionTransformerGraph } from "../architectures/VisionTransformer.js"
import { Random } from "../Random.js"
import { matrix, type VisionTransformerWeights } from "../Weights.js"
import { initStd, randomBlocks, type TransformerSize, unitLayerNorm } from "./RandomWeights.js"
import { jsonFile, type ModelRecipe, recipeStamp } from "./Recipe.js"

/**
 * bench/vit-b16: a ViT-B/16 image encoder (224×224 → 197×768, 12 layers, 12 heads, MLP 3072,
 * ~86M parameters, ~345 MB) with seeded random weights, for benchmarking Eric at a realistic size.
 * Its answers mean nothing; its cost is that of the real model.
 */

export interface VisionTransformerPreset extends TransformerSize {
  readonly imageSize: number
  readonly patchSize: number
  readonly seed: number
}

const layerNormEpsilon = 1e-12

export const vitB16: VisionTransformerPreset = {
  imageSize: 224,
  patchSize: 16,
  hidden: 768,
  layers: 12,
  heads: 12,
  intermediate: 3072,
  seed: 16
}

export const randomVisionTransformerWeights = (preset: VisionTransformerPreset): VisionTransformerWeights => {
  const random = new Random(preset.seed)
  const { hidden, patchSize } = preset
  const patches = (preset.imageSize / patchSize) ** 2
  return {
    imageSize: preset.imageSize,
    patch: {
      channels: 3,
      hidden,
      patchSize,
      kernel: random.normals(hidden * 3 * patchSize * patchSize, initStd),
      bias: random.normals(hidden, initStd)
    },
    classToken: random.normals(hidden, initStd),
    positions: matrix(1 + patches, hidden, random.normals((1 + patches) * hidden, initStd)),
    layers: randomBlocks(random, preset, layerNormEpsilon),
    finalNorm: unitLayerNorm(hidden, layerNormEpsilon)
  }
}

/** A ViT recipe of any size; tests build a small one, the bench preset the real size. */
export const visionTransformerRecipe = (name: string, preset: VisionTransformerPreset): ModelRecipe => {
  const version = 1
  const build = () => {
    const config = {
      architectures: ["ViTModel"],
      model_type: "vit",
      cornserve: recipeStamp({ name, version }),
      hidden_size: preset.hidden,
      num_hidden_layers: preset.layers,
      num_attention_heads: preset.heads,
      intermediate_size: preset.intermediate,
      hidden_act: "gelu",
      layer_norm_eps: layerNormEpsilon,
      image_size: preset.imageSize,
      patch_size: preset.patchSize,
      num_channels: 3,
      image_seq_length: 1 + (preset.imageSize / preset.patchSize) ** 2
    }
    const preprocessor = {
      image_processor_type: "ViTImageProcessor",
      do_resize: true,
      size: { height: preset.imageSize, width: preset.imageSize },
      resample: 2,
      do_rescale: true,
      rescale_factor: 1 / 255,
      do_normalize: true,
      image_mean: [0.5, 0.5, 0.5],
      image_std: [0.5, 0.5, 0.5]
    }
    return new Map([
      ["config.json", jsonFile(config)],
      ["preprocessor_config.json", jsonFile(preprocessor)],
      ["onnx/vision_encoder.onnx", visionTransformerGraph(randomVisionTransformerWeights(preset)).toBytes()]
    ])
  }
  return { name, version, build }
}

export const benchVitB16 = visionTransformerRecipe("bench/vit-b16", vitB16)
