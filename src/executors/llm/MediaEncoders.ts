/**
 * The media encoders of a VLM's split export, by family: each media item's rows [rows × hidden],
 * which the runner writes over the item's placeholders in the prompt's embeddings. The encoders
 * run once per modality for all the items of a prompt (or a batch of prompts), except where a
 * family's encoder takes one item a run.
 */
import * as ort from "onnxruntime-node"
import { qwen2VLGridInput } from "../common/Sessions.js"
import { float, float32Data, int64 } from "./Tensors.js"
import type { MediaInput } from "./protocol.js"

type Item = { readonly input: MediaInput; readonly index: number }

const firstOutput = async (encoder: ort.InferenceSession, feeds: Record<string, ort.Tensor>) =>
  float32Data((await encoder.run(feeds))[encoder.outputNames[0]!]!)

/** Ultravox: each clip's features have a length of their own: one clip a run. */
const audioRows = async (encoder: ort.InferenceSession, items: ReadonlyArray<Item>, rows: Array<Float32Array>) => {
  for (const { input, index } of items)
    rows[index] = await firstOutput(encoder, { audio_values: float(input.data, input.shape) })
}

/**
 * Qwen2-VL: one item a run. Its encoder attends within each frame through a mask over all the
 * patches it is given, so a call of several items costs the square of their patches.
 */
const qwen2VLRows = async (
  encoder: ort.InferenceSession,
  gridInput: string,
  items: ReadonlyArray<Item>,
  rows: Array<Float32Array>
) => {
  for (const { input, index } of items) {
    if (input.kind !== "pixel_values" || input.thw === undefined) throw new Error("a Qwen2-VL image without its grid")
    rows[index] = await firstOutput(encoder, {
      pixel_values: float(input.data, input.shape),
      [gridInput]: int64(BigInt64Array.from(input.thw, BigInt), [1, 3])
    })
  }
}

/** Idefics3: every item's frames as one sequence; each frame gives its own features. */
const idefics3Rows = async (encoder: ort.InferenceSession, items: ReadonlyArray<Item>, rows: Array<Float32Array>) => {
  const frames = items.map(({ input }) => input.shape[0]!)
  const [, channels, height, width] = items[0]!.input.shape as [number, number, number, number]
  const total = frames.reduce((sum, count) => sum + count, 0)
  const stacked = new Float32Array(total * channels * height * width)
  let at = 0
  for (const { input } of items) {
    stacked.set(input.data, at)
    at += input.data.length
  }
  const features = await firstOutput(encoder, {
    pixel_values: float(stacked, [1, total, channels, height, width]),
    pixel_attention_mask: new ort.Tensor("bool", new Uint8Array(total * height * width).fill(1), [
      1,
      total,
      height,
      width
    ])
  })
  const perFrame = features.length / total
  let frame = 0
  items.forEach(({ index }, i) => {
    rows[index] = features.subarray(frame * perFrame, (frame + frames[i]!) * perFrame)
    frame += frames[i]!
  })
}

/** Any other encoder: the items stacked on its first input's batch axis, as one run. */
const stackedRows = async (encoder: ort.InferenceSession, items: ReadonlyArray<Item>, rows: Array<Float32Array>) => {
  const itemSize = items[0]!.input.data.length
  const stacked = new Float32Array(items.length * itemSize)
  items.forEach(({ input }, i) => stacked.set(input.data, i * itemSize))
  const features = await firstOutput(encoder, {
    [encoder.inputNames[0]!]: float(stacked, [items.length, ...items[0]!.input.shape.slice(1)])
  })
  const perItem = features.length / items.length
  items.forEach(({ index }, i) => (rows[index] = features.subarray(i * perItem, (i + 1) * perItem)))
}

export class MediaEncoders {
  constructor(
    /** The model's directory, which errors name. */
    private readonly modelPath: string,
    private readonly vision: ort.InferenceSession | undefined,
    private readonly audio: ort.InferenceSession | undefined
  ) {}

  /** Each media input's rows, [rows × hidden]; an embedding given as it is. */
  async rows(inputs: ReadonlyArray<MediaInput>): Promise<Array<Float32Array>> {
    const rows: Array<Float32Array> = new Array(inputs.length)
    for (const kind of ["pixel_values", "input_values", "audio_values"] as const) {
      const items = inputs.flatMap((input, index) => (input.kind === kind ? [{ input, index }] : []))
      if (items.length === 0) continue
      const encoder = kind === "pixel_values" ? this.vision : this.audio
      if (encoder === undefined) throw new Error(`${this.modelPath} has no encoder for ${kind}`)
      const gridInput = qwen2VLGridInput(encoder)
      if (kind === "audio_values") await audioRows(encoder, items, rows)
      else if (gridInput !== undefined) await qwen2VLRows(encoder, gridInput, items, rows)
      else if (encoder.inputNames.includes("pixel_attention_mask")) await idefics3Rows(encoder, items, rows)
      else await stackedRows(encoder, items, rows)
    }
    inputs.forEach((input, index) => {
      if (input.kind === "embedding") rows[index] = input.data
    })
    return rows
  }

  async release(): Promise<void> {
    await Promise.all([this.vision?.release(), this.audio?.release()])
  }
}
