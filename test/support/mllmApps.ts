import sharp from "sharp"

/** The apps and images the multimodal model tests share. */

/** An app serving one MLLMTask on `model` for `modalities`, with encoder fission on or off, through OpenAI's chat schema. */
export const mllmAppSource = (model: string, modalities: ReadonlyArray<string>, fission: boolean) => `
import { ChatCompletionRequest, defineApp, MLLMTask } from "cornserve/app"
const mllm = new MLLMTask({ model: ${JSON.stringify(model)}, modalities: ${JSON.stringify(modalities)}, encoderFission: ${fission} })
export default defineApp({ tasks: { mllm }, request: ChatCompletionRequest, serve: (request) => mllm.invoke(request) })
`

/** An image whose every patch differs: a gradient with a pattern, as a PNG. */
export const gradientPng = (width: number, height: number): Promise<Buffer> => {
  const data = Buffer.alloc(width * height * 3)
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const at = (y * width + x) * 3
      data[at] = (x * 255) / width
      data[at + 1] = (y * 255) / height
      data[at + 2] = ((x + y) * 97) % 256
    }
  }
  return sharp(data, { raw: { width, height, channels: 3 } })
    .png()
    .toBuffer()
}
