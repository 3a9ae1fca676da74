/**
 * Speech from audio codes: post Mimi codes (one row per codebook, a code per frame at 12.5 frames
 * a second, as Moshi, Sesame CSM and Kyutai's TTS write them) to `/app/codec` and get 24 kHz
 * PCM16 chunks as they are decoded, the first after a few frames. Each chunk is decoded with the
 * frames before it as context, so the chunks join as one decoding of the whole would sound. The
 * built-in `cornserve/tiny-mimi` is a random-weight Mimi decoder (8 codebooks of 64 codes) that
 * turns codes into noise shaped by them; for real speech, name the community's
 * `onnx-community/kyutai-mimi-ONNX` and send the codes of a Mimi-speaking model (codes 0 to 2047).
 */
import { Schema } from "effect"
import { CodecDecoderTask, defineApp } from "cornserve/app"

const codec = new CodecDecoderTask({ model: "cornserve/tiny-mimi" })

const Request = Schema.Struct({
  codes: Schema.Array(Schema.Array(Schema.Int)),
  /** Frames in the first chunk: fewer, sooner audio. */
  firstChunkFrames: Schema.optional(Schema.Int.pipe(Schema.between(1, 4096)))
})

/** Two seconds of codes for the built-in model: 8 codebooks, 25 frames. */
const exampleCodes = Array.from({ length: 8 }, (_, q) => Array.from({ length: 25 }, (_, t) => (t * 5 + q * 11) % 64))

export default defineApp({
  description: "Decodes Mimi audio codes to 24 kHz audio, streamed as it decodes.",
  tasks: { codec },
  request: Request,
  example: { codes: exampleCodes },
  serve: (request) => codec.invoke(request)
})
