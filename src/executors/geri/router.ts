/**
 * Geri's router: `POST /generate` (or `POST /speech` on a text-to-speech model, Speech.ts;
 * `POST /codes` on a neural audio codec, Codes.ts; on a Janus-Pro model, `/generate` decodes image
 * tokens, JanusImages.ts). It waits (bounded) for every chunk of the named prompt
 * embeddings in the sidecar, takes them out, and hands one work item to the engine; requests with
 * equal generation parameters are batched together.
 */
import { randomInt } from "node:crypto"
import * as HttpRouter from "@effect/platform/HttpRouter"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as Effect from "effect/Effect"
import { isJanus } from "../../models/JanusModel.js"
import { loadModelDirectory } from "../../models/ModelDirectory.js"
import { SidecarClient } from "../../sidecar/SidecarClient.js"
import { Tensor } from "../../sidecar/Tensor.js"
import { BadRequest } from "../common/errors.js"
import { receiveRows } from "../common/SidecarRows.js"
import { mediaSourceOptionsOf } from "../common/media/MediaSource.js"
import { errorAnswer, RequestSpan, type RouterKind, workItemContext } from "../common/Router.js"
import { inSpan } from "../../tracing/Tracing.js"
import { wavFile } from "../common/media/Wav.js"
import type { WorkItem } from "../common/wire.js"
import { GenerateRequest, type ImageAnswer } from "./api.js"
import { audioLineStream } from "./AudioLines.js"
import { janusImageRoutes } from "./JanusImages.js"
import { speechRoutes } from "./Speech.js"
import { isSpeechT5 } from "./SpeechSynthesizer.js"
import { codecRoutes } from "./Codes.js"
import { isMimi } from "./CodecDecoder.js"
import type { GeriAudioPiece, GeriImageResult, GeriItemMeta } from "./worker.js"

export { wavFile }

/**
 * The model's chunks of samples, regrouped into `total` samples in chunks of `size`: each full
 * chunk goes to `emit` as soon as the samples for it have come.
 */
export class Rechunker {
  private readonly pending: Int16Array
  private filled = 0
  private sent = 0

  constructor(
    private readonly size: number,
    private readonly total: number,
    private readonly emit: (chunk: number, pcm: Int16Array) => void
  ) {
    this.pending = new Int16Array(size)
  }

  push(pcm: Int16Array) {
    let at = 0
    while (at < pcm.length && this.sent * this.size < this.total) {
      const take = Math.min(pcm.length - at, this.size - this.filled)
      this.pending.set(pcm.subarray(at, at + take), this.filled)
      this.filled += take
      at += take
      if (this.filled === this.size) {
        this.emit(this.sent++, this.pending.slice())
        this.filled = 0
      }
    }
  }
}

