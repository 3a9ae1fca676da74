import { type Gemma3ProcessorConfig, gemma3ProcessorConfig } from "./Gemma3Processor.js"
import { type Idefics3Processor, idefics3Processor } from "./Idefics3Processor.js"
import { decodeImageProcessorConfig, type ImageProcessorConfig } from "./ImageProcessor.js"
import {
  isLlavaOnevision,
  type LlavaOnevisionProcessorConfig,
  llavaOnevisionProcessorConfig
} from "./LlavaOnevisionProcessor.js"
import { InvalidModelDirectory, type ModelDirectory } from "./ModelDirectory.js"
import { type Qwen2VLProcessor, qwen2VLProcessor } from "./Qwen2VLProcessor.js"

/**
 * How a model's images become its vision encoder's input, chosen from its preprocessor_config.json:
 * a fixed-size processor (size: { height, width }: one frame per image, a fixed number of feature
 * rows), or Idefics3's (SmolVLM; size: { longest_edge }: tiles plus a global image, a grid the
 * prompt spells out), or Qwen2-VL's (Qwen2-VL, Qwen2.5-VL: images and videos at their own
 * resolution, as many patches as their area within min_pixels and max_pixels; Qwen3-VL: its images
 * so, its videos refused), or Gemma 3's (one
 * frame at the size given, a fixed number of soft tokens that the prompt spells out).
 */
export type VisionProcessor =
  | { readonly kind: "fixed"; readonly config: ImageProcessorConfig }
  | { readonly kind: "idefics3"; readonly processor: Idefics3Processor }
  | { readonly kind: "qwen2vl"; readonly processor: Qwen2VLProcessor }
  | { readonly kind: "gemma3"; readonly processor: Gemma3ProcessorConfig }
  | { readonly kind: "llavaOnevision"; readonly processor: LlavaOnevisionProcessorConfig }

const idefics3Types = new Set(["Idefics3ImageProcessor", "SmolVLMImageProcessor"])
const qwen2VLTypes = new Set(["Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast"])
const qwen2VLModels = new Set(["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])

/**
 * Qwen3-VL's videos are refused. transformers (Python) writes each temporal patch of a video into
 * the prompt as its own "<t seconds>" timestamp and <|vision_start|><|video_pad|>…<|vision_end|>
 * run, and gives each its own M-RoPE frame (Qwen3VLProcessor, get_rope_index): Qwen2-VL's one
 * run per video would be a prompt the model was not trained on. transformers.js 4.3.1, the
 * reference the platform's answers are checked against, has no video path for it to follow: its
 * Qwen3VLProcessor (a Qwen2VLProcessor) takes no videos and its model encodes images only.
 */
const qwen3VLVideoRefusal =
  "Qwen3-VL models take images here, not videos: a Qwen3-VL video needs a timestamp before each frame's tokens, which transformers.js 4.3.1, the reference this platform follows, does not write"
const gemma3Types = new Set(["Gemma3ImageProcessor", "Gemma3ImageProcessorFast"])

export const supportedImageProcessors =
  "a fixed-size image processor (size: { height, width }) Idefics3ImageProcessor / SmolVLMImageProcessor (size: { longest_edge }), Qwen2VLImageProcessor (min_pixels, max_pixels), Gemma3ImageProcessor or LlavaOnevisionImageProcessor"

/** The model's image processor; a preprocessor config none of them follows is refused, naming the file and why. */
export const visionProcessorOf = (model: ModelDirectory): VisionProcessor => {
  const config = model.preprocessorConfig
  if (config === undefined) {
    throw new InvalidModelDirectory({
      path: model.path,
      reason: `it has a vision encoder but no preprocessor_config.json; supported: ${supportedImageProcessors}`
    })
  }
  const declared = config.image_processor_type
  const size = config.size as Record<string, unknown> | undefined
  const idefics3 =
    (typeof declared === "string" && idefics3Types.has(declared)) ||
    (declared === undefined && model.config.model_type === "idefics3") ||
    (declared === undefined && size !== undefined && "longest_edge" in size)
  const qwen2VL =
    (typeof declared === "string" && qwen2VLTypes.has(declared)) ||
    (declared === undefined && qwen2VLModels.has(String(model.config.model_type)))
  // Gemma 3's processor reads three files and says itself which is wrong.
  if ((typeof declared === "string" && gemma3Types.has(declared)) || model.config.model_type === "gemma3")
    return { kind: "gemma3", processor: gemma3ProcessorConfig(model) }
  if (isLlavaOnevision(model)) return { kind: "llavaOnevision", processor: llavaOnevisionProcessorConfig(model) }
  try {
    if (qwen2VL) {
      const processor = qwen2VLProcessor(config)
      return {
        kind: "qwen2vl",
        processor:
          model.config.model_type === "qwen3_vl" ? { ...processor, videoRefusal: qwen3VLVideoRefusal } : processor
      }
    }
    if (idefics3) {
      return {
        kind: "idefics3",
        processor: idefics3Processor({
          preprocessorConfig: config,
          processorConfig: model.processorConfig,
          modelConfig: model.rawConfig
        })
      }
    }
    return { kind: "fixed", config: decodeImageProcessorConfig(config) }
  } catch (error) {
    throw new InvalidModelDirectory({
      path: model.path,
      reason: `${(error as Error).message}${typeof declared === "string" ? ` (image_processor_type ${declared})` : ""}; supported: ${supportedImageProcessors}`
    })
  }
}
