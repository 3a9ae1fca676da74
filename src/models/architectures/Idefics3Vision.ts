import { elementType, Graph, type Value } from "../onnx/Graph.js"
import { layerNorm, matrixWeight, patchEmbedding } from "../onnx/Layers.js"
import type { LayerNormWeights, Matrix, PatchEmbeddingWeights } from "../Weights.js"

/**
 * An Idefics3 (SmolVLM) image encoder with the inputs and output of the ONNX exports published
 * for transformers.js (onnx/vision_encoder.onnx):
 *
 *   pixel_values float [batch_size, num_images, 3, height, width]
 *   pixel_attention_mask bool [batch_size, num_images, height, width]
 *   → image_features float [num_images_total, image_seq_len, text_hidden]
 *
 * As in Idefics3Model, frames that are all zero (the padding of a batch) are dropped, a patch
 * counts when any of its pixels is in the mask, and the connector pixel-shuffles the patch grid by
 * scale_factor (scale_factor² neighbouring patches become one row) before projecting each row to
 * the text model's width. The encoder itself is a patch embedding with learned positions and a
 * LayerNorm; masked patches are zeroed.
 */

export interface Idefics3VisionWeights {
  /** The tile edge the encoder takes (vision_config.image_size). */
  readonly imageSize: number
  readonly patch: PatchEmbeddingWeights
  /** [patches, vision hidden]. */
  readonly positions: Matrix
  readonly postLayerNorm: LayerNormWeights
  readonly scaleFactor: number
  /** [vision hidden × scale_factor², text hidden], no bias (the connector's modality_projection). */
  readonly projection: Matrix
}

/** Features per frame: the patch grid shrunk by scale_factor in each direction. */
export const idefics3ImageSeqLen = (imageSize: number, patchSize: number, scaleFactor: number): number =>
  (imageSize / patchSize) ** 2 / scaleFactor ** 2

/**
 * Idefics3Connector.pixel_shuffle: x [frames, side², hidden] → [frames, (side/s)², hidden·s²],
 * written as the same chain of reshapes and transposes.
 */
const pixelShuffle = (g: Graph, x: Value, side: number, hidden: number, s: number): Value => {
  const narrow = g.op("Reshape", [x, g.int64s([-1, side, side / s, hidden * s])])
  const swapped = g.op("Transpose", [narrow], { perm: [0, 2, 1, 3] })
  const grouped = g.op("Reshape", [swapped, g.int64s([-1, side / s, side / s, hidden * s * s])])
  const back = g.op("Transpose", [grouped], { perm: [0, 2, 1, 3] })
  return g.op("Reshape", [back, g.int64s([-1, (side / s) ** 2, hidden * s * s])])
}

export const idefics3VisionGraph = (w: Idefics3VisionWeights): Graph => {
  const { imageSize: size, scaleFactor } = w
  const { channels, hidden, patchSize } = w.patch
  const side = size / patchSize
  if (!Number.isInteger(side) || side % scaleFactor !== 0) {
    throw new Error(`a ${size}-pixel tile of ${patchSize}-pixel patches does not shuffle by ${scaleFactor}`)
  }
  const textHidden = w.projection.cols
  const seqLen = idefics3ImageSeqLen(size, patchSize, scaleFactor)

  const g = new Graph("vision_encoder")
  const pixelValues = g.input("pixel_values", "float32", ["batch_size", "num_images", channels, "height", "width"])
  const pixelMask = g.input("pixel_attention_mask", "bool", ["batch_size", "num_images", "height", "width"])

  const allFrames = g.op("Reshape", [pixelValues, g.int64s([-1, channels, size, size])])
  const allMasks = g.op("Reshape", [pixelMask, g.int64s([-1, 1, size, size])])
  const magnitude = g.op("ReduceMax", [g.op("Abs", [allFrames])], { axes: [1, 2, 3], keepdims: 0 })
  const real = g.op("Greater", [magnitude, g.floatScalar(0)])
  const frames = g.op("Compress", [allFrames, real], { axis: 0 })
  const masks = g.op("Cast", [g.op("Compress", [allMasks, real], { axis: 0 })], { to: elementType("float32") })

  const patches = patchEmbedding(g, frames, w.patch, "embeddings.patch_embedding")
  const embedded = g.op("Add", [patches, matrixWeight(g, "embeddings.position_embedding", w.positions)])
  const encoded = layerNorm(g, embedded, w.postLayerNorm, "post_layernorm")
  const patchMask = g.op("Reshape", [
    g.op("MaxPool", [masks], { kernel_shape: [patchSize, patchSize], strides: [patchSize, patchSize] }),
    g.int64s([-1, side * side, 1])
  ])
  const masked = g.op("Mul", [encoded, patchMask])

  const shuffled = pixelShuffle(g, masked, side, hidden, scaleFactor)
  const features = g.op("MatMul", [
    shuffled,
    matrixWeight(g, "connector.modality_projection.proj.weight", w.projection)
  ])
  g.output(features, "image_features", "float32", ["num_images", seqLen, textHidden])
  return g
}
