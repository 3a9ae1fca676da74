import { Either, Schema } from "effect"
import { describe, expect, it } from "vitest"
import { issueLines, readableIssues } from "../../../src/app-runtime/SchemaIssues.js"
import {
  TranscriptionRequest,
  windowingProblems,
  windowingText
} from "../../../src/app-runtime/schemas/Transcriptions.js"
import { SpeechRecognitionInput } from "../../../src/app-runtime/tasks/SpeechRecognitionTask.js"

/**
 * The windows a transcription request may ask long audio to be cut in, as a SpeechRecognitionTask
 * and the executor check them: chunks from 1 to 30 s, strides of
 * at most 3/8 of the chunk, so that each window starts at least a quarter of a window after the
 * one before; a refusal names the field at fault.
 */

const file = "data:audio/wav;base64,AAAA"

/** The lines a client reads when `schema` refuses `request`, or [] when it takes it. */
const refusal = (schema: Schema.Schema.AnyNoContext, request: object): Array<string> => {
  const decoded = Schema.decodeUnknownEither(schema)(request, { errors: "all" })
  return Either.isLeft(decoded) ? issueLines(readableIssues(decoded.left)) : []
}

describe("windowingProblems", () => {
  it("takes the pipeline's defaults and the densest windows allowed", () => {
    expect(windowingProblems({})).toEqual([])
    expect(windowingProblems({ chunk_length_s: 30 })).toEqual([])
    expect(windowingProblems({ chunk_length_s: 30, stride_length_s: 5 })).toEqual([])
    expect(windowingProblems({ chunk_length_s: 1, stride_length_s: 0.375 })).toEqual([])
    expect(windowingProblems({ chunk_length_s: 10, stride_length_s: 3.75 })).toEqual([])
    expect(windowingProblems({ chunk_length_s: 1.3, stride_length_s: 0.4875 })).toEqual([])
    expect(windowingProblems({ chunk_length_s: null, stride_length_s: 11.25 })).toEqual([])
    expect(windowingProblems({ chunk_length_s: 4, stride_length_s: 0 })).toEqual([])
  })

  it("refuses windows that would not move on, or barely, naming both fields", () => {
    const halfway = windowingProblems({ chunk_length_s: 1, stride_length_s: 0.5 })
    expect(halfway).toHaveLength(1)
    expect(windowingText(halfway)).toBe(
      "stride_length_s: 0.5 is too long for chunk_length_s 1: each window must start at least a quarter of " +
        "chunk_length_s after the one before (chunk_length_s - 2 × stride_length_s ≥ chunk_length_s / 4), so " +
        "stride_length_s may be at most 0.375"
    )
    expect(windowingProblems({ chunk_length_s: 10, stride_length_s: 3.8 })).toMatchObject([
      { field: "stride_length_s" }
    ])
    expect(windowingText(windowingProblems({ stride_length_s: 12 }))).toMatch(
      /^stride_length_s: 12 is too long for the default chunk_length_s of 30: .* at most 11.25$/
    )
    expect(windowingText(windowingProblems({ stride_length_s: 12 }, 20))).toMatch(/default chunk_length_s of 20/)
  })

  it("refuses chunks out of 1 to 30 s and negative strides, each field for itself", () => {
    expect(windowingProblems({ chunk_length_s: 0.01, stride_length_s: -1 })).toEqual([
      { field: "chunk_length_s", message: "must be from 1 to 30 seconds, got 0.01" },
      { field: "stride_length_s", message: "must be 0 seconds or more, got -1" }
    ])
    expect(windowingProblems({ chunk_length_s: 31 })).toMatchObject([{ field: "chunk_length_s" }])
    expect(windowingProblems({ chunk_length_s: 25 }, 20)).toMatchObject([
      { message: "must be from 1 to 20 seconds, got 25" }
    ])
    expect(windowingProblems({ chunk_length_s: Number.NaN })).toMatchObject([{ field: "chunk_length_s" }])
    expect(windowingProblems({ stride_length_s: Number.POSITIVE_INFINITY })).toMatchObject([
      { field: "stride_length_s" }
    ])
  })
})

describe("a transcription request's windows", () => {
  it("are checked by SpeechRecognitionTask field by field", () => {
    expect(refusal(SpeechRecognitionInput, { file, chunk_length_s: 0.01, stride_length_s: -0.5 })).toEqual([
      "chunk_length_s: must be from 1 to 30 seconds, got 0.01",
      "stride_length_s: must be 0 seconds or more, got -0.5"
    ])
    expect(refusal(SpeechRecognitionInput, { file, chunk_length_s: 1, stride_length_s: 0.25 })).toEqual([])
    // The app's own request schema takes any number: the task is where windows are checked.
    expect(refusal(TranscriptionRequest, { file, chunk_length_s: 1, stride_length_s: 0.5 })).toEqual([])
  })

  it("are checked together by SpeechRecognitionTask, with its other refusals", () => {
    expect(refusal(SpeechRecognitionInput, { file, chunk_length_s: 1, stride_length_s: 0.5 })).toEqual([
      expect.stringMatching(/^stride_length_s: 0.5 is too long for chunk_length_s 1: .* at most 0.375$/)
    ])
    expect(refusal(SpeechRecognitionInput, { file, chunk_length_s: 2, stride_length_s: 1, temperature: 1 })).toEqual([
      "temperature: only 0 (greedy decoding) is implemented",
      expect.stringMatching(/^stride_length_s: 1 is too long for chunk_length_s 2/)
    ])
    expect(refusal(SpeechRecognitionInput, { file, chunk_length_s: 20, stride_length_s: 7 })).toEqual([])
  })
})
