import * as Schema from "effect/Schema"
import type { AudioChunk } from "./GeneratorTask.js"
import { BatchSettings } from "./EngineSettings.js"
import { modelShortName, ScalingBounds, UnitTask } from "./Task.js"
import { TaskStream } from "./TaskStream.js"

export const CodecDecoderConfig = Schema.Struct({
  model: Schema.NonEmptyTrimmedString,
  /** Sequences the executor decodes at once (their windows interleave). */
  maxBatchSize: Schema.optionalWith(Schema.Int.pipe(Schema.between(1, 4096)), { default: () => 8 }),
  ...BatchSettings,
  ...ScalingBounds
})
export type CodecDecoderConfig = typeof CodecDecoderConfig.Encoded

const FrameCount = Schema.Int.pipe(Schema.between(1, 4096))

export const CodecDecoderInput = Schema.Struct({
  /** One row per codebook (the semantic ones first), a code per frame; at most 7,500 frames (10 minutes at 12.5 Hz). */
  codes: Schema.Array(Schema.Array(Schema.Int).pipe(Schema.minItems(1))).pipe(Schema.minItems(1)),
  /** Frames in the first chunk (smaller: sooner audio); 5 (0.4 s) when left out. */
  firstChunkFrames: Schema.optional(FrameCount),
  /** Frames in the second chunk, doubling up to maxChunkFrames; 40 and 200 when left out. */
  chunkFrames: Schema.optional(FrameCount),
  maxChunkFrames: Schema.optional(FrameCount),
  /** Frames before each chunk decoded with it (the model's whole reach, at most 25, when left out). */
  contextFrames: Schema.optional(Schema.Int.pipe(Schema.between(0, 4096))),
  /**
   * Frames before this one are context only: no audio of theirs is answered. A stream of frames
   * decoded piece by piece sends each piece with the frames before it (up to 25, Mimi's default
   * context) and starts at the piece, so that the pieces join as one decoding of the whole.
   */
  startFrame: Schema.optional(Schema.Int.pipe(Schema.between(0, 7499)))
})
export type CodecDecoderInput = typeof CodecDecoderInput.Type

/**
 * A neural audio codec's decoder on Geri: Mimi's codes (what Moshi, Sesame CSM and Kyutai's TTS
 * write) to 24 kHz audio, streamed as PCM16 chunks as it decodes; the first chunk after the
 * decoding of a few frames. Each chunk is decoded with the frames before it as context, so that it
 * sounds as whole-sequence decoding does.
 */
export class CodecDecoderTask extends UnitTask<
  CodecDecoderInput,
  TaskStream<AudioChunk>,
  typeof CodecDecoderConfig.Type
> {
  readonly operation = "decode-codes"
  readonly name: string
  protected readonly inputSchema = CodecDecoderInput

  constructor(config: CodecDecoderConfig) {
    super("codec-decoder", CodecDecoderConfig, config)
    this.name = `codec-decoder-${modelShortName(this.config.model)}`
  }

  protected makeRecordOutput(): TaskStream<AudioChunk> {
    return TaskStream.placeholder()
  }
}
