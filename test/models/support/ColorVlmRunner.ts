import type * as ort from "onnxruntime-node"
import { loadModelDirectory, type ModelDirectory, onnxPath } from "../../../src/models/ModelDirectory.js"
import { type ChatMessage, ChatTokenizer } from "../../../src/models/Tokenizer.js"
import { floatTensor, int64Tensor, session } from "./Ort.js"

/**
 * A direct onnxruntime-node generation loop over a VLM model directory, the way an LLM executor
 * runs one: chat template → ids with each media placeholder expanded to its feature rows →
 * embed_tokens → image/audio features spliced in → greedy decoding with the KV cache, batched with
 * left padding.
 */

export interface VlmRequest {
  readonly text: string
  /** pixel_values of each image, [3, size, size]. */
  readonly images?: ReadonlyArray<Float32Array>
  /** input_values of each clip. */
  readonly audio?: ReadonlyArray<Float32Array>
}

export interface VlmAnswer {
  readonly ids: ReadonlyArray<number>
  readonly text: string
  /** Whether the model ended its turn (said end-of-sequence) within the token budget. */
  readonly finished: boolean
}

interface Sessions {
  readonly vision: ort.InferenceSession
  readonly audio: ort.InferenceSession
  readonly embed: ort.InferenceSession
  readonly decoder: ort.InferenceSession
}

const concat = (parts: ReadonlyArray<Float32Array>): Float32Array => {
  const out = new Float32Array(parts.reduce((n, part) => n + part.length, 0))
  let offset = 0
  for (const part of parts) {
    out.set(part, offset)
    offset += part.length
  }
  return out
}

const argmax = (values: Float32Array, from: number, length: number): number => {
  let best = 0
  for (let i = 1; i < length; i++) if (values[from + i]! > values[from + best]!) best = i
  return best
}

export class ColorVlmRunner {
  private constructor(
    readonly model: ModelDirectory,
    readonly tokenizer: ChatTokenizer,
    private readonly sessions: Sessions
  ) {}

  static async open(dir: string): Promise<ColorVlmRunner> {
    const model = await loadModelDirectory(dir)
    const sessions = {
      vision: await session(onnxPath(model, "vision_encoder")),
      audio: await session(onnxPath(model, "audio_encoder")),
      embed: await session(onnxPath(model, "embed_tokens")),
      decoder: await session(onnxPath(model, "decoder_model_merged"))
    }
    return new ColorVlmRunner(model, new ChatTokenizer(model), sessions)
  }

  get eosTokenId(): number {
    return this.model.config.eos_token_id as number
  }

