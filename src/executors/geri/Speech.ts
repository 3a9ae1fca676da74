/**
 * Geri's `POST /speech` on a SpeechT5 model: the text is tokenized here, the voice is one the model
 * ships (voices/NAME.bin) or a speaker embedding read from a URL with the media limits, and the
 * utterance is one work item whose chunks the worker streams as it speaks (SpeechSynthesizer.ts).
 * The answer is the `/generate` audio stream (NDJSON lines of PCM16), or one WAV file.
 */
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as Effect from "effect/Effect"
import type { ModelDirectory } from "../../models/ModelDirectory.js"
import { TextTokenizer } from "../../models/TextTokenizer.js"
import type { EngineClient } from "../common/EngineClient.js"
import { BadRequest } from "../common/errors.js"
import { type MediaSourceOptions, readMedia } from "../common/media/MediaSource.js"
import { errorAnswer, workItemContext } from "../common/Router.js"
import type { WorkItem } from "../common/wire.js"
import { SynthesisRequest } from "./api.js"
import { audioLineStream, wavAnswer } from "./AudioLines.js"
import {
  type ChunkPlan,
  hifiGanSpec,
  readVoices,
  type SynthesisItemMeta,
  speechT5Spec,
  vocoderDirectory
} from "./SpeechSynthesizer.js"

/**
 * By default the first chunk is 16 frames (a quarter second at 16 kHz), sent once they and their
 * right context are written; then 128 frames, doubling up to 512 (8 s).
 */
const defaultPlan: ChunkPlan = { firstChunkFrames: 16, chunkFrames: 128, maxChunkFrames: 512 }

export interface SpeechModelInfo {
  readonly sampleRate: number
  readonly voices: ReadonlyArray<string>
  readonly speakerDim: number
}

export const speechRoutes = (context: {
  readonly model: ModelDirectory
  readonly engine: EngineClient
  readonly media: MediaSourceOptions
  readonly resolveVocoder: (id: string) => Promise<string>
}) =>
  Effect.gen(function* () {
    const { model, engine, media } = context
    const spec = speechT5Spec(model)
    const tokenizer = new TextTokenizer(model)
    const { voices, sampleRate } = yield* Effect.promise(async () => {
      const vocoder = await vocoderDirectory(model.path, context.resolveVocoder)
      const { loadModelDirectory } = await import("../../models/ModelDirectory.js")
      return {
        voices: await readVoices(model.path, spec.speakerDim),
        sampleRate: hifiGanSpec(await loadModelDirectory(vocoder)).sampleRate
      }
    })
    const voiceNames = [...voices.keys()]

    const speakerOf = (request: SynthesisRequest) =>
      Effect.gen(function* () {
        if (request.speakerEmbedding !== undefined) {
          const read = yield* Effect.tryPromise({
            try: () => readMedia(request.speakerEmbedding!, media),
            catch: (error) => error
          })
          if (read.bytes.length !== spec.speakerDim * 4)
            return yield* new BadRequest({
              message: `the speaker embedding holds ${read.bytes.length} bytes; this model's is ${spec.speakerDim} float32 values (${spec.speakerDim * 4} bytes)`
            })
          return new Float32Array(
            read.bytes.buffer.slice(read.bytes.byteOffset, read.bytes.byteOffset + read.bytes.length)
          )
        }
        const name = request.voice ?? voiceNames[0]
        if (name === undefined)
          return yield* new BadRequest({
            message: "this model ships no voices (voices/*.bin): give a speaker embedding (speaker_embedding)"
          })
        const voice = voices.get(name)
        if (voice === undefined)
          return yield* new BadRequest({
            message: `the model has no voice ${JSON.stringify(name.slice(0, 100))}; its voices are ${voiceNames.join(", ")}`
          })
        return voice
      })

    const speak = Effect.gen(function* () {
      const body = yield* HttpServerRequest.schemaBodyJson(SynthesisRequest)
      const tokens = tokenizer.encode(body.text)
      if (tokens.length > spec.maxTextPositions)
        return yield* new BadRequest({
          message: `the text is ${tokens.length} tokens; this model reads at most ${spec.maxTextPositions}`
        })
      const speaker = yield* speakerOf(body)
      const firstChunkFrames = body.firstChunkFrames ?? defaultPlan.firstChunkFrames
      const chunkFrames = body.chunkFrames ?? Math.max(defaultPlan.chunkFrames, firstChunkFrames)
      const plan: ChunkPlan = {
        firstChunkFrames,
        chunkFrames,
        maxChunkFrames: Math.max(body.maxChunkFrames ?? defaultPlan.maxChunkFrames, chunkFrames)
      }
      const item: WorkItem<SynthesisItemMeta> = {
        key: "speech",
        inputs: { speaker_embeddings: { dtype: "float32", shape: [1, spec.speakerDim], data: speaker } },
        meta: { modality: "speech", tokens, plan } satisfies SynthesisItemMeta,
        ...(yield* workItemContext)
      }

      if (!body.stream) return yield* wavAnswer(engine, item, sampleRate)

      return audioLineStream(engine, item, sampleRate)
    }).pipe(Effect.catchAll(errorAnswer))

    const info: SpeechModelInfo = { sampleRate, voices: voiceNames, speakerDim: spec.speakerDim }
    return { info, speak }
  })
