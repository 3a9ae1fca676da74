import { transformerBlock } from "../onnx/Attention.js"
import { Graph, type Value } from "../onnx/Graph.js"
import { layerNorm, matrixWeight, patchEmbedding } from "../onnx/Layers.js"
import type { VisionTransformerWeights } from "../Weights.js"

/**
 * A ViT image encoder as onnx/vision_encoder.onnx: pixel_values [batch, channels, size, size] →
 * image_features [batch, 1 + patches, hidden] (the class token row first, then the patches in
 * row-major order), the ViT-B/16 layout of Hugging Face's ViTModel.
 */
export const visionTransformerGraph = (w: VisionTransformerWeights): Graph => {
  const { channels, hidden } = w.patch
  const g = new Graph("vision_encoder")
  const pixels = g.input("pixel_values", "float32", ["batch_size", channels, w.imageSize, w.imageSize])
  const patches = patchEmbedding(g, pixels, w.patch, "embeddings.patch_embeddings")
  const classToken = g.weight("embeddings.cls_token", "float32", [1, 1, hidden], w.classToken)
  const batch = g.op("Slice", [g.op("Shape", [pixels]), g.int64s([0]), g.int64s([1])])
  const classRows = g.op("Expand", [classToken, g.op("Concat", [batch, g.int64s([1, hidden])], { axis: 0 })])
  const tokens = g.op("Concat", [classRows, patches], { axis: 1 })
  let x: Value = g.op("Add", [tokens, matrixWeight(g, "embeddings.position_embeddings", w.positions)])
  w.layers.forEach((layer, i) => {
    x = transformerBlock(g, x, layer, {}, `encoder.layer.${i}`).output
  })
  const features = layerNorm(g, x, w.finalNorm, "layernorm")
  g.output(features, "image_features", "float32", ["batch_size", w.positions.rows, hidden])
  return g
}
