import * as Schema from "effect/Schema"
import { type Transcription, TranscriptionRequest, windowingProblems } from "../schemas/Transcriptions.js"
import { BatchSettings } from "./EngineSettings.js"
import { modelShortName, ScalingBounds, UnitTask } from "./Task.js"

export const SpeechRecognitionConfig = Schema.Struct({
  model: Schema.NonEmptyTrimmedString,
  /** Windows (30 s of audio each, from one request or several) the executor decodes in one batch. */
  maxBatchSize: Schema.optionalWith(Schema.Int.pipe(Schema.between(1, 4096)), { default: () => 8 }),
  ...BatchSettings,
  ...ScalingBounds
})
export type SpeechRecognitionConfig = typeof SpeechRecognitionConfig.Encoded

interface RequestProblem {
  readonly path: ReadonlyArray<string>
  readonly message: string
}

const requestProblems = (request: TranscriptionRequest): Array<RequestProblem> => {
  const problems: Array<RequestProblem> = []
  if (request.file.length === 0) problems.push({ path: ["file"], message: "is empty" })
  if (request.temperature != null && request.temperature !== 0) {
    problems.push({ path: ["temperature"], message: "only 0 (greedy decoding) is implemented" })
  }
  if (request.timestamp_granularities?.includes("word")) {
    problems.push({
      path: ["timestamp_granularities"],
      message: "word timestamps are not implemented; ask for segment"
    })
  }
  for (const problem of windowingProblems(request)) problems.push({ path: [problem.field], message: problem.message })
  return problems
}

/** A transcription request the task can run; a refusal is the request's fault, answered 400. */
export const SpeechRecognitionInput = TranscriptionRequest.pipe(
  Schema.filter((request) => {
    const problems = requestProblems(request)
    return problems.length === 0 ? true : problems
  })
)
export type SpeechRecognitionInput = typeof SpeechRecognitionInput.Type

/** Whether a request's answer carries segments: it asked for them, or for a format written from them. */
export const wantsSegments = (request: TranscriptionRequest): boolean =>
  request.timestamp_granularities?.includes("segment") === true ||
  request.response_format === "verbose_json" ||
  request.response_format === "srt" ||
  request.response_format === "vtt"

/**
 * Speech recognition with a Whisper model on Eric (the community's encoder_model and
 * decoder_model_merged), as transformers.js's ASR pipeline does it: greedy, with language and task
 * tokens, segment timestamps, and long audio cut in overlapping windows whose texts are stitched.
 * Windows of one request, and of requests arriving together, are decoded as one batch.
 */
export class SpeechRecognitionTask extends UnitTask<
  SpeechRecognitionInput,
  Transcription,
  typeof SpeechRecognitionConfig.Type
> {
  readonly operation = "transcribe"
  readonly name: string
  protected readonly inputSchema = SpeechRecognitionInput

  constructor(config: SpeechRecognitionConfig) {
    super("speech-recognizer", SpeechRecognitionConfig, config)
    this.name = `speech-recognizer-${modelShortName(this.config.model)}`
  }

  protected makeRecordOutput(input: SpeechRecognitionInput): Transcription {
    return { task: input.task ?? "transcribe", language: input.language ?? "en", duration: 0, text: "" }
  }

  /** Text only, no forwarded data: the answer is used as it arrives. */
  protected override reviveOutput(output: unknown): Transcription {
    return output as Transcription
  }
}
