/**
 * Eric's worker: the model's encoders (onnx/vision_encoder.onnx for images and video frames,
 * onnx/audio_encoder.onnx for audio) on one device. Each item's features go to the sidecar under
 * the item's id, or back in the answer when the request asked for them inline.
 */
import type * as ort from "onnxruntime-node"
import { loadModelDirectory } from "../../models/ModelDirectory.js"
import { SidecarClient } from "../../sidecar/SidecarClient.js"
import { Tensor } from "../../sidecar/Tensor.js"
import { createSession, fromOrt, toOrt } from "../common/Sessions.js"
import type { LoadWorkerModel } from "../common/WorkerModel.js"

/** What the router attaches to each work item. */
export interface EricItemMeta {
  readonly id: string
  readonly modality: "image" | "video" | "audio"
  readonly receivers: ReadonlyArray<string>
  readonly inline: boolean
}

export interface EricItemResult {
  readonly shape: readonly [number, number]
  readonly embedding?: Float32Array
}

const encoderFiles = { vision: "vision_encoder", audio: "audio_encoder" } as const

export const load: LoadWorkerModel = async ({ config, device }) => {
  const model = await loadModelDirectory(config.modelDir)
  const sessions = new Map<"vision" | "audio", ort.InferenceSession>()
  for (const [encoder, file] of Object.entries(encoderFiles) as Array<["vision" | "audio", string]>) {
    const path = model.onnx.get(file)
    if (path !== undefined) sessions.set(encoder, await createSession(path, device, config.threadsPerDevice))
  }
  const sidecar = config.sidecarSocket === undefined ? undefined : await SidecarClient.connect(config.sidecarSocket)

  return {
    async run({ inputs, items }) {
      const first = items[0]!.meta as EricItemMeta
      const encoder = first.modality === "audio" ? "audio" : "vision"
      const session = sessions.get(encoder)
      if (session === undefined) throw new Error(`the model has no ${encoderFiles[encoder]}.onnx`)
      const input = inputs[encoder === "audio" ? "input_values" : "pixel_values"]!
      const outputs = await session.run({ [session.inputNames[0]!]: toOrt(input) })
      const features = fromOrt(outputs[session.outputNames[0]!]!)
      const [, positions, hidden] = features.shape as [number, number, number]
      const rowElements = positions * hidden
      return Promise.all(
        items.map(async (item): Promise<EricItemResult> => {
          const meta = item.meta as EricItemMeta
          const [from, to] = item.rows
          const shape = [(to - from) * positions, hidden] as const
          const data = (features.data as Float32Array).subarray(from * rowElements, to * rowElements)
          if (meta.inline) return { shape, embedding: data.slice() }
          if (sidecar === undefined) throw new Error("this executor has no sidecar to send embeddings through")
          await sidecar.send(meta.id, new Tensor("float32", shape, data), { to: meta.receivers })
          return { shape }
        })
      )
    },
    async close() {
      await Promise.all([...sessions.values()].map((session) => session.release()))
      await sidecar?.close()
    }
  }
}
