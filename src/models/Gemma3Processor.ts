import * as Schema from "effect/Schema"
import {
  Count,
  decodeConfigFile,
  type FixedSizePixels,
  fixedSizeImageFields,
  fixedSizePixels,
  fixedSizePixelValues,
  off
} from "./FixedSizeImage.js"
import { InvalidModelDirectory, type ModelDirectory } from "./ModelDirectory.js"

/**
 * Gemma 3's processor, computing what transformers.js's Gemma3Processor and Gemma3ImageProcessor
 * (its base ImageProcessor) compute under Node:
 *
 * - an image is decoded with sharp (oriented by EXIF, alpha dropped without blending, gray spread
 *   to RGB), resized to exactly size.width × size.height whatever its aspect ratio (an affine scale
 *   with the resample kernel, Lanczos through sharp's resize; an image already of that size is
 *   kept), rescaled then normalized with each step stored as float32, channels first:
 *   pixel_values [1, 3, height, width];
 * - each <start_of_image> of a prompt becomes "\n\n" <start_of_image>, image_seq_length
 *   <image_soft_token>, <end_of_image> "\n\n", before the prompt is tokenized, since the newlines
 *   merge with the text around them.
 *
 * Pan-and-scan (do_pan_and_scan and the pan_and_scan_* fields) is not read: transformers.js never
 * crops an image into pan-and-scan views, and its answers are the reference. The defaults are
 * transformers.js's ImageProcessor's: note that do_normalize is off unless the file turns it on.
 */

const Off = off("Gemma 3")

/** preprocessor_config.json of a Gemma 3 model (Gemma3ImageProcessor), as transformers.js reads it. */
const Gemma3ImageProcessorConfig = Schema.Struct({
  ...fixedSizeImageFields,
  /** transformers.js reads it from processor_config.json; when this file has it too, they must agree. */
  image_seq_length: Schema.optional(Count),
  do_center_crop: Off,
  do_thumbnail: Off,
  do_crop_margin: Off,
  do_pad: Off,
  do_flip_channel_order: Off
})

const ProcessorConfigJson = Schema.Struct({ image_seq_length: Count })

/** A token of the prompt expansion: its text, as tokenizer_config.json names it, and its id. */
export interface Gemma3Token {
  readonly text: string
  readonly id: number
}

/** Everything Gemma 3's processor needs, as plain data (it crosses to preprocessing threads). */
export interface Gemma3ProcessorConfig extends FixedSizePixels {
  /** <image_soft_token>s per image: the rows the vision encoder gives for one image. */
  readonly imageSeqLength: number
  /** The marker the chat template writes for an image, which expansion surrounds. */
  readonly boi: Gemma3Token
  readonly eoi: Gemma3Token
  /** The token whose embeddings the image features replace. */
  readonly image: Gemma3Token
}

const preprocessorFile = "preprocessor_config.json"
const processorFile = "processor_config.json"

/**
 * The id of an added token of tokenizer.json: the three tokens must be added tokens, which the
 * tokenizer never splits, so that each is one id wherever the expansion writes it.
 */
const addedTokenId = (model: ModelDirectory, json: Readonly<Record<string, unknown>>, text: string) => {
  const added = Array.isArray(json.added_tokens) ? (json.added_tokens as ReadonlyArray<unknown>) : []
  for (const token of added) {
    const { content, id } = (token ?? {}) as { content?: unknown; id?: unknown }
    if (content === text && typeof id === "number") return id
  }
  throw new InvalidModelDirectory({
    path: model.path,
    reason: `tokenizer.json has no added token ${JSON.stringify(text)}, which tokenizer_config.json names for Gemma 3's images`
  })
}

/** A number config.json gives for a field, which the processor's value must equal. */
const agrees = (model: ModelDirectory, field: string, given: unknown, value: number, what: string) => {
  if (given !== undefined && given !== value) {
    throw new InvalidModelDirectory({
      path: model.path,
      reason: `config.json's ${field} is ${JSON.stringify(given)}, but ${what} is ${value}`
    })
  }
}

/**
 * Gemma 3's processor settings from a model directory: the image processor from
 * preprocessor_config.json, image_seq_length from processor_config.json (which transformers.js's
 * Gemma3Processor requires), and the boi, eoi and image tokens that tokenizer_config.json names,
 * with their ids in tokenizer.json. What config.json says of them (mm_tokens_per_image,
 * vision_config.image_size, image_token_index, boi_token_index, eoi_token_index) must agree. A
 * directory that does not give them, or gives them wrong, is refused with the reason.
 */
