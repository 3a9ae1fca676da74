import * as Schema from "effect/Schema"
import { DataForward } from "./DataForward.js"
import { LLMConfig } from "./LLMTask.js"
import { modelShortName, UnitTask } from "./Task.js"
import { TaskStream } from "./TaskStream.js"

export const TalkerInput = Schema.Struct({
  /** A thinker's hidden states, float32 [rows, hidden]: an LLMEmbeddingTask's with source "hidden_states". */
  embeddings: Schema.instanceOf(DataForward),
  /** Frames at most (the model's default when left out); a frame is 80 ms of Mimi's audio. */
  maxFrames: Schema.optional(Schema.Int.pipe(Schema.between(1, 7500))),
  /** 0 (the default): each frame's first code is the most likely; above 0, drawn with `seed`. */
  temperature: Schema.optional(Schema.Number.pipe(Schema.between(0, 2))),
  topP: Schema.optional(Schema.Number.pipe(Schema.between(0, 1))),
  seed: Schema.optional(Schema.Int),
  /**
   * The thinker streams its answer (an LLMEmbeddingTask with generate "stream"): the talker starts
   * from the prompt's hidden states and adds the answer's, a row a frame, as they come.
   */
  trailing: Schema.optional(Schema.Boolean),
  /**
   * The thinker's text as it is said (that task's `transcript`): streamed on among the frames as
   * `{ text }` items, then `{ textDone }`.
   */
  transcript: Schema.optional(Schema.instanceOf(DataForward))
})
export type TalkerInput = typeof TalkerInput.Type

/** One frame of codec codes, a code per codebook (the semantic one first), as a codec decoder takes a column of its `codes`. */
export interface TalkerFrame {
  readonly frame: ReadonlyArray<number>
}

/** A piece of the thinker's text, passed on as the talker read it (with a `transcript`). */
export interface TalkerText {
  readonly text: string
}

/** The thinker's text ended (after its last piece): how, and how many tokens it said. */
export interface TalkerTextDone {
  readonly textDone: { readonly finishReason: "stop" | "length" | "tool_calls"; readonly completionTokens: number }
}

export type TalkerOutput = TalkerFrame | TalkerText | TalkerTextDone

/**
 * A talker on the LLM executor: an LLM that reads a thinker's hidden states (through the sidecar)
 * and writes a neural audio codec's frames, all codebooks of a frame per step, streamed as they
 * are chosen, for a CodecDecoderTask to turn into audio; with a `transcript`, the thinker's text
 * streams among them as it comes. The built-in `cornserve/tiny-talker`
 * reads `cornserve/tiny-color-vlm`'s hidden states and writes `cornserve/tiny-mimi`'s codes.
 */
export class TalkerTask extends UnitTask<TalkerInput, TaskStream<TalkerOutput>, typeof LLMConfig.Type> {
  readonly operation = "talk"
  readonly name: string
  protected readonly inputSchema = TalkerInput

  constructor(config: LLMConfig) {
    super("llm", LLMConfig, config)
    this.name = `talker-${modelShortName(this.config.model)}`
  }

  protected makeRecordOutput(): TaskStream<TalkerOutput> {
    return TaskStream.placeholder()
  }
}
