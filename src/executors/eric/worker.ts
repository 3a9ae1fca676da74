/**
 * Eric's worker: the model's encoders (onnx/vision_encoder.onnx for images and video frames,
 * onnx/audio_encoder.onnx for audio, onnx/model.onnx for text) on one device, or a Whisper's
 * encoder and decoder (SpeechRecognizer), whose passes it decodes in batches. Each media item's
 * features go to the sidecar under the item's id, or back in the answer when the request asked for
 * them inline; a text's vector always comes back in the answer (see TextEncoder).
 *
 * An Idefics3 (SmolVLM) encoder takes all frames of the batch as one image sequence
 * (pixel_values [1, frames, 3, tile, tile] with pixel_attention_mask) and gives each frame's
 * features; an item's transfer then starts with its tile grid (int32 [rows, cols]), which the LLM
 * needs to spell the image out in its prompt, followed by the features.
 *
 * A Qwen2-VL encoder takes one image or video a run (pixel_values [patches, C·T·P·P]) with its
 * grid (grid_thw, or image_grid_thw in Qwen2.5-VL's export) and gives patches ÷ merge² rows; an
 * item's transfer starts with its grid
 * (int32 [t, h, w]), from which the LLM works out its prompt's positions.
 */
import * as ort from "onnxruntime-node"
import { loadModelDirectory } from "../../models/ModelDirectory.js"
import { hasTextEmbeddingGraph } from "../../models/TextEmbedding.js"
import { SidecarClient } from "../../sidecar/SidecarClient.js"
import { Tensor } from "../../sidecar/Tensor.js"
import { createSession, fromOrt, qwen2VLGridInput, toOrt } from "../common/Sessions.js"
import { everyItem, type LoadWorkerModel } from "../common/WorkerModel.js"
import type { BatchItem } from "../common/wire.js"
import { isWhisper } from "../../models/WhisperGeneration.js"
import { SharedTower } from "./SharedTower.js"
import { SpeechRecognizer } from "./SpeechRecognizer.js"
import { TextEncoder, type TextItemMeta } from "./TextEncoder.js"

/** What the router attaches to each media item. */
export interface MediaItemMeta {
  readonly id: string
  readonly modality: "image" | "video" | "audio"
  readonly receivers: ReadonlyArray<string>
  readonly inline: boolean
  /** Idefics3 images: the tile grid. */
  readonly grid?: { readonly rows: number; readonly cols: number }
  /** Qwen2-VL images and videos: the patch grid [t, h, w]. */
  readonly thw?: readonly [number, number, number]
  /** An encoder with adapters (SharedTower): whose projector embeds the item. */
  readonly model?: string
}

/** What the router attaches to a Whisper pass: the prompt it decodes after (its features are the item's input_features). */
export interface SpeechItemMeta {
  readonly modality: "speech"
  readonly prompt: ReadonlyArray<number>
}

/** What the router attaches to each work item. */
export type EricItemMeta = MediaItemMeta | TextItemMeta | SpeechItemMeta

const isText = (meta: EricItemMeta): meta is TextItemMeta => meta.modality === "text"
const isSpeech = (meta: EricItemMeta): meta is SpeechItemMeta => meta.modality === "speech"
const isMedia = (meta: EricItemMeta): meta is MediaItemMeta => !isText(meta) && !isSpeech(meta)

/** A media item's result; a text's is its vector (a Float32Array). */
export interface EricItemResult {
  readonly shape: readonly [number, number]
  readonly embedding?: Float32Array
}

const encoderFiles = { vision: "vision_encoder", audio: "audio_encoder" } as const

const megabytes = (bytes: number) => `${(bytes / 2 ** 20).toFixed(1)} MiB`

/** Frames [n, 3, h, w] as one Idefics3 image sequence: pixel_values [1, n, 3, h, w], every pixel real. */
export const frameSequence = (shape: ReadonlyArray<number>, pixels: ort.Tensor): Record<string, ort.Tensor> => {
  const [frames, channels, height, width] = shape as [number, number, number, number]
  return {
    pixel_values: pixels.reshape([1, frames, channels, height, width]),
    pixel_attention_mask: new ort.Tensor("bool", new Uint8Array(frames * height * width).fill(1), [
      1,
      frames,
      height,
      width
    ])
  }
}

