import { Qwen2VLForConditionalGeneration, Tensor } from "@huggingface/transformers"
import type { GridThw } from "../../../src/models/Qwen2VLProcessor.js"

/**
 * Qwen2-VL as transformers.js computes it, without weights: the preprocessor config of
 * Qwen/Qwen2-VL-2B-Instruct, and get_rope_index called on a model object that has only a config.
 */

/** The fields of Qwen/Qwen2-VL-2B-Instruct's preprocessor_config.json. */
export const qwen2VLPreprocessorConfig = {
  min_pixels: 3136,
  max_pixels: 12845056,
  patch_size: 14,
  temporal_patch_size: 2,
  merge_size: 2,
  image_mean: [0.48145466, 0.4578275, 0.40821073],
  image_std: [0.26862954, 0.26130258, 0.27577711],
  image_processor_type: "Qwen2VLImageProcessor",
  processor_class: "Qwen2VLProcessor"
} as const

/**
 * The same with the steps transformers (Python) takes by default spelled out: transformers.js's
 * generic image processor neither resizes nor normalizes unless the file says so.
 */
export const qwen2VLPreprocessorConfigSpelledOut = {
  ...qwen2VLPreprocessorConfig,
  do_resize: true,
  resample: 3,
  do_rescale: true,
  rescale_factor: 1 / 255,
  do_normalize: true,
  do_convert_rgb: true
} as const

/** The special tokens of Qwen2-VL (and of the Qwen3 vocabulary, which has them with the same ids). */
export const qwen2VLTokens = {
  visionStart: 151652,
  visionEnd: 151653,
  imagePad: 151655,
  videoPad: 151656
} as const

const gridTensor = (grids: ReadonlyArray<GridThw>) =>
  grids.length === 0 ? null : new Tensor("int64", BigInt64Array.from(grids.flat(), BigInt), [grids.length, 3])

/**
 * transformers.js's Qwen2VLForConditionalGeneration.get_rope_index for one prompt with an all-ones
 * attention mask: its position_ids [3, 1, sequence] flattened, and its rope delta. It reads only
 * the model's config, so it runs on an object made from the class's prototype.
 */
export const referenceRopeIndex = (
  ids: ReadonlyArray<number>,
  grids: { readonly images: ReadonlyArray<GridThw>; readonly videos: ReadonlyArray<GridThw> },
  spatialMergeSize = 2
): { readonly positions: Array<number>; readonly delta: number } => {
  const model: Qwen2VLForConditionalGeneration = Object.create(Qwen2VLForConditionalGeneration.prototype)
  Object.assign(model, {
    config: {
      vision_config: { spatial_merge_size: spatialMergeSize },
      image_token_id: qwen2VLTokens.imagePad,
      video_token_id: qwen2VLTokens.videoPad,
      vision_start_token_id: qwen2VLTokens.visionStart
    }
  })
  const inputIds = new Tensor("int64", BigInt64Array.from(ids, BigInt), [1, ids.length])
  const mask = new Tensor("int64", new BigInt64Array(ids.length).fill(1n), [1, ids.length])
  const getRopeIndex = model.get_rope_index as unknown as (...args: ReadonlyArray<unknown>) => [Tensor, Tensor]
  const [positions, delta] = getRopeIndex.call(
    model,
    inputIds,
    gridTensor(grids.images),
    gridTensor(grids.videos),
    mask
  )
  return {
    positions: Array.from(positions.data as BigInt64Array, Number),
    delta: Number((delta.data as BigInt64Array)[0])
  }
}
