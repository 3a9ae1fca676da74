/**
 * Geri's worker for a Janus-Pro model (model_type "multi_modality"): onnx/image_decode.onnx turns
 * the image tokens the LLM executor chose (int64 [1, image tokens] each, stacked into one batch)
 * into pixels, converted exactly as transformers.js's `generate_images` converts them: `(x + 1) ·
 * 255 / 2` in float32, clamped to [0, 255] and truncated to bytes. Each image is answered as a PNG
 * of the model's size, resized only when the request asks for another.
 */
import * as ort from "onnxruntime-node"
import { sharp } from "../../models/Sharp.js"
import { floatsOf } from "../../models/Float16.js"
import { janusGraphPath } from "../../models/JanusModel.js"
import type { ModelDirectory } from "../../models/ModelDirectory.js"
import { createSession } from "../common/Sessions.js"
import type { WorkerContext, WorkerModel } from "../common/WorkerModel.js"

/** An image as bytes, channels last (what transformers.js's RawImage holds). */
export interface RgbImage {
  readonly data: Uint8Array
  readonly width: number
  readonly height: number
  readonly channels: number
}

/** image_decode's [batch, channels, height, width] output in [-1, 1] as images of bytes, as transformers.js converts it. */
export const imagesOf = (decoded: ort.Tensor): Array<RgbImage> => {
  const [batch, channels, height, width] = decoded.dims as [number, number, number, number]
  const values = decoded.type === "float16" ? floatsOf(decoded.data as Uint16Array) : (decoded.data as Float32Array)
  const plane = height * width
  return Array.from({ length: batch }, (_, image) => {
    const data = new Uint8Array(plane * channels)
    for (let c = 0; c < channels; c++) {
      const base = (image * channels + c) * plane
      for (let p = 0; p < plane; p++) {
        // transformers.js: add_(1), mul_(255 / 2) and clamp_ on a Float32Array, then Uint8Array.from (truncation).
        const scaled = Math.fround(Math.fround(values[base + p]! + 1) * (255 / 2))
        data[p * channels + c] = Math.min(Math.max(scaled, 0), 255)
      }
    }
    return { data, width, height, channels }
  })
}

/** Decodes batches of image tokens to images. */
export class JanusDecoder {
  private constructor(private readonly session: ort.InferenceSession) {}

  static async open(model: ModelDirectory, device: string, threads: number): Promise<JanusDecoder> {
    return new JanusDecoder(await createSession(janusGraphPath(model, "image_decode", undefined), device, threads))
  }

  /** `tokens` holds `batch` images' tokens, one after the other. */
  async decode(tokens: BigInt64Array, batch: number): Promise<Array<RgbImage>> {
    const { decoded_image } = await this.session.run({
      generated_tokens: new ort.Tensor("int64", tokens, [batch, tokens.length / batch])
    })
    return imagesOf(decoded_image!)
  }

  close(): Promise<void> {
    return this.session.release()
  }
}

/** A PNG of the image, resized (stretched) to width × height when that is not its own size. */
export const pngOf = async (image: RgbImage, width: number, height: number): Promise<Uint8Array> => {
  let picture = sharp(image.data, { raw: { width: image.width, height: image.height, channels: image.channels as 3 } })
  if (width !== image.width || height !== image.height) picture = picture.resize(width, height, { fit: "fill" })
  const png = await picture.png().toBuffer()
  return new Uint8Array(png.buffer, png.byteOffset, png.length)
}

/** The worker model: each batch's items are image tokens under `generated_tokens`, [1, image tokens] each. */
/** What a Janus item's meta holds of worker.ts's GeriItemMeta: the image's size. */
interface ImageSize {
  readonly width: number
  readonly height: number
}

export const janusWorkerModel = async (
  model: ModelDirectory,
  { config, device }: WorkerContext
): Promise<WorkerModel<ImageSize>> => {
  const decoder = await JanusDecoder.open(model, device, config.threadsPerDevice)
  return {
    async run({ inputs, items }) {
      const tokens = inputs.generated_tokens!
      const count = tokens.shape[1]!
      const source = tokens.data as BigInt64Array
      const stacked = new BigInt64Array(items.length * count)
      items.forEach((item, index) =>
        stacked.set(source.subarray(item.rows[0] * count, item.rows[1] * count), index * count)
      )
      const images = await decoder.decode(stacked, items.length)
      return Promise.all(
        // The item's result is worker.ts's GeriImageResult (its image fields).
        items.map(async (item, index) => {
          const { width, height } = item.meta
          return { png: await pngOf(images[index]!, width, height), width, height }
        })
      )
    },
    close: () => decoder.close()
  }
}
