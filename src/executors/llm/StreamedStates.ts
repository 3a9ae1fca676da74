/**
 * A generation's hidden states streamed as they are computed (prompt-embeddings' `generate` with
 * `stream`, LLMEmbeddingTask's generate "stream"): the prompt's hidden states go through the
 * sidecar first, as chunk 0 of a stream, and the answer starts with their shape; then the
 * generation runs, its worker sending each generated token's hidden state on as the next chunk
 * (StatesStream in protocol.ts) while the text's pieces go as strings on a stream of their own,
 * for a talker to read beside them. The answer's last line says what was generated; a client that
 * goes away cancels the generation.
 */
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as Effect from "effect/Effect"
import * as Stream from "effect/Stream"
import type { SidecarClient } from "../../sidecar/SidecarClient.js"
import type { EngineClient } from "../common/EngineClient.js"
import { BadRequest } from "../common/errors.js"
import { answeredFailure, errorBody } from "../common/Router.js"
import type { WorkItemContext } from "../common/wire.js"
import type { PromptEmbeddingsResponse, PromptGeneration, StatesDone, TranscriptChunk } from "./api.js"
import { Generation } from "./Generation.js"
import type { EmbedMeta, EmbedResult, PromptInput, SamplingParams } from "./protocol.js"
import type { Detokenizer } from "./TextStream.js"

export interface StreamedStatesRequest {
  readonly engine: EngineClient
  readonly tokenizer: Detokenizer
  readonly sidecar: SidecarClient | undefined
  readonly prompt: PromptInput
  readonly sampling: SamplingParams
  /** The stream's sidecar id, and the nodes that read it. */
  readonly id: string
  readonly receivers: ReadonlyArray<string>
  readonly transcript: PromptGeneration["transcript"]
  readonly itemContext: WorkItemContext
}

const piece = (chunk: TranscriptChunk): string => JSON.stringify(chunk)

export const streamedStates = ({
  engine,
  tokenizer,
  sidecar,
  prompt,
  sampling,
  id,
  receivers,
  transcript,
  itemContext
}: StreamedStatesRequest) =>
  Effect.gen(function* () {
    if (sidecar === undefined)
      return yield* new BadRequest({ message: "streamed hidden states go through the sidecar: this executor has none" })
    const meta: EmbedMeta = { op: "embed", prompt, id, source: "hidden_states", receivers, inline: false, stream: true }
    const { shape } = yield* engine.runOne<EmbedResult>({ key: meta.op, inputs: {}, meta, ...itemContext })
    const first: PromptEmbeddingsResponse = { id, source: "hidden_states", dtype: "float32", shape: shape! }
    const textTo = transcript?.receivers ?? receivers
    const lines = Stream.async<Uint8Array>((emit) => {
      const send = (line: unknown) => void emit.single(Buffer.from(`${JSON.stringify(line)}\n`))
      send(first)
      const generation = new Generation(
        engine,
        {
          op: "generate",
          prompt,
          sampling: { ...sampling, hiddenStates: true },
          states: { id, receivers, firstChunk: 1 }
        },
        tokenizer,
        [],
        [],
        itemContext
      )
      const fail = (failure: unknown) => {
        send(errorBody(Effect.runSync(answeredFailure(failure))))
        void emit.end()
      }
      // The text's pieces in order, each a chunk of the transcript's stream.
      let pieces = 0
      let said: Promise<void> = Promise.resolve()
      let closed: Promise<void> | undefined
      // Once, at the end or when the client goes: a talker reading it then sees its end.
      const closeTranscript = () => {
        closed ??=
          transcript === undefined
            ? said
            : said.then(() => sidecar.closeStream(transcript.id, { numChunks: pieces, to: textTo }))
        return closed
      }
      const tokens: Array<number> = []
      generation.subscribe({
        text: (text, ids) => {
          tokens.push(...ids)
          if (transcript === undefined) return
          const chunk = pieces++
          said = said.then(() => sidecar.send(transcript.id, piece({ text }), { to: textTo, chunk, stream: true }))
        },
        end: (outcome) => {
          tokens.push(...generation.takeUnsaid())
          if (transcript !== undefined) {
            const chunk = pieces++
            const last = { finish_reason: outcome.finishReason, completion_tokens: outcome.completionTokens }
            said = said.then(() => sidecar.send(transcript.id, piece(last), { to: textTo, chunk, stream: true }))
          }
          closeTranscript().then(() => {
            send({
              done: true,
              completion: { text: generation.text, token_ids: tokens, finish_reason: outcome.finishReason }
            } satisfies StatesDone)
            void emit.end()
          }, fail)
        },
        error: fail
      })
      return Effect.sync(() => {
        generation.cancel()
        void closeTranscript().catch(() => undefined)
      })
    })
    return HttpServerResponse.stream(lines, { contentType: "application/x-ndjson" })
  })
