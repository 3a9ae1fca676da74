/**
 * Geri's `POST /codes` on a neural audio codec (Mimi): the codes are checked against the model
 * (codebooks, code range, length) and become one work item whose chunks the worker streams as it
 * decodes them (CodecDecoder.ts). The answer is the `/generate` audio stream (NDJSON lines of
 * PCM16), or one WAV file.
 */
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as Effect from "effect/Effect"
import { readFile } from "node:fs/promises"
import { type ModelDirectory, onnxPath } from "../../models/ModelDirectory.js"
import { onnxInputDims } from "../../models/onnx/Graph.js"
import type { EngineClient } from "../common/EngineClient.js"
import { BadRequest } from "../common/errors.js"
import { errorAnswer, workItemContext } from "../common/Router.js"
import type { WorkItem } from "../common/wire.js"
import { CodesRequest } from "./api.js"
import { audioLineStream, wavAnswer } from "./AudioLines.js"
import { type CodecItemMeta, type CodecPlan, defaultContextFrames, mimiSpec } from "./CodecDecoder.js"

export interface CodecModelInfo {
  readonly sampleRate: number
  readonly frameRate: number
  readonly maxQuantizers: number
  readonly minQuantizers: number
  readonly codebookSize: number
  readonly contextFrames: number
  readonly exactContextFrames: number
}

/** The longest sequence decoded in one request: 10 minutes at 12.5 frames a second. */
const maxFrames = 7500

export const codecRoutes = (context: { readonly model: ModelDirectory; readonly engine: EngineClient }) =>
  Effect.gen(function* () {
    const { model, engine } = context
    const spec = yield* Effect.try({ try: () => mimiSpec(model), catch: (error) => error as Error })
    // The codebooks the decoder graph takes, when its input fixes them (an export traced with one count).
    const fixedQuantizers = yield* Effect.tryPromise({
      try: async () => {
        const dims = onnxInputDims(await readFile(onnxPath(model, "decoder_model")), "audio_codes")
        if (dims === undefined) throw new Error(`${model.path}'s decoder_model takes no audio_codes`)
        return typeof dims[1] === "number" && dims[1] > 0 ? dims[1] : undefined
      },
      catch: (error) => error as Error
    })
    const contextFrames = defaultContextFrames(spec)

    const codesOf = (body: CodesRequest) =>
      Effect.gen(function* () {
        const quantizers = body.codes.length
        const frames = body.codes[0]!.length
        const fixed = fixedQuantizers
        if (
          fixed !== undefined
            ? quantizers !== fixed
            : quantizers < spec.minQuantizers || quantizers > spec.maxQuantizers
        )
          return yield* new BadRequest({
            message: `codes has ${quantizers} rows (codebooks); this model decodes ${fixed ?? `${spec.minQuantizers} to ${spec.maxQuantizers}`}`
          })
        if (frames > maxFrames)
          return yield* new BadRequest({
            message: `codes has ${frames} frames; at most ${maxFrames} (${maxFrames / spec.frameRate} s) are decoded a request`
          })
        // [frames, quantizers]: the rows of a work item are its frames.
        const rows = new BigInt64Array(frames * quantizers)
        for (let q = 0; q < quantizers; q++) {
          const row = body.codes[q]!
          if (row.length !== frames)
            return yield* new BadRequest({
              message: `codes row ${q} has ${row.length} frames; row 0 has ${frames}: every codebook has a code per frame`
            })
          for (let t = 0; t < frames; t++) {
            const code = row[t]!
            if (code < 0 || code >= spec.codebookSize)
              return yield* new BadRequest({
                message: `codes[${q}][${t}] is ${code}; this model's codes are 0 to ${spec.codebookSize - 1}`
              })
            rows[t * quantizers + q] = BigInt(code)
          }
        }
        return { rows, frames, quantizers }
      })

    const decode = Effect.gen(function* () {
      const body = yield* HttpServerRequest.schemaBodyJson(CodesRequest)
      const { rows, frames, quantizers } = yield* codesOf(body)
      // The first chunk is 0.4 s of audio; the next, 3.2 s, is decoded well within it; then they double up to 16 s.
      const firstChunkFrames = body.firstChunkFrames ?? 5
      const chunkFrames = body.chunkFrames ?? Math.max(40, firstChunkFrames)
      const plan: CodecPlan = {
        firstChunkFrames,
        chunkFrames,
        maxChunkFrames: Math.max(body.maxChunkFrames ?? 200, chunkFrames),
        contextFrames: body.contextFrames ?? contextFrames,
        ...(body.startFrame === undefined ? {} : { startFrame: body.startFrame })
      }
      if ((body.startFrame ?? 0) >= frames)
        return yield* new BadRequest({
          message: `startFrame ${body.startFrame} is not one of the ${frames} frames: at least one frame is decoded`
        })
      // A chunk may take up to its context's worth more frames (the tail it would leave).
      const longestWindow = Math.min(frames, 2 * plan.contextFrames + plan.maxChunkFrames)
      if (longestWindow > spec.maxWindowFrames)
        return yield* new BadRequest({
          message: `a window of contextFrames + maxChunkFrames is ${longestWindow} frames; this model's positions reach ${spec.maxWindowFrames}`
        })
      const item: WorkItem<CodecItemMeta> = {
        key: `codes:${quantizers}`,
        inputs: { audio_codes: { dtype: "int64", shape: [frames, quantizers], data: rows } },
        meta: { modality: "codes", plan } satisfies CodecItemMeta,
        ...(yield* workItemContext)
      }

      if (!body.stream) return yield* wavAnswer(engine, item, spec.sampleRate)

      return audioLineStream(engine, item, spec.sampleRate)
    }).pipe(Effect.catchAll(errorAnswer))

    const info: CodecModelInfo = {
      sampleRate: spec.sampleRate,
      frameRate: spec.frameRate,
      maxQuantizers: fixedQuantizers ?? spec.maxQuantizers,
      minQuantizers: fixedQuantizers ?? spec.minQuantizers,
      codebookSize: spec.codebookSize,
      contextFrames,
      exactContextFrames: spec.exactContextFrames
    }
    return { info, decode }
  })
