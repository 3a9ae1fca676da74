/**
 * Speech recognition as OpenAI's transcriptions: upload a clip to
 * `/app/transcribe/v1/audio/transcriptions` with any OpenAI client (wav, mp3, ogg, flac, m4a or
 * webm), get its text, its segments with timestamps (`verbose_json`), or subtitles (`srt`, `vtt`).
 * Long clips are cut in 30 s windows whose texts are stitched. The built-in `cornserve/tiny-whisper`
 * is a random-weight Whisper that writes words of its small vocabulary; for real speech, name a
 * community export instead, such as `onnx-community/whisper-base`.
 */
import { defineApp, SpeechRecognitionTask, Transcription, TranscriptionRequest } from "cornserve/app"

const whisper = new SpeechRecognitionTask({ model: "cornserve/tiny-whisper" })

export default defineApp({
  description: "Transcribes speech (OpenAI's audio transcriptions).",
  tasks: { whisper },
  request: TranscriptionRequest,
  response: Transcription,
  example: {
    // A fiftieth of a second of a 440 Hz tone, 8 kHz 16-bit WAV.
    file: "data:audio/wav;base64,UklGRmQBAABXQVZFZm10IBAAAAABAAEAQB8AAIA+AAACABAAZGF0YUABAAAAAOEP4R1ZKAsuTC4UKQAfQRF5AYTxReNs2EHSf9E81unfYu0P/RQNjRvFJmctqy5qKiUh9RNpBFj0p+UU2vzSONH71NTduOog+joKHhkKJZUs2i6VKykjlRZVBzf3JOji2+XTINHl0+LbJOg391UHlRYpI5Ur2i6VLAolHhk6CiD6uOrU3fvUONH80hTap+VY9GkE9RMlIWoqqy5nLcUmjRsUDQ/9Yu3p3zzWf9FB0mzYReOE8XkBQREAHxQpTC4LLlko4R3hDwAAH/Af4qfX9dG00ezWAOG/7of+fA67HJQnvy2BLsQpFyCeEvEC7PJz5DvZmdJV0ZbV294L7Jf7qAtZGuwlBC3ILgUrLCJIFeAFxvXi5vbaa9Mm0WvU19xr6av4yQjcFx4kGyzgLhssHiTcF8kIq/hr6dfca9Qm0Q==",
    response_format: "verbose_json"
  },
  serve: (request) => whisper.invoke(request)
})