export const gemma3ProcessorConfig = (model: ModelDirectory): Gemma3ProcessorConfig => {
  const refuse = (reason: string) => new InvalidModelDirectory({ path: model.path, reason })
  if (model.preprocessorConfig === undefined) throw refuse(`${preprocessorFile} is missing (Gemma 3 needs it)`)
  const image = decodeConfigFile(model, Gemma3ImageProcessorConfig, model.preprocessorConfig, preprocessorFile)
  const pixels = fixedSizePixels(model, image, preprocessorFile)
  if (model.processorConfig === undefined) {
    throw refuse(`${processorFile} is missing (Gemma 3's processor reads image_seq_length from it)`)
  }
  const { image_seq_length: imageSeqLength } = decodeConfigFile(
    model,
    ProcessorConfigJson,
    model.processorConfig,
    processorFile
  )
  if (image.image_seq_length !== undefined && image.image_seq_length !== imageSeqLength) {
    throw refuse(
      `${preprocessorFile}'s image_seq_length is ${image.image_seq_length}, but ${processorFile}'s is ${imageSeqLength}`
    )
  }
  const raw = model.rawConfig
  agrees(model, "mm_tokens_per_image", raw.mm_tokens_per_image, imageSeqLength, `${processorFile}'s image_seq_length`)
  const vision = (raw.vision_config ?? {}) as Readonly<Record<string, unknown>>
  agrees(model, "vision_config.image_size", vision.image_size, image.size.height, `${preprocessorFile}'s size.height`)
  agrees(model, "vision_config.image_size", vision.image_size, image.size.width, `${preprocessorFile}'s size.width`)

  if (model.tokenizer === undefined) throw refuse("it has no tokenizer.json (Gemma 3's prompts need it)")
  const { json, rawConfig } = model.tokenizer
  const token = (field: string): Gemma3Token => {
    const text = rawConfig[field]
    if (typeof text !== "string" || text.length === 0) {
      throw refuse(`tokenizer_config.json has no ${field} (Gemma 3's processor reads it as a string)`)
    }
    return { text, id: addedTokenId(model, json, text) }
  }
  const boi = token("boi_token")
  const eoi = token("eoi_token")
  const imageToken = token("image_token")
  const imageTokenField = raw.image_token_id === undefined ? "image_token_index" : "image_token_id"
  agrees(model, imageTokenField, model.config.image_token_id, imageToken.id, `the id of ${imageToken.text}`)
  agrees(model, "boi_token_index", raw.boi_token_index, boi.id, `the id of ${boi.text}`)
  agrees(model, "eoi_token_index", raw.eoi_token_index, eoi.id, `the id of ${eoi.text}`)

  return {
    ...pixels,
    imageSeqLength,
    boi,
    eoi,
    image: imageToken
  }
}

// ---------------------------------------------------------------------------------------------
// Pixels

/** An encoded image → pixel_values [1, 3, height, width], as transformers.js's Gemma3ImageProcessor gives them. */
export const gemma3PixelValues = fixedSizePixelValues

// ---------------------------------------------------------------------------------------------
// Prompts

/** A prompt whose image markers (<start_of_image>) do not match the images sent with it. */
export class Gemma3ImageMarkerMismatch extends Schema.TaggedError<Gemma3ImageMarkerMismatch>()(
  "Gemma3ImageMarkerMismatch",
  { marker: Schema.String, markers: Schema.Int, images: Schema.Int }
) {
  override get message() {
    return `the prompt has ${this.markers} ${this.marker} marker(s) for ${this.images} image(s)`
  }
}

/** How many images a prompt marks: its <start_of_image>s, counted as expansion replaces them. */
export const countImageMarkers = (text: string, config: Gemma3ProcessorConfig): number =>
  text.split(config.boi.text).length - 1

/**
 * A prompt as Gemma 3 reads it, before tokenizing: every <start_of_image> expanded as
 * transformers.js's Gemma3Processor expands it. With `images`, a prompt that marks another number
 * of images is refused (Gemma3ImageMarkerMismatch): each image's features fill one marker's tokens.
 */
export const expandGemma3Prompt = (text: string, config: Gemma3ProcessorConfig, images?: number): string => {
  if (images !== undefined) {
    const markers = countImageMarkers(text, config)
    if (markers !== images) throw new Gemma3ImageMarkerMismatch({ marker: config.boi.text, markers, images })
  }
  const sequence = `\n\n${config.boi.text}${config.image.text.repeat(config.imageSeqLength)}${config.eoi.text}\n\n`
  return text.replaceAll(config.boi.text, sequence)
}
