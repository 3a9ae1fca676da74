/**
 * Geri's worker: onnx/generator.onnx on one device. Prompt embeddings of different lengths arrive
 * stacked row after row; the worker pads them into one batch with an attention mask. A generator
 * with a `noise` input (a diffusion model's starting latents) gets standard normal noise drawn from
 * each request's seed. An image model answers PNGs; an audio model streams PCM16 chunk after chunk.
 * A SpeechT5 model (text to speech) is run by SpeechSynthesizer.ts, a Janus-Pro model's image
 * decoder (image tokens to pixels) by JanusDecoder.ts, a neural audio codec (codes to audio) by
 * CodecDecoder.ts.
 */
import * as ort from "onnxruntime-node"
import { sharp } from "../../models/Sharp.js"
import { loadModelDirectory } from "../../models/ModelDirectory.js"
import { Random } from "../../models/Random.js"
import { createSession } from "../common/Sessions.js"
import { isSpeechT5, speechWorkerModel } from "./SpeechSynthesizer.js"
import { isJanus } from "../../models/JanusModel.js"
import { janusWorkerModel } from "./JanusDecoder.js"
import { codecWorkerModel, isMimi } from "./CodecDecoder.js"
import type { LoadWorkerModel, WorkerModel } from "../common/WorkerModel.js"

export interface GeriItemMeta {
  readonly width: number
  readonly height: number
  /** Audio: how many of the model's chunks to generate. */
  readonly chunks: number
  /** Draws the item's noise, for a generator that takes some. */
  readonly seed: number
}

/** One of the model's audio chunks, as the worker streams it. */
export interface GeriAudioPiece {
  readonly chunk: number
  readonly pcm: Int16Array
}

export interface GeriImageResult {
  readonly png: Uint8Array
  readonly width: number
  readonly height: number
}

export const load: LoadWorkerModel = async (context) => {
  const { config, device } = context
  const model = await loadModelDirectory(config.modelDir)
  if (isSpeechT5(model)) return speechWorkerModel(context)
  if (isJanus(model)) return janusWorkerModel(model, context)
  if (isMimi(model)) return codecWorkerModel(context)
  const generator = model.config.generator
  const path = model.onnx.get("generator")
  if (generator === undefined || path === undefined)
    throw new Error(`${config.model} is not a generator: it needs config.generator and onnx/generator.onnx`)
  const session = await createSession(path, device, config.threadsPerDevice)
  const noiseShape = noiseShapeOf(session)

  const generatorModel: WorkerModel<GeriItemMeta, GeriImageResult | { readonly chunks: number }, GeriAudioPiece> = {
    async run({ inputs, items, emit }) {
      const embeddings = inputs.inputs_embeds!
      const hidden = embeddings.shape[1]!
      const lengths = items.map((item) => item.rows[1] - item.rows[0])
      const longest = Math.max(...lengths)
      const padded = new Float32Array(items.length * longest * hidden)
      const mask = new BigInt64Array(items.length * longest)
      const source = embeddings.data as Float32Array
      items.forEach((item, index) => {
        padded.set(source.subarray(item.rows[0] * hidden, item.rows[1] * hidden), index * longest * hidden)
        mask.fill(1n, index * longest, index * longest + lengths[index]!)
      })
      const feeds: Record<string, ort.Tensor> = {
        inputs_embeds: new ort.Tensor("float32", padded, [items.length, longest, hidden]),
        attention_mask: new ort.Tensor("int64", mask, [items.length, longest])
      }
      if (noiseShape !== undefined) {
        const size = noiseShape.reduce((product, dim) => product * dim, 1)
        const noise = new Float32Array(items.length * size)
        items.forEach((item, index) => noise.set(new Random(item.meta.seed).normals(size, 1), index * size))
        feeds.noise = new ort.Tensor("float32", noise, [items.length, ...noiseShape])
      }

      if (generator.modality === "image") {
        const output = (await session.run(feeds))[session.outputNames[0]!]!
        const [, , height, width] = output.dims as [number, number, number, number]
        const pixels = output.data as Float32Array
        const plane = height * width
        return Promise.all(
          items.map(async (item, index): Promise<GeriImageResult> => {
            const meta = item.meta
            const rgb = Buffer.alloc(plane * 3)
            for (let c = 0; c < 3; c++) {
              for (let i = 0; i < plane; i++)
                rgb[i * 3 + c] = Math.round(Math.min(1, Math.max(0, pixels[(index * 3 + c) * plane + i]!)) * 255)
            }
            const png = await sharp(rgb, { raw: { width, height, channels: 3 } })
              .resize(meta.width, meta.height, { fit: "fill" })
              .png()
              .toBuffer()
            return {
              png: new Uint8Array(png.buffer, png.byteOffset, png.length),
              width: meta.width,
              height: meta.height
            }
          })
        )
      }

      const chunks = items.map((item) => item.meta.chunks)
      for (let chunk = 0; chunk < Math.max(...chunks); chunk++) {
        const index = new BigInt64Array(items.length).fill(BigInt(chunk))
        const output = (await session.run({ ...feeds, chunk_index: new ort.Tensor("int64", index, [items.length]) }))[
          session.outputNames[0]!
        ]!
        const size = output.dims[1]!
        const pcm = output.data as Int16Array
        items.forEach((_, item) => {
          if (chunk < chunks[item]!) emit(item, { chunk, pcm: pcm.slice(item * size, (item + 1) * size) })
        })
      }
      return chunks.map((count) => ({ chunks: count }))
    },
    async close() {
      await session.release()
    }
  }
  return generatorModel
}

/** The per-item shape of the generator's `noise` input (after the batch dimension), if it has one. */
const noiseShapeOf = (session: ort.InferenceSession): ReadonlyArray<number> | undefined => {
  const input = session.inputMetadata.find((metadata) => metadata.name === "noise")
  if (input === undefined) return undefined
  if (!input.isTensor || input.type !== "float32")
    throw new Error("the generator's noise input must be a float32 tensor")
  const [, ...shape] = input.shape
  if (!shape.every((dim): dim is number => typeof dim === "number"))
    throw new Error("the generator's noise input must have fixed sizes after its batch dimension")
  return shape
}
