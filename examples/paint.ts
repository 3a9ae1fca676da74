/**
 * Image generation as OpenAI's images route: post `{ "prompt": "a red square", "size": "128x128" }`
 * to `/app/paint/v1/images/generations` with any OpenAI client and get PNGs as `b64_json`. The
 * prompt's embeddings come from the LLM and go to the painter (Geri) through the sidecar; the
 * built-in `cornserve/tiny-color-painter` paints the colour the prompt names (red, green, blue,
 * yellow, cyan, magenta, white or black), the same `seed` the same picture.
 */
import {
  CompositeTask,
  defineApp,
  ImageGenerationRequest,
  ImageGeneratorTask,
  type ImageGeneratorOutput,
  ImagesResponse,
  imageSizeOf,
  LLMEmbeddingTask
} from "cornserve/app"

interface PaintInput {
  readonly prompt: string
  readonly width: number
  readonly height: number
  readonly seed?: number
}

/** The prompt's embeddings from the LLM, straight into the painter. */
class Paint extends CompositeTask<PaintInput, ImageGeneratorOutput> {
  readonly name = "paint"
  /** The same config as color_chat's LLM: one deployment serves both. */
  private readonly embed = this.use(
    new LLMEmbeddingTask({ model: "cornserve/tiny-color-vlm", receiveEmbeddings: true })
  )
  private readonly painter = this.use(new ImageGeneratorTask({ model: "cornserve/tiny-color-painter" }))

  compose({ prompt, width, height, seed }: PaintInput) {
    const { embeddings } = this.embed.compose({ messages: [{ role: "user", content: `Make something ${prompt}` }] })
    return this.painter.compose({ embeddings, width, height, ...(seed === undefined ? {} : { seed }) })
  }
}

const paint = new Paint()

export default defineApp({
  description: "Paints what a prompt names (OpenAI's image generations).",
  tasks: { paint },
  request: ImageGenerationRequest,
  response: ImagesResponse,
  example: { prompt: "A calm blue evening.", size: "64x64" },
  serve: async (request) => {
    const { width, height } = imageSizeOf(request.size) ?? { width: 128, height: 128 }
    const data = await Promise.all(
      Array.from({ length: request.n ?? 1 }, async (_, index) => {
        const seed = request.seed == null ? undefined : request.seed + index
        const { image } = await paint.invoke({
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
