/**
 * Geri's streamed audio answer: NDJSON lines `{ chunk, audio: <PCM16 LE, base64>, sampleRate }`,
 * then `{ done: true, chunks, sampleRate }`, or an `{ error }` line when the work fails midway.
 */
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as Effect from "effect/Effect"
import type { EngineClient } from "../common/EngineClient.js"
import type { WorkItem } from "../common/wire.js"
import { wavFile } from "../common/media/Wav.js"
import { ndjsonAnswer } from "../common/NdjsonAnswer.js"
import type { AudioChunkLine, AudioDoneLine } from "./api.js"
import type { GeriAudioPiece } from "./worker.js"

const pcmBase64 = (pcm: Int16Array) => Buffer.from(pcm.buffer, pcm.byteOffset, pcm.byteLength).toString("base64")

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
) =>
  ndjsonAnswer<unknown, GeriAudioPiece>(engine, item, (send) => {
    let chunks = 0
    const push = regroup((pcm) => send({ chunk: chunks++, audio: pcmBase64(pcm), sampleRate } satisfies AudioChunkLine))
    return {
      partial: (value) => push(value.pcm),
      done: (): AudioDoneLine => ({ done: true, chunks, sampleRate })
    }
  })

/** One audio work item's answer as one WAV file, once all of it is made; cancelled when the request is. */
export const wavAnswer = (engine: EngineClient, item: WorkItem, sampleRate: number) =>
  Effect.gen(function* () {
    const pieces: Array<Int16Array> = []
    yield* engine.runOne<unknown, GeriAudioPiece>(item, (piece) => pieces.push(piece.pcm))
    return HttpServerResponse.uint8Array(wavFile(pieces, sampleRate), { contentType: "audio/wav" })
  })
