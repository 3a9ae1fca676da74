/**
 * Geri's router: `POST /generate`. It waits (bounded) for every chunk of the named prompt
 * embeddings in the sidecar, takes them out, and hands one work item to the engine; requests with
 * equal generation parameters are batched together.
 */
import { HttpRouter, HttpServerRequest, HttpServerResponse } from "@effect/platform"
import { Effect, Stream } from "effect"
import { loadModelDirectory } from "../../models/ModelDirectory.js"
import { type Payload, SidecarClient } from "../../sidecar/SidecarClient.js"
import { Tensor } from "../../sidecar/Tensor.js"
import { EngineFailure } from "../common/EngineClient.js"
import { errorJson, type RouterKind } from "../common/Router.js"
import type { WorkItem } from "../common/wire.js"
import { GenerateRequest } from "./api.js"
import type { GeriImageResult, GeriItemMeta } from "./worker.js"

class EmbeddingMissing extends Error {
  override readonly name = "EmbeddingMissing"
}

/** A WAV file of mono PCM16 samples. */
export const wavFile = (pcm: ReadonlyArray<Int16Array>, sampleRate: number): Buffer => {
  const samples = pcm.reduce((sum, chunk) => sum + chunk.length, 0)
  const header = Buffer.alloc(44)
  header.write("RIFF", 0, "ascii")
  header.writeUInt32LE(36 + samples * 2, 4)
  header.write("WAVEfmt ", 8, "ascii")
  header.writeUInt32LE(16, 16)
  header.writeUInt16LE(1, 20)
  header.writeUInt16LE(1, 22)
  header.writeUInt32LE(sampleRate, 24)
  header.writeUInt32LE(sampleRate * 2, 28)
  header.writeUInt16LE(2, 32)
  header.writeUInt16LE(16, 34)
  header.write("data", 36, "ascii")
  header.writeUInt32LE(samples * 2, 40)
  return Buffer.concat([header, ...pcm.map((chunk) => Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength))])
}

const pcmBase64 = (pcm: Int16Array) => Buffer.from(pcm.buffer, pcm.byteOffset, pcm.byteLength).toString("base64")

export const routerKind: RouterKind = {
  make: ({ config, engine }) =>
    Effect.gen(function* () {
      const model = yield* Effect.tryPromise({
        try: () => loadModelDirectory(config.modelDir),
        catch: (error) => error as Error
      })
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
        const rows: Array<Float32Array> = []
        let hidden = 0
        for (const id of ids) {
          for (let chunk = 0; ; chunk++) {
            let payload: Payload | undefined
            try {
              payload = await sidecar.recv(id, chunk, { timeoutMs: config.embeddingWaitMs })
            } catch (error) {
              if (chunk === 0)
                throw new EmbeddingMissing(`embedding ${id} did not arrive within ${config.embeddingWaitMs} ms`)
              throw error
            }
            if (payload === undefined) break
            if (!(payload instanceof Tensor) || payload.dtype !== "float32" || payload.shape.length !== 2) {
              throw new Error(`embedding ${id} chunk ${chunk} is not a float32 [rows, hidden] tensor`)
            }
            hidden = payload.shape[1]!
            rows.push((payload.data as Float32Array).slice())
            await sidecar.markDone(id, chunk)
          }
        }
        const joined = new Float32Array(rows.reduce((sum, part) => sum + part.length, 0))
        let at = 0
        for (const part of rows) {
          joined.set(part, at)
          at += part.length
        }
        const count = hidden === 0 ? 0 : joined.length / hidden
        if (count <= skip) throw new Error(`the embeddings have ${count} rows, not more than skipTokens (${skip})`)
        return new Tensor("float32", [count - skip, hidden], joined.subarray(skip * hidden))
      }

      const generate = Effect.gen(function* () {
        const body = yield* HttpServerRequest.schemaBodyJson(GenerateRequest)
        const ids = typeof body.embeddings === "string" ? [body.embeddings] : body.embeddings
        const embeddings = yield* Effect.tryPromise({
          try: () => takeEmbeddings(ids, body.skipTokens),
          catch: (error) => error as Error
        })
        const meta: GeriItemMeta =
          generator.modality === "image"
            ? { width: body.width ?? generator.width, height: body.height ?? generator.height, chunks: 0 }
            : { width: 0, height: 0, chunks: body.chunks ?? generator.default_num_chunks }
        const item: WorkItem = {
          key: `${meta.width}x${meta.height}:${meta.chunks}`,
          inputs: { inputs_embeds: { dtype: "float32", shape: embeddings.shape, data: embeddings.data } },
          meta
        }

        if (generator.modality === "image") {
          const submitted = engine.submit([item])
          const [result] = (yield* Effect.tryPromise({
            try: () => submitted.results,
            catch: (error) => error as Error
          }).pipe(
            Effect.onInterrupt(() => Effect.sync(() => engine.cancel(submitted.id)))
          )) as ReadonlyArray<GeriImageResult>
          return HttpServerResponse.unsafeJson({
            image: Buffer.from(result!.png).toString("base64"),
            width: result!.width,
            height: result!.height,
            mimeType: "image/png"
          })
        }

        const sampleRate = generator.sample_rate
        if (!body.stream) {
          const pieces: Array<Int16Array> = []
          const submitted = engine.submit(
            [item],
            (_, value) => (pieces[(value as { chunk: number }).chunk] = (value as { pcm: Int16Array }).pcm)
          )
          yield* Effect.tryPromise({ try: () => submitted.results, catch: (error) => error as Error }).pipe(
            Effect.onInterrupt(() => Effect.sync(() => engine.cancel(submitted.id)))
          )
          return HttpServerResponse.uint8Array(wavFile(pieces, sampleRate), { contentType: "audio/wav" })
        }

        const lines = Stream.async<Uint8Array>((emit) => {
          const submitted = engine.submit([item], (_, value) => {
            const { chunk, pcm } = value as { chunk: number; pcm: Int16Array }
            void emit.single(Buffer.from(`${JSON.stringify({ chunk, audio: pcmBase64(pcm), sampleRate })}\n`))
          })
          submitted.results.then(
            () => {
              void emit.single(Buffer.from(`${JSON.stringify({ done: true, chunks: meta.chunks, sampleRate })}\n`))
              void emit.end()
            },
            (error: Error) => {
              void emit.single(
                Buffer.from(`${JSON.stringify({ error: { code: "ExecutorFailed", message: error.message } })}\n`)
              )
              void emit.end()
            }
          )
          return Effect.sync(() => engine.cancel(submitted.id))
        })
        return HttpServerResponse.stream(lines, { contentType: "application/x-ndjson" })
      }).pipe(
        Effect.catchAll((error) => {
          if (error instanceof EmbeddingMissing)
            return Effect.succeed(errorJson(404, "EmbeddingNotFound", error.message))
          if (error instanceof EngineFailure)
            return Effect.succeed(errorJson(error.status, "ExecutorFailed", error.message))
          if ("_tag" in error && (error._tag === "ParseError" || error._tag === "RequestError")) {
            return Effect.succeed(errorJson(400, "BadRequest", error.message))
          }
          return Effect.succeed(errorJson(400, "BadRequest", error.message))
        })
      )

      return {
        info: { modality: generator.modality, generator, sidecarNode: sidecar.nodeId },
        routes: HttpRouter.empty.pipe(HttpRouter.post("/generate", generate))
      }
    })
}