  async answer(requests: ReadonlyArray<VlmRequest>, maxNewTokens: number): Promise<Array<VlmAnswer>> {
    const { config, decoder } = this.model
    const {
      image_token_id: imageToken,
      image_seq_length: imageRows,
      audio_token_id: audioToken,
      audio_seq_length: audioRows
    } = config
    const hidden = decoder!.hiddenSize
    const padId = config.pad_token_id ?? 0

    const prompts = requests.map((request) => {
      const content = [
        ...(request.images ?? []).map(() => ({ type: "image" })),
        ...(request.audio ?? []).map(() => ({ type: "audio" })),
        { type: "text", text: request.text }
      ]
      const messages: Array<ChatMessage> = [{ role: "user", content }]
      return this.tokenizer.encode(this.tokenizer.applyChatTemplate(messages)).flatMap((id) => {
        if (id === imageToken) return new Array<number>(imageRows!).fill(id)
        if (id === audioToken) return new Array<number>(audioRows!).fill(id)
        return [id]
      })
    })

    const images = requests.flatMap((request) => request.images ?? [])
    const audio = requests.flatMap((request) => request.audio ?? [])
    const imageFeatures =
      images.length === 0 ? new Float32Array(0) : await this.encode(this.sessions.vision, "pixel_values", images)
    const audioFeatures =
      audio.length === 0 ? new Float32Array(0) : await this.encode(this.sessions.audio, "input_values", audio)

    const batch = requests.length
    const length = Math.max(...prompts.map((prompt) => prompt.length))
    const padded = prompts.flatMap((prompt) => [...new Array<number>(length - prompt.length).fill(padId), ...prompt])
    const embedded = (await this.sessions.embed.run({ input_ids: int64Tensor(padded, [batch, length]) })).inputs_embeds!
    const embeds = new Float32Array(embedded.data as Float32Array)
    let imageRow = 0
    let audioRow = 0
    padded.forEach((id, position) => {
      const isPadding = position % length < length - prompts[Math.floor(position / length)]!.length
      if (isPadding) return
      if (id === imageToken)
        embeds.set(imageFeatures.subarray(imageRow * hidden, ++imageRow * hidden), position * hidden)
      if (id === audioToken)
        embeds.set(audioFeatures.subarray(audioRow * hidden, ++audioRow * hidden), position * hidden)
    })

    const masks = prompts.map((prompt) => [
      ...new Array<number>(length - prompt.length).fill(0),
      ...prompt.map(() => 1)
    ])
    const positions = prompts.flatMap((prompt) => [
      ...new Array<number>(length - prompt.length).fill(0),
      ...prompt.map((_, i) => i)
    ])
    const spec = decoder!
    const emptyCache = floatTensor(new Float32Array(0), [batch, spec.keyValueHeads, 0, spec.headDim])
    let past: Record<string, ort.Tensor> = {}
    for (let i = 0; i < spec.layers; i++) {
      past[`past_key_values.${i}.key`] = emptyCache
      past[`past_key_values.${i}.value`] = emptyCache
    }

    const generated = requests.map(() => [] as Array<number>)
    const finished = requests.map(() => false)
    const nextPositions = prompts.map((prompt) => prompt.length)
    let stepEmbeds = floatTensor(embeds, [batch, length, hidden])
    let stepPositions = int64Tensor(positions, [batch, length])
    for (let step = 0; step < maxNewTokens && finished.includes(false); step++) {
      const outputs = await this.sessions.decoder.run({
        inputs_embeds: stepEmbeds,
        attention_mask: int64Tensor(masks.flat(), [batch, masks[0]!.length]),
        position_ids: stepPositions,
        ...past
      })
      const [, sequence, vocab] = outputs.logits!.dims as [number, number, number]
      const logits = outputs.logits!.data as Float32Array
      const next = requests.map((_, b) =>
        finished[b] ? padId : argmax(logits, ((b + 1) * sequence - 1) * vocab, vocab)
      )
      next.forEach((id, b) => {
        if (finished[b]) return
        generated[b]!.push(id)
        finished[b] = id === this.eosTokenId
      })
      past = {}
      for (let i = 0; i < spec.layers; i++) {
        past[`past_key_values.${i}.key`] = outputs[`present.${i}.key`]!
        past[`past_key_values.${i}.value`] = outputs[`present.${i}.value`]!
      }
      const nextEmbeds = (await this.sessions.embed.run({ input_ids: int64Tensor(next, [batch, 1]) })).inputs_embeds!
      stepEmbeds = floatTensor(new Float32Array(nextEmbeds.data as Float32Array), [batch, 1, hidden])
      stepPositions = int64Tensor([...nextPositions], [batch, 1])
      nextPositions.forEach((_, b) => nextPositions[b]!++)
      for (const mask of masks) mask.push(1)
    }
    return generated.map((ids, b) => ({
      ids,
      text: this.tokenizer.decode(ids, { skipSpecialTokens: true }),
      finished: finished[b]!
    }))
  }

  private async encode(
    encoder: ort.InferenceSession,
    input: string,
    items: ReadonlyArray<Float32Array>
  ): Promise<Float32Array> {
    const itemLength = items[0]!.length
    const dims =
      input === "pixel_values"
        ? [items.length, 3, Math.sqrt(itemLength / 3), Math.sqrt(itemLength / 3)]
        : [items.length, itemLength]
    const outputs = await encoder.run({ [input]: floatTensor(concat(items), dims) })
    return outputs[encoder.outputNames[0]!]!.data as Float32Array
  }
}