export const load: LoadWorkerModel<EricItemMeta, EricItemResult | Float32Array | Array<number>> = async ({
  config,
  rank,
  device
}) => {
  const model = await loadModelDirectory(config.modelDir)
  const adapters = config.adapters ?? []
  // With adapters the vision encoder runs as one tower and a projector per model, not whole.
  const shared =
    adapters.length === 0
      ? undefined
      : await SharedTower.open(
          { id: config.model, dir: config.modelDir },
          adapters.map((id, index) => ({ id, dir: config.adapterDirs![index]! })),
          device,
          config.threadsPerDevice
        )
  if (shared !== undefined)
    console.log(
      `executor: worker ${rank} runs one vision tower (${megabytes(shared.sizes.towerWeightBytes)}) and a projector for each of ${Object.entries(
        shared.sizes.projectorWeightBytes
      )
        .map(([id, bytes]) => `${id} (${megabytes(bytes)})`)
        .join(", ")}`
    )
  const sessions = new Map<"vision" | "audio", ort.InferenceSession>()
  for (const [encoder, file] of Object.entries(encoderFiles) as Array<["vision" | "audio", string]>) {
    const path = model.onnx.get(file)
    if (path !== undefined && !(encoder === "vision" && shared !== undefined)) {
      sessions.set(encoder, await createSession(path, device, config.threadsPerDevice))
    }
  }
  const text = hasTextEmbeddingGraph(model)
    ? await TextEncoder.open(model, device, config.threadsPerDevice, config.dtype)
    : undefined
  if (text !== undefined) console.log(`executor: worker ${rank} runs ${text.file}`)
  const speech = isWhisper(model) ? await SpeechRecognizer.open(model, device, config.threadsPerDevice) : undefined
  const sidecar = config.sidecarSocket === undefined ? undefined : await SidecarClient.connect(config.sidecarSocket)

  /** An item's features: back in the answer, or to its receivers through the sidecar, after its grid when it has one. */
  const deliver = async (
    meta: MediaItemMeta,
    shape: readonly [number, number],
    data: Float32Array,
    trace: string | undefined,
    grid: Tensor | undefined
  ): Promise<EricItemResult> => {
    if (meta.inline) return { shape, embedding: data.slice() }
    if (sidecar === undefined) throw new Error("this executor has no sidecar to send embeddings through")
    const traced = trace === undefined ? {} : { traceparent: trace }
    if (grid === undefined) {
      await sidecar.send(meta.id, new Tensor("float32", shape, data), { to: meta.receivers, ...traced })
      return { shape }
    }
    await sidecar.send(meta.id, grid, { to: meta.receivers, chunk: 0, numChunks: 2, ...traced })
    await sidecar.send(meta.id, new Tensor("float32", shape, data), {
      to: meta.receivers,
      chunk: 1,
      numChunks: 2,
      ...traced
    })
    return { shape }
  }

  /** Each item's rows of a batch's features [images, positions, hidden], delivered. */
  const deliverRows = (items: ReadonlyArray<BatchItem<MediaItemMeta>>, features: Tensor) => {
    const [, positions, hidden] = features.shape as [number, number, number]
    const rowElements = positions * hidden
    return Promise.all(
      items.map((item) => {
        const meta = item.meta
        const [from, to] = item.rows
        const data = (features.data as Float32Array).subarray(from * rowElements, to * rowElements)
        const grid =
          meta.grid === undefined ? undefined : new Tensor("int32", [2], Int32Array.of(meta.grid.rows, meta.grid.cols))
        return deliver(meta, [(to - from) * positions, hidden], data, item.trace, grid)
      })
    )
  }

  return {
    async run({ inputs, items }) {
      if (everyItem(items, isText)) {
        if (text === undefined) throw new Error("the model has no onnx/model.onnx to embed text with")
        return text.embed(
          inputs.input_ids!.data as Int32Array,
          items.map((item) => ({ rows: item.rows, meta: item.meta }))
        )
      }
      if (everyItem(items, isSpeech)) {
        if (speech === undefined) throw new Error("the model is not a Whisper: it has no onnx/encoder_model.onnx")
        // A pass's tokens come back as they are; the router stitches a clip's windows.
        const features = inputs.input_features!
        const size = features.shape[1]! * features.shape[2]!
        return speech.decode(
          items.map((item) => ({
            features: (features.data as Float32Array).subarray(item.rows[0] * size, item.rows[1] * size),
            prompt: item.meta.prompt
          }))
        )
      }
      if (!everyItem(items, isMedia)) throw new Error("a batch holds items of different modalities")
      const encoder = items[0]!.meta.modality === "audio" ? "audio" : "vision"
      if (encoder === "vision" && shared !== undefined) {
        // One tower run for the whole batch, whichever model each image is for; a projector run per model.
        const outputs = await shared.embed(
          { [shared.inputNames[0]!]: toOrt(inputs.pixel_values!) },
          items.map((item) => ({ model: item.meta.model ?? config.model, rows: item.rows }))
        )
        return Promise.all(
          items.map((item, index) => {
            const [images, rows, hidden] = outputs[index]!.dims as [number, number, number]
            const data = outputs[index]!.data as Float32Array
            return deliver(item.meta, [images * rows, hidden], data, item.trace, undefined)
          })
        )
      }
      const session = sessions.get(encoder)
      if (session === undefined) throw new Error(`the model has no ${encoderFiles[encoder]}.onnx`)
      const input = (encoder === "audio" ? (inputs.audio_values ?? inputs.input_values) : inputs.pixel_values)!
      const gridInput = qwen2VLGridInput(session)
      if (gridInput !== undefined) {
        // One item a run: the encoder attends within each frame through a mask over all the
        // patches it is given, so a call of several items would cost the square of their patches.
        const patchDim = input.shape[1]!
        const results: Array<EricItemResult> = []
        for (const item of items) {
          const meta = item.meta
          const [from, to] = item.rows
          const pixels = (input.data as Float32Array).subarray(from * patchDim, to * patchDim)
          const outputs = await session.run({
            pixel_values: new ort.Tensor("float32", pixels, [to - from, patchDim]),
            [gridInput]: new ort.Tensor("int64", BigInt64Array.from(meta.thw!, BigInt), [1, 3])
          })
          const features = fromOrt(outputs[session.outputNames[0]!]!)
          const grid = new Tensor("int32", [3], Int32Array.from(meta.thw!))
          results.push(
            await deliver(meta, features.shape as [number, number], features.data as Float32Array, item.trace, grid)
          )
        }
        return results
      }
      if (session.inputNames.includes("audio_values")) {
        // Ultravox and Voxtral: one clip a run, [1, mel bins, frames] or (Voxtral) [chunks, mel bins, 3000];
        // it gives its rows, [1, rows, hidden] or [rows, hidden].
        const [, bins, frames] = input.shape as [number, number, number]
        const results: Array<EricItemResult> = []
        for (const item of items) {
          const [from, to] = item.rows
          const clip = (input.data as Float32Array).subarray(from * bins * frames, to * bins * frames)
          const outputs = await session.run({
            audio_values: new ort.Tensor("float32", clip, [to - from, bins, frames])
          })
          const features = fromOrt(outputs[session.outputNames[0]!]!)
          const hidden = features.shape.at(-1)!
          const rows = features.data.length / hidden
          results.push(await deliver(item.meta, [rows, hidden], features.data as Float32Array, item.trace, undefined))
        }
        return results
      }
      const outputs = await session.run(
        session.inputNames.includes("pixel_attention_mask")
          ? frameSequence(input.shape, toOrt(input))
          : { [session.inputNames[0]!]: toOrt(input) }
      )
      return deliverRows(items, fromOrt(outputs[session.outputNames[0]!]!))
    },
    async close() {
      await shared?.release()
      await Promise.all([...sessions.values()].map((session) => session.release()))
      await text?.release()
      await speech?.release()
      await sidecar?.close()
    }
  }
}
