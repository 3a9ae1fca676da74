/**
 * Listens to a clip and answers a question about it: the clip is transcribed by a speech recognizer
 * (Whisper, on Eric), then an LLM reads the transcript and answers, two task calls in one request.
 * The built-in models are random-weight toys (`cornserve/tiny-whisper`, and the LLM of
 * `cornserve/tiny-color-vlm`, shared with color_chat); for real use, name community exports such
 * as `onnx-community/whisper-base` and `onnx-community/Qwen2.5-0.5B-Instruct`.
 */
import { Schema } from "effect"
import { defineApp, LLMTask, SpeechRecognitionTask } from "cornserve/app"

const whisper = new SpeechRecognitionTask({ model: "cornserve/tiny-whisper" })
const llm = new LLMTask({ model: "cornserve/tiny-color-vlm" })

const Request = Schema.Struct({
  /** The clip: a data: URL (wav, mp3, ogg, flac, m4a, webm) or an http(s) URL. */
  audio: Schema.String.pipe(Schema.minLength(1)),
  question: Schema.String.pipe(Schema.minLength(1), Schema.maxLength(2000))
})

const Response = Schema.Struct({ transcript: Schema.String, answer: Schema.String })

export default defineApp({
  description: "Transcribes a clip and answers a question about it.",
  tasks: { whisper, llm },
  request: Request,
  response: Response,
  example: {
    // A fiftieth of a second of a 440 Hz tone, 8 kHz 16-bit WAV.
    audio:
      "data:audio/wav;base64,UklGRmQBAABXQVZFZm10IBAAAAABAAEAQB8AAIA+AAACABAAZGF0YUABAAAAAOEP4R1ZKAsuTC4UKQAfQRF5AYTxReNs2EHSf9E81unfYu0P/RQNjRvFJmctqy5qKiUh9RNpBFj0p+UU2vzSONH71NTduOog+joKHhkKJZUs2i6VKykjlRZVBzf3JOji2+XTINHl0+LbJOg391UHlRYpI5Ur2i6VLAolHhk6CiD6uOrU3fvUONH80hTap+VY9GkE9RMlIWoqqy5nLcUmjRsUDQ/9Yu3p3zzWf9FB0mzYReOE8XkBQREAHxQpTC4LLlko4R3hDwAAH/Af4qfX9dG00ezWAOG/7of+fA67HJQnvy2BLsQpFyCeEvEC7PJz5DvZmdJV0ZbV294L7Jf7qAtZGuwlBC3ILgUrLCJIFeAFxvXi5vbaa9Mm0WvU19xr6av4yQjcFx4kGyzgLhssHiTcF8kIq/hr6dfca9Qm0Q==",
    question: "What is said?"
  },
  serve: async ({ audio, question }) => {
    const { text } = await whisper.invoke({ file: audio })
    let answer = ""
    const stream = await llm.invoke({
      messages: [{ role: "user", content: `Transcript: ${text.trim()}\n\nQuestion: ${question}` }],
      max_tokens: 16
    })
    for await (const chunk of stream) answer += chunk.choices[0]?.delta.content ?? ""
    return { transcript: text.trim(), answer: answer.trim() }
  }
})
