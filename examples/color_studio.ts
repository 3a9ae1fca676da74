/**
 * A studio that sees, names and makes colours: a chat request with an image (or a tone) goes to a
 * multimodal LLM, which names the colour it sees (or the pitch it hears); then the same LLM
 * deployment embeds a prompt for a generator, which paints a picture in that colour (a PNG) or,
 * with "output": "audio", plays a tone of it, streamed chunk by chunk.
 *
 * Unit tasks: the encoders and the LLM are shared with examples/color_chat.ts (equal tasks are
 * deployed once); the painter and the tone generator are Geri.
 */
import { Schema } from "effect"
import {
  AudioGeneratorTask,
  ChatCompletionRequest,
  CompositeTask,
  defineApp,
  ImageGeneratorTask,
  type ImageGeneratorOutput,
  LLMEmbeddingTask,
  MLLMTask,
  type AudioChunk,
  type TaskStream
} from "cornserve/app"

const vlm = "cornserve/tiny-color-vlm"
const mllm = new MLLMTask({ model: vlm, modalities: ["image", "audio"], encoderFission: true })
/** The same config as the MLLM's LLM: one deployment serves the chat and the prompt embeddings. */
const promptEmbeddings = new LLMEmbeddingTask({ model: vlm, receiveEmbeddings: true })

const promptFor = (colour: string) => ({ messages: [{ role: "user", content: `Make something ${colour}.` }] as const })

/** Prompt embeddings from the LLM, straight into the painter. */
class Paint extends CompositeTask<{ readonly colour: string }, ImageGeneratorOutput> {
  readonly name = "paint"
  private readonly embed = this.use(promptEmbeddings)
  private readonly painter = this.use(new ImageGeneratorTask({ model: "cornserve/tiny-color-painter" }))

  compose({ colour }: { readonly colour: string }) {
    const { embeddings } = this.embed.compose(promptFor(colour))
    return this.painter.compose({ embeddings, height: 128, width: 128 })
  }
}

/** Prompt embeddings from the LLM, into the tone generator; the tone streams. */
class Sing extends CompositeTask<{ readonly colour: string }, TaskStream<AudioChunk>> {
  readonly name = "sing"
  private readonly embed = this.use(promptEmbeddings)
  private readonly tones = this.use(new AudioGeneratorTask({ model: "cornserve/tiny-color-tones" }))

  compose({ colour }: { readonly colour: string }) {
    const { embeddings } = this.embed.compose(promptFor(colour))
    return this.tones.compose({ embeddings })
  }
}

const paint = new Paint()
const sing = new Sing()

const Request = Schema.extend(
  ChatCompletionRequest,
  Schema.Struct({ output: Schema.optionalWith(Schema.Literal("image", "audio"), { default: () => "image" as const }) })
)

/** What the MLLM says, whole. */
const answerOf = async (request: typeof ChatCompletionRequest.Type): Promise<string> => {
  let text = ""
  for await (const chunk of await mllm.invoke(request)) text += chunk.choices[0]?.delta.content ?? ""
  return text.trim()
}

export default defineApp({
  description: "Names the colour of an image and paints it (or plays it as a tone).",
  tasks: { mllm, paint, sing },
  request: Request,
  example: {
    messages: [
      {
        role: "user",
        content: [
          { type: "text", text: "What colour is this? Paint it." },
          {
            type: "image_url",
            image_url: {
              url: "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
            }
          }
        ]
      }
    ],
    max_tokens: 8
  },
  serve: async ({ output, ...chat }) => {
    const colour = await answerOf(chat)
    if (output === "image") {
      const { image } = await paint.invoke({ colour })
      return { colour, image, mimeType: "image/png" }
    }
    const tone = await sing.invoke({ colour })
    return (async function* () {
      yield { colour }
      for await (const chunk of tone) yield { audio: chunk.audio, sampleRate: chunk.sampleRate }
    })()
  }
})
