import * as Schema from "effect/Schema"

/**
 * OpenAI's speech (`POST /v1/audio/speech`): the request an app takes. An app whose request is
 * `SpeechRequest` and whose `serve` answers a `SpeechSynthesisTask`'s stream of PCM16 chunks is a
 * speech app: the gateway writes the chunks, as they arrive, in the `response_format` asked for.
 */

const optionalNullable = <S extends Schema.Schema.Any>(schema: S) => Schema.optional(Schema.NullOr(schema))

/** mp3, opus, aac and flac are encoded by ffmpeg; wav is written at the model's rate; pcm is 24 kHz PCM16, as OpenAI's. */
export const SpeechFormat = Schema.Literal("mp3", "opus", "aac", "flac", "wav", "pcm")
export type SpeechFormat = typeof SpeechFormat.Type

/** The characters one request may ask to be spoken: OpenAI's limit. */
export const maxSpeechInputChars = 4096

export const SpeechRequest = Schema.Struct({
  /** The text to speak. */
  input: Schema.String.pipe(Schema.minLength(1), Schema.maxLength(maxSpeechInputChars)),
  /** The model asked for; an app answers with the model its task serves. */
  model: optionalNullable(Schema.String),
  /**
   * A voice the model ships (a speaker embedding in its `voices/` folder); the model's first voice
   * when left out. OpenAI's voice names are voices only where the model ships them.
   */
  voice: optionalNullable(Schema.String),
  /**
   * The speaker embedding to speak with instead of a named voice: an http(s) or `data:` URL of a
   * file of little-endian float32 values (SpeechT5's x-vectors: 512 of them).
   */
  speaker_embedding: optionalNullable(Schema.String),
  /** How the gateway writes the audio; the app's answer is the same whatever it is. Default mp3, as OpenAI's. */
  response_format: optionalNullable(SpeechFormat),
  /** Only 1 is implemented; another value is refused. */
  speed: optionalNullable(Schema.Number),
  /** `audio` (default): the audio file's bytes, streamed; `sse`: `speech.audio.delta` events of base64 audio. */
  stream_format: optionalNullable(Schema.Literal("audio", "sse"))
}).annotations({ identifier: "SpeechRequest" })
export type SpeechRequest = typeof SpeechRequest.Type
