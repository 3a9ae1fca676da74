import * as Schema from "effect/Schema"
import { decodeConfigFile, type FixedSizePixels, fixedSizeImageFields, fixedSizePixels, off } from "./FixedSizeImage.js"
import { InvalidModelDirectory, type ModelDirectory } from "./ModelDirectory.js"

/**
 * LLaVA-OneVision's images as transformers.js 4.3.1 reads them (LlavaOnevisionImageProcessor, its
 * base ImageProcessor; LlavaOnevisionForConditionalGeneration, its LlavaForConditionalGeneration):
 * each image resized to exactly the processor's size (FixedSizeImage.ts), the vision encoder's rows
 * (the tower's patches, ⌊size ÷ patch⌋², projected) replacing as many `<image>` tokens of the
 * prompt, in order. The prompt's `<image>` the chat template writes is expanded to that count.
 *
 * What transformers (Python) does besides, and transformers.js does not, is not done here, as
 * transformers.js's answers are the reference: any-resolution tiling (`image_grid_pinpoints`:
 * the image also cut into tiles of the size, each tile's rows unpadded and ended by the
 * `image_newline` row), and video (frames pooled 2 × 2). An export whose vision encoder took the
 * tiles and the image's size would let the platform do both; `do_pad` pads to the size the image
 * already has, so it changes nothing.
 */

const Off = off("LLaVA-OneVision")

/** preprocessor_config.json of a LLaVA-OneVision model, as transformers.js reads it. */
const LlavaOnevisionImageProcessorConfig = Schema.Struct({
  ...fixedSizeImageFields,
  do_pad: Schema.optional(Schema.NullOr(Schema.Boolean)),
  do_center_crop: Off,
  do_thumbnail: Off,
  do_crop_margin: Off,
  do_flip_channel_order: Off
})

/** Everything LLaVA-OneVision's processor needs, as plain data (it crosses to preprocessing threads). */
export interface LlavaOnevisionProcessorConfig extends FixedSizePixels {
  /** The vision encoder's rows for one image: the `<image>` tokens it takes in the prompt. */
  readonly imageTokens: number
  /** The token whose embeddings an image's rows replace. */
  readonly imageTokenId: number
}

const preprocessorFile = "preprocessor_config.json"

/** Whether a model directory is a LLaVA-OneVision (config.json's model_type). */
export const isLlavaOnevision = (model: ModelDirectory): boolean => model.config.model_type === "llava_onevision"

/**
 * LLaVA-OneVision's processor settings: the image processor from preprocessor_config.json, the
 * rows an image gives from config.json's vision_config (⌊image_size ÷ patch_size⌋², every patch:
 * vision_feature_select_strategy "full"), and the image token (image_token_index). A
 * directory that does not give them, or gives a processor size other than the tower's, is refused.
 */
export const llavaOnevisionProcessorConfig = (model: ModelDirectory): LlavaOnevisionProcessorConfig => {
  const refuse = (reason: string) => new InvalidModelDirectory({ path: model.path, reason })
  if (model.preprocessorConfig === undefined) throw refuse(`${preprocessorFile} is missing (LLaVA-OneVision needs it)`)
  const image = decodeConfigFile(model, LlavaOnevisionImageProcessorConfig, model.preprocessorConfig, preprocessorFile)
  const pixels = fixedSizePixels(model, image, preprocessorFile)
  const raw = model.rawConfig
  const vision = (raw.vision_config ?? {}) as Readonly<Record<string, unknown>>
  const { image_size: imageSize, patch_size: patchSize } = vision
  if (typeof imageSize !== "number" || typeof patchSize !== "number" || !(imageSize > 0) || !(patchSize > 0)) {
    throw refuse("config.json's vision_config lacks image_size or patch_size (the rows an image gives)")
  }
  if (pixels.size.height !== imageSize || pixels.size.width !== imageSize) {
    throw refuse(
      `${preprocessorFile}'s size is ${pixels.size.width}×${pixels.size.height}, but vision_config.image_size is ${imageSize}`
    )
  }
  // "default" drops the first row, a CLS token's in a CLIP tower: OneVision's SigLIP has none.
  const strategy = raw.vision_feature_select_strategy ?? "full"
  if (strategy !== "full") {
    throw refuse(
      `config.json's vision_feature_select_strategy is ${JSON.stringify(strategy)}: only "full" (OneVision's SigLIP tower) is read`
    )
  }
  const imageTokenId = model.config.image_token_id
  if (imageTokenId === undefined) throw refuse("config.json has no image_token_index (the token images replace)")
  return {
    ...pixels,
    imageTokens: Math.floor(imageSize / patchSize) ** 2,
    imageTokenId
  }
}
