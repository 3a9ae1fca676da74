/**
 * A model that answers in text and speech, as OpenAI's chat answers audio: post a chat with
 * `"modalities": ["text", "audio"]` and `"audio": { "voice": "alloy", "format": "wav" }` to
 * `/app/omni/v1/chat/completions`. A thinker (the LLM) answers the question, an image's or a
 * tone's; its hidden states stream through the sidecar to a talker, an LLM that writes a neural
 * audio codec's frames from them, a frame (all 8 codebooks) a step, starting from the prompt's and
 * taking each word's as the thinker says it; the frames are decoded to 24 kHz audio by the codec
 * on Geri piece by piece as the talker writes them. Streamed (`"stream": true`), the text comes
 * as `delta.audio.transcript` pieces as the thinker says them, among the audio's `delta.audio.data`
 * chunks (PCM16, base64); whole, the answer's `message.audio` holds the file and its transcript.
 * Without "audio" in `modalities` the thinker's text streams as a chat's.
 *
 * The built-in models: `cornserve/tiny-color-vlm` thinks (it names an image's colour), the
 * random-weight `cornserve/tiny-talker` writes `cornserve/tiny-mimi`'s codes from its hidden
 * states, and tiny-mimi plays them: noise shaped by the answer, 3.2 s of it. The voice is taken
 * and not used: the tiny talker has one.
 */
import { randomUUID } from "node:crypto"
import {
  type AudioChunk,
  type ChatCompletionChunk,
  ChatCompletionRequest,
  CodecDecoderTask,
  CompositeTask,
  defineApp,
  type LLMEmbeddingOutput,
  LLMEmbeddingTask,
  LLMTask,
  type TalkerOutput,
  TalkerTask,
  type TalkerTextDone,
  type TaskStream
} from "cornserve/app"

const thinkerModel = "cornserve/tiny-color-vlm"
/** Frames of codes before a piece that the codec decodes with it: Mimi's default context (2 s). */
const contextFrames = 25
/** The first piece of speech is 5 frames (0.4 s), then each twice the last, up to 40. */
const firstPieceFrames = 5
const maxPieceFrames = 40

type ChatRequest = typeof ChatCompletionRequest.Type

interface Spoken {
  /** The prompt's hidden states: a row a prompt token. */
  readonly shape: LLMEmbeddingOutput["shape"]
  /** The talker's frames, with the thinker's text among them as it comes. */
  readonly frames: TaskStream<TalkerOutput>
}

/**
 * The thinker answers, streaming its hidden states (the prompt's, then each token's) and its text;
 * the talker writes codec frames from them as they come, and passes the text on.
 */
class ThinkAndTalk extends CompositeTask<ChatRequest, Spoken> {
  readonly name = "think_and_talk"
  private readonly thinker = this.use(
    new LLMEmbeddingTask({ model: thinkerModel, source: "hidden_states", generate: "stream" })
  )
  private readonly talker = this.use(new TalkerTask({ model: "cornserve/tiny-talker" }))

  compose(request: ChatRequest): Spoken {
    const { embeddings, transcript, shape } = this.thinker.compose({
      messages: request.messages,
      ...(request.max_tokens == null ? {} : { max_tokens: request.max_tokens }),
      ...(request.max_completion_tokens == null ? {} : { max_completion_tokens: request.max_completion_tokens }),
      ...(request.temperature == null ? {} : { temperature: request.temperature }),
      ...(request.seed == null ? {} : { seed: request.seed })
    })
    const frames = this.talker.compose({
      embeddings,
      trailing: true,
      ...(transcript === undefined ? {} : { transcript }),
      ...(request.seed == null ? {} : { seed: request.seed })
    })
    return { shape, frames }
  }
}

const speaker = new ThinkAndTalk()
const thinker = new LLMTask({ model: thinkerModel })
const codec = new CodecDecoderTask({ model: "cornserve/tiny-mimi" })

/** Frames `from` … `to` of the talker's so far decoded to audio, with the frames before them as context. */
async function* decoded(frames: ReadonlyArray<ReadonlyArray<number>>, from: number, to: number) {
  const start = Math.max(0, from - contextFrames)
  const window = frames.slice(start, to)
  // The codec takes a row per codebook, a code per frame.
  const codes = window[0]!.map((_, q) => window.map((frame) => frame[q]!))
  const audio = await codec.invoke({ codes, startFrame: from - start, firstChunkFrames: to - from })
  for await (const chunk of audio as AsyncIterable<AudioChunk>) yield chunk.audio
}

export default defineApp({
  description: "Answers a question about an image or a tone in text and speech (OpenAI's chat with audio).",
  tasks: { speaker, thinker, codec },
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
    modalities: ["text", "audio"],
    audio: { voice: "alloy", format: "wav" },
    max_tokens: 8
  },
  async *serve(request) {
    if (request.modalities?.includes("audio") !== true) {
      yield* await thinker.invoke(request)
      return
    }
    const { shape, frames } = await speaker.invoke(request)
    const id = `chatcmpl-${randomUUID()}`
    const created = Math.floor(Date.now() / 1000)
    const chunk = (
      delta: ChatCompletionChunk["choices"][number]["delta"],
      finish: ChatCompletionChunk["choices"][number]["finish_reason"] = null
    ): ChatCompletionChunk => ({
      id,
      object: "chat.completion.chunk",
      created,
      model: thinkerModel,
      choices: [{ index: 0, delta, finish_reason: finish }]
    })
    yield chunk({ role: "assistant", audio: { id: `audio-${randomUUID()}`, transcript: "" } })
    const said: Array<ReadonlyArray<number>> = []
    let spoken = 0
    let piece = firstPieceFrames
    let text: TalkerTextDone["textDone"] | undefined
    for await (const item of frames) {
      if ("text" in item) {
        yield chunk({ audio: { transcript: item.text } })
        continue
      }
      if ("textDone" in item) {
        text = item.textDone
        continue
      }
      said.push(item.frame)
      if (said.length - spoken < piece) continue
      for await (const data of decoded(said, spoken, said.length)) yield chunk({ audio: { data } })
      spoken = said.length
      piece = Math.min(2 * piece, maxPieceFrames)
    }
    if (spoken < said.length)
      for await (const data of decoded(said, spoken, said.length)) yield chunk({ audio: { data } })
    yield chunk({}, text?.finishReason === "length" ? "length" : "stop")
    if (request.stream_options?.include_usage === true && shape !== undefined) {
      const completionTokens = text?.completionTokens ?? 0
      yield {
        id,
        object: "chat.completion.chunk",
        created,
        model: thinkerModel,
        choices: [],
        usage: {
          prompt_tokens: shape[0],
          completion_tokens: completionTokens,
          total_tokens: shape[0] + completionTokens
        }
      } satisfies ChatCompletionChunk
    }
  }
})
