/**
 * Text to image with Janus-Pro, as OpenAI's images route: post `{ "prompt": "a red fox in the sky" }`
 * to `/app/janus/v1/images/generations` with any OpenAI client and get PNGs as `b64_json`. The LLM
 * executor chooses the image's tokens with classifier-free guidance (as transformers.js's
 * `generate_images` does), and Geri decodes them to pixels, the tokens going from one to the other
 * through the sidecar. Without a `seed` each image is the greedy one, the same for a prompt every
 * time; with one, image i is drawn at temperature 1 from `seed + i`.
 *
 * It runs the built-in `cornserve/tiny-janus` (random weights: its 64 × 64 images follow the
 * prompt but show nothing). For real pictures name DeepSeek's model as the community exports it,
 * `onnx-community/Janus-Pro-1B-ONNX` (384 × 384 images), in both tasks and in `modelSide`.
 */
import {
  CompositeTask,
  defineApp,
  ImageGenerationRequest,
  ImageGeneratorTask,
  type ImageGeneratorOutput,
  ImagesResponse,
  imageSizeOf,
  LLMImageTokensTask
} from "cornserve/app"

const model = "cornserve/tiny-janus"
/** The side of the images the model paints; another size is the model's image resized. */
const modelSide = 64

interface PaintInput {
  readonly prompt: string
  readonly width: number
  readonly height: number
  readonly seed?: number
}

/** The prompt's image tokens from the LLM executor, decoded by Geri. */
class Janus extends CompositeTask<PaintInput, ImageGeneratorOutput> {
  readonly name = "janus"
  private readonly tokens = this.use(new LLMImageTokensTask({ model }))
  private readonly decoder = this.use(new ImageGeneratorTask({ model }))

  compose({ prompt, width, height, seed }: PaintInput) {
    const { tokens } = this.tokens.compose({ prompt, ...(seed === undefined ? {} : { seed, temperature: 1 }) })
    return this.decoder.compose({ embeddings: tokens, width, height })
  }
}

const janus = new Janus()

export default defineApp({
  description: "Paints a prompt with Janus-Pro (OpenAI's image generations).",
  tasks: { janus },
  request: ImageGenerationRequest,
  response: ImagesResponse,
  example: { prompt: "A red fox in the sky" },
  serve: async (request) => {
    const { width, height } = imageSizeOf(request.size) ?? { width: modelSide, height: modelSide }
    const data = await Promise.all(
      Array.from({ length: request.n ?? 1 }, async (_, index) => {
        const seed = request.seed == null ? undefined : request.seed + index
        const { image } = await janus.invoke({
          prompt: request.prompt,
          width,
          height,
          ...(seed === undefined ? {} : { seed })
        })
        return { b64_json: image }
      })
    )
    return { created: Math.floor(Date.now() / 1000), data, output_format: "png" as const, size: `${width}x${height}` }
  }
})
