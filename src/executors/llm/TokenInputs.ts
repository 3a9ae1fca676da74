/**
 * The decoder's token input: token ids (the decoder-only layout), or their embeddings from
 * embed_tokens with each media span's rows (MediaEncoders.ts) written over its placeholders (the
 * split layout).
 */
import type * as ort from "onnxruntime-node"
import type { CacheType } from "../../models/DecoderLayout.js"
import type { MediaEncoders } from "./MediaEncoders.js"
import type { MediaSpan, PromptInput } from "./protocol.js"
import { float32Data, floatsAs, int64 } from "./Tensors.js"

/** The last position a media span's rows go to. */
const lastPosition = (span: MediaSpan) =>
  span.positions === undefined ? span.start + span.rows - 1 : span.positions[span.rows - 1]!

export class TokenInputs {
  constructor(
    /** The model's directory, which errors name. */
    private readonly modelPath: string,
    private readonly embed: ort.InferenceSession | undefined,
    private readonly encoders: MediaEncoders,
    private readonly hidden: number,
    private readonly embedsType: CacheType,
    private readonly padId: number
  ) {}

  /** Whether the decoder takes embeddings (the split layout), which embed items answer with. */
  get embeds(): boolean {
    return this.embed !== undefined
  }

  /** The decoder's input for one token of each row. */
  async decode(tokens: BigInt64Array): Promise<ort.Tensor> {
    const ids = int64(tokens, [tokens.length, 1])
    return this.embed === undefined ? ids : (await this.embed.run({ input_ids: ids })).inputs_embeds!
  }

  /** The decoder's input for prompts left-padded to `width`. */
  async prompts(prompts: ReadonlyArray<PromptInput>, width: number): Promise<ort.Tensor> {
    if (this.embed === undefined) {
      if (prompts.some((prompt) => prompt.media.length > 0)) this.refuseMedia()
      return int64(this.paddedIds(prompts, width), [prompts.length, width])
    }
    return floatsAs(this.embedsType, await this.promptEmbeds(prompts, width), [prompts.length, width, this.hidden])
  }

  /**
   * The decoder's input for positions [from, to) of a prompt, as one row. `features` keeps the
   * rows of media spans that later pieces also cover, until the prompt is done.
   */
  async piece(
    prompt: PromptInput,
    features: Map<MediaSpan, Float32Array>,
    from: number,
    to: number
  ): Promise<ort.Tensor> {
    const count = to - from
    const ids = int64(BigInt64Array.from(prompt.inputIds.subarray(from, to), BigInt), [1, count])
    if (this.embed === undefined) {
      if (prompt.media.length > 0) this.refuseMedia()
      return ids
    }
    const embeds = new Float32Array(float32Data((await this.embed.run({ input_ids: ids })).inputs_embeds!))
    const spans = prompt.media.filter((span) => span.start < to && lastPosition(span) >= from)
    const missing = spans.filter((span) => !features.has(span))
    const encoded = await this.encoders.rows(missing.map((span) => span.input))
    missing.forEach((span, index) => {
      if (lastPosition(span) >= to) features.set(span, encoded[index]!)
    })
    spans.forEach((span) => {
      this.placeSpan(embeds, span, features.get(span) ?? encoded[missing.indexOf(span)]!, -from, from, to)
      if (lastPosition(span) < to) features.delete(span)
    })
    return floatsAs(this.embedsType, embeds, [1, count, this.hidden])
  }

  /**
   * inputs_embeds [prompts, width, hidden] of prompts left-padded to `width`: embed_tokens of the
   * ids, with each media span's rows (encoded here, or given) written over its placeholders.
   */
  async promptEmbeds(prompts: ReadonlyArray<PromptInput>, width: number): Promise<Float32Array> {
    const embed = this.embed!
    const ids = this.paddedIds(prompts, width)
    const embedded = (await embed.run({ input_ids: int64(ids, [prompts.length, width]) })).inputs_embeds!
    const embeds = new Float32Array(float32Data(embedded))
    const spans = prompts.flatMap((prompt, row) =>
      prompt.media.map((span) => ({ span, base: row * width + width - prompt.inputIds.length }))
    )
    const rows = await this.encoders.rows(spans.map(({ span }) => span.input))
    spans.forEach(({ span, base }, index) => this.placeSpan(embeds, span, rows[index]!, base, 0, Infinity))
    return embeds
  }

  async release(): Promise<void> {
    await Promise.all([this.embed?.release(), this.encoders.release()])
  }

  private refuseMedia(): never {
    throw new Error(
      `${this.modelPath} is a text-only export (onnx/model.onnx takes input_ids), so it cannot take media`
    )
  }

  private paddedIds(prompts: ReadonlyArray<PromptInput>, width: number): BigInt64Array {
    const ids = new BigInt64Array(prompts.length * width).fill(BigInt(this.padId))
    prompts.forEach((prompt, row) =>
      prompt.inputIds.forEach((id, p) => (ids[row * width + width - prompt.inputIds.length + p] = BigInt(id)))
    )
    return ids
  }

  /**
   * Writes a media span's rows over its placeholders in `embeds`, whose row `base + p` is prompt
   * position p; only positions in [from, to).
   */
  private placeSpan(
    embeds: Float32Array,
    span: MediaSpan,
    features: Float32Array,
    base: number,
    from: number,
    to: number
  ): void {
    const hidden = this.hidden
    if (features.length !== span.rows * hidden) {
      throw new Error(`a media item gave ${features.length / hidden} rows of ${hidden} for ${span.rows} placeholders`)
    }
    for (let i = 0; i < span.rows; i++) {
      const position = span.positions === undefined ? span.start + i : span.positions[i]!
      if (position < from || position >= to) continue
      embeds.set(features.subarray(i * hidden, (i + 1) * hidden), (base + position) * hidden)
    }
  }
}
