/**
 * A multimodal chat app: an OpenAI-style chat request with an image (or an audio clip) goes to a
 * multimodal LLM whose encoder runs as its own task (encoder fission); the answer streams back as
 * chat-completion chunks. The built-in `cornserve/tiny-color-vlm` names an image's dominant colour
 * and tells a tone's pitch.
 */
import { ChatCompletionRequest, defineApp, MLLMTask } from "cornserve/app"

const mllm = new MLLMTask({
  model: "cornserve/tiny-color-vlm",
  modalities: ["image", "audio"],
  encoderFission: true
})

export default defineApp({
  description: "Names the dominant colour of an image, or the pitch of a tone.",
  tasks: { mllm },
  request: ChatCompletionRequest,
  example: {
    messages: [
      {
        role: "user",
        content: [
          { type: "text", text: "What colour is this image?" },
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
  serve: (request) => mllm.invoke(request)
})
