/**
 * Text to speech as OpenAI's speech route: post `{ "input": "...", "voice": "alloy" }` to
 * `/app/speak/v1/audio/speech` with any OpenAI client and get the audio as it is spoken, in mp3,
 * opus, aac, flac, wav or pcm (`response_format`); the first chunk leaves a fraction of a second
 * after the request, while the rest is still being generated. The built-in
 * `cornserve/tiny-speecht5` is a random-weight SpeechT5 (voices alloy, echo and nova) that speaks
 * noise shaped by the text; for real speech, name the community's `Xenova/speecht5_tts` instead
 * (its vocoder, `Xenova/speecht5_hifigan`, is fetched with it) and give each request a
 * `speaker_embedding` (the URL of a 512-value x-vector) or put voices in the model's voices/ folder.
 */
import { defineApp, SpeechRequest, SpeechSynthesisTask } from "cornserve/app"

const tts = new SpeechSynthesisTask({ model: "cornserve/tiny-speecht5" })

export default defineApp({
  description: "Speaks text (OpenAI's audio speech), streamed as it is generated.",
  tasks: { tts },
  request: SpeechRequest,
  example: { input: "Hello from Cornserve.", voice: "alloy", response_format: "wav" },
  serve: (request) => tts.invoke(request)
})
