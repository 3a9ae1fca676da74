/**
 * A streamed answer of one work item as NDJSON: the lines its partial values make, sent as they
 * come, then a last line from its result, or an `{ error }` line when it fails midway. The item is
 * cancelled when the client goes.
 */
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as Effect from "effect/Effect"
import * as Stream from "effect/Stream"
import type { EngineClient } from "./EngineClient.js"
import { answeredFailure, errorBody } from "./Router.js"
import type { WorkItem } from "./wire.js"

export interface AnswerLines<Result, Partial> {
  /** A partial value: it sends what lines it makes of it (none, one, several) through `send`. */
  readonly partial: (value: Partial) => void
  /** The last line, from the item's result (when it settles, if a promise). */
  readonly done: (result: Result) => unknown
}

export const ndjsonAnswer = <Result, Partial>(
  engine: EngineClient,
  item: WorkItem,
  lines: (send: (line: unknown) => void) => AnswerLines<Result, Partial>
) => {
  const stream = Stream.async<Uint8Array>((emit) => {
    const send = (line: unknown) => void emit.single(Buffer.from(`${JSON.stringify(line)}\n`))
    const { partial, done } = lines(send)
    const submitted = engine.submit<Result, Partial>([item], (_, value) => partial(value))
    submitted.results
      .then(([result]) => done(result!))
      .then(
        (last) => {
          send(last)
          void emit.end()
        },
        (failure: unknown) => {
          send(errorBody(Effect.runSync(answeredFailure(failure))))
          void emit.end()
        }
      )
    return Effect.sync(() => engine.cancel(submitted.id))
  })
  return HttpServerResponse.stream(stream, { contentType: "application/x-ndjson" })
}
