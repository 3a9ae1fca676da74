/**
 * Geri's streamed audio answer: NDJSON lines `{ chunk, audio: <PCM16 LE, base64>, sampleRate }`,
 * then `{ done: true, chunks, sampleRate }`, or an `{ error }` line when the work fails midway.
 */
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as Effect from "effect/Effect"
import * as Stream from "effect/Stream"
import type { EngineClient } from "../common/EngineClient.js"
import { answeredFailure, errorBody } from "../common/Router.js"
import type { WorkItem } from "../common/wire.js"
import { wavFile } from "../common/media/Wav.js"
import type { AudioChunkLine, AudioDoneLine } from "./api.js"
import type { GeriAudioPiece } from "./worker.js"

const pcmBase64 = (pcm: Int16Array) => Buffer.from(pcm.buffer, pcm.byteOffset, pcm.byteLength).toString("base64")

const ndjson = (line: AudioChunkLine | AudioDoneLine | ReturnType<typeof errorBody>) =>
  Buffer.from(`${JSON.stringify(line)}\n`)

/**
 * The NDJSON answer of one audio work item: each piece the worker streams, through `regroup` (which
 * may hold samples back to send them in chunks of another size), becomes a chunk line as soon as
 * it is sent; then a done line counting them, or an error line if the item fails. The item is
 * cancelled when the client goes.
 */
export const audioLineStream = (
  engine: EngineClient,
  item: WorkItem,
  sampleRate: number,
  regroup: (send: (pcm: Int16Array) => void) => (pcm: Int16Array) => void = (send) => send
) => {
  const lines = Stream.async<Uint8Array>((emit) => {
    let chunks = 0
    const push = regroup((pcm) => void emit.single(ndjson({ chunk: chunks++, audio: pcmBase64(pcm), sampleRate })))
    const submitted = engine.submit<unknown, GeriAudioPiece>([item], (_, value) => push(value.pcm))
    submitted.results.then(
      () => {
        void emit.single(ndjson({ done: true, chunks, sampleRate }))
        void emit.end()
      },
      (failure: unknown) => {
        void emit.single(ndjson(errorBody(Effect.runSync(answeredFailure(failure)))))
        void emit.end()
      }
    )
    return Effect.sync(() => engine.cancel(submitted.id))
  })
  return HttpServerResponse.stream(lines, { contentType: "application/x-ndjson" })
}

/** One audio work item's answer as one WAV file, once all of it is made; cancelled when the request is. */
export const wavAnswer = (engine: EngineClient, item: WorkItem, sampleRate: number) =>
  Effect.gen(function* () {
    const pieces: Array<Int16Array> = []
    yield* engine.runOne<unknown, GeriAudioPiece>(item, (piece) => pieces.push(piece.pcm))
    return HttpServerResponse.uint8Array(wavFile(pieces, sampleRate), { contentType: "audio/wav" })
  })