export const routerKind: RouterKind = {
  make: ({ config, engine }) =>
    Effect.gen(function* () {
      const model = yield* Effect.tryPromise({
        try: () => loadModelDirectory(config.modelDir),
        catch: (error) => error as Error
      })
      if (isSpeechT5(model)) {
        const { resolveModel } = yield* Effect.promise(() => import("../../models/ModelStore.js"))
        const speech = yield* speechRoutes({
          model,
          engine,
          media: mediaSourceOptionsOf(config),
          resolveVocoder: (id) => resolveModel(id)
        })
        return {
          info: { modality: "speech", ...speech.info },
          routes: HttpRouter.empty.pipe(HttpRouter.post("/speech", speech.speak))
        }
      }
      if (isJanus(model)) return yield* janusImageRoutes(config, engine, model)
      if (isMimi(model)) {
        const codec = yield* codecRoutes({ model, engine })
        return {
          info: { modality: "codes", ...codec.info },
          routes: HttpRouter.empty.pipe(HttpRouter.post("/codes", codec.decode))
        }
      }
      const generator = model.config.generator
      if (generator === undefined)
        return yield* Effect.fail(
          new Error(`${config.model} is not a generator (config.json has no generator section)`)
        )
      if (config.sidecarSocket === undefined)
        return yield* Effect.fail(
          new Error("Geri takes its prompt embeddings from a sidecar: give it --sidecar-socket")
        )
      const sidecar = yield* Effect.acquireRelease(
        Effect.tryPromise({
          try: () => SidecarClient.connect(config.sidecarSocket!),
          catch: (error) => error as Error
        }),
        (client) => Effect.promise(() => client.close())
      )

      /** Every chunk of each id, in order, as one [rows, hidden] float32 tensor; the chunks are then released. */
      const takeEmbeddings = async (ids: ReadonlyArray<string>, skip: number): Promise<Tensor<"float32">> => {
        const parts: Array<Float32Array> = []
        let hidden: number | undefined
        for (const id of ids) {
          const { rows, width } = await receiveRows(sidecar, id, config.embeddingWaitMs, "embedding", hidden)
          hidden = width
          parts.push(rows)
        }
        const joined = new Float32Array(parts.reduce((sum, part) => sum + part.length, 0))
        let at = 0
        for (const part of parts) {
          joined.set(part, at)
          at += part.length
        }
        const count = !hidden ? 0 : joined.length / hidden
        if (count <= skip)
          throw new BadRequest({ message: `the embeddings have ${count} rows, not more than skipTokens (${skip})` })
        return new Tensor("float32", [count - skip, hidden!], joined.subarray(skip * hidden!))
      }

      /** The engine's results for one item, cancelled with the request. */
      const run = (item: WorkItem, onPiece?: (piece: GeriAudioPiece) => void) =>
        engine.run<unknown, GeriAudioPiece>([item], onPiece && ((_, piece) => onPiece(piece)))

      const generate = Effect.gen(function* () {
        const body = yield* HttpServerRequest.schemaBodyJson(GenerateRequest)
        const ids = typeof body.embeddings === "string" ? [body.embeddings] : body.embeddings
        const span = yield* RequestSpan
        const traced = yield* workItemContext
        const embeddings = yield* Effect.tryPromise({
          try: () => inSpan("receive embeddings", { parent: span }, () => takeEmbeddings(ids, body.skipTokens)),
          catch: (error) => error
        })
        const seed = body.seed ?? randomInt(2 ** 31)
        const inputs = { inputs_embeds: { dtype: "float32", shape: embeddings.shape, data: embeddings.data } } as const

        if (generator.modality === "image") {
          const meta: GeriItemMeta = {
            width: body.width ?? generator.width,
            height: body.height ?? generator.height,
            chunks: 0,
            seed
          }
          const [result] = (yield* run({ key: `${meta.width}x${meta.height}`, inputs, meta, ...traced })) as [
            GeriImageResult
          ]
          const answer: ImageAnswer = {
            image: Buffer.from(result.png).toString("base64"),
            width: result.width,
            height: result.height,
            mimeType: "image/png"
          }
          return HttpServerResponse.unsafeJson(answer)
        }

        const sampleRate = generator.sample_rate
        const chunkSize = body.chunkSize ?? generator.chunk_size
        const chunks = body.chunks ?? generator.default_num_chunks
        const total = chunks * chunkSize
        const meta: GeriItemMeta = { width: 0, height: 0, chunks: Math.ceil(total / generator.chunk_size), seed }
        const item: WorkItem<GeriItemMeta> = { key: `audio:${meta.chunks}`, inputs, meta, ...traced }

        if (!body.stream) {
          const pieces: Array<Int16Array> = []
          const rechunker = new Rechunker(chunkSize, total, (_, pcm) => pieces.push(pcm))
          yield* run(item, (piece) => rechunker.push(piece.pcm))
          return HttpServerResponse.uint8Array(wavFile(pieces, sampleRate), { contentType: "audio/wav" })
        }

        return audioLineStream(engine, item, sampleRate, (send) => {
          const rechunker = new Rechunker(chunkSize, total, (_, pcm) => send(pcm))
          return (pcm) => rechunker.push(pcm)
        })
      }).pipe(Effect.catchAll(errorAnswer))

      return {
        info: { modality: generator.modality, generator, sidecarNode: sidecar.nodeId },
        routes: HttpRouter.empty.pipe(HttpRouter.post("/generate", generate))
      }
    })
}
