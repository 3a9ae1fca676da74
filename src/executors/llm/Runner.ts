/**
 * The model side of the LLM executor, on one device: the model's sessions (embed_tokens, the
 * decoder with its KV cache, and the encoders it has) and the caches of the requests it runs. The
 * engine drives it one step at a time; a step prefills the requests that join (their first token),
 * then decodes one token for every request in the batch.
 */
import * as ort from "onnxruntime-node"
import { type ModelDirectory, onnxPath } from "../../models/ModelDirectory.js"
import { createSession } from "../common/Sessions.js"
import { type CachedRow, gatherRows, type PastData, rightAlignedMask } from "./PastCache.js"
import type { MediaInput, PromptInput, SamplingParams, StepOp, TokenPartial } from "./protocol.js"
import { Sampler } from "./Sampler.js"

/** Decoder outputs that hold final hidden states, by the names exports give them. */
const hiddenStateOutputs = ["last_hidden_state", "hidden_states"]

interface Sequence {
  readonly sampler: Sampler
  readonly sampling: SamplingParams
  /** Positions in its cache, which is also the position of its next token. */
  length: number
  lastToken: number
  generated: number
  cache: { readonly past: Past; readonly row: number }
}

/** A past as the decoder takes it, and its width. */
interface Past {
  readonly tensors: ReadonlyArray<ort.Tensor>
  readonly width: number
}

export interface StepItem {
  readonly id: string
  readonly op: StepOp
}

/** An embed item's answer; `error` is the caller's mistake. */
export type EmbedOutput =
  | { readonly embedding: Float32Array; readonly shape: readonly [number, number] }
  | { readonly error: string }

const float = (data: Float32Array, dims: ReadonlyArray<number>) => new ort.Tensor("float32", data, dims)
const int64 = (data: BigInt64Array, dims: ReadonlyArray<number>) => new ort.Tensor("int64", data, dims)

export class Runner {
  private readonly sequences = new Map<string, Sequence>()
  /** The batch the last decode step ran, in row order, and its output past. */
  private batch: { readonly order: ReadonlyArray<string>; readonly past: Past } | undefined
  private readonly pastNames: ReadonlyArray<string>
  private readonly heads: number
  private readonly headDim: number
  private readonly hidden: number
  private readonly vocab: number
  private readonly padId: number

  private constructor(
    private readonly model: ModelDirectory,
    private readonly embed: ort.InferenceSession,
    private readonly decoder: ort.InferenceSession,
    private readonly encoders: { readonly vision?: ort.InferenceSession; readonly audio?: ort.InferenceSession }
  ) {
    const spec = model.decoder!
    this.heads = spec.keyValueHeads
    this.headDim = spec.headDim
    this.hidden = spec.hiddenSize
    this.vocab = spec.vocabSize
    this.padId = model.config.pad_token_id ?? 0
    this.pastNames = Array.from({ length: spec.layers }, (_, i) => [
      `past_key_values.${i}.key`,
      `past_key_values.${i}.value`
    ]).flat()
  }

  static async open(model: ModelDirectory, device: string, threads: number): Promise<Runner> {
    if (model.decoder === undefined)
      throw new Error(`${model.path} is not a decoder: its config.json has no vocab_size`)
    const session = (stem: string) => createSession(onnxPath(model, stem), device, threads)
    const [embed, decoder, vision, audio] = await Promise.all([
      session("embed_tokens"),
      session("decoder_model_merged"),
      model.onnx.has("vision_encoder") ? session("vision_encoder") : undefined,
      model.onnx.has("audio_encoder") ? session("audio_encoder") : undefined
    ])
    return new Runner(model, embed, decoder, {
      ...(vision === undefined ? {} : { vision }),
      ...(audio === undefined ? {} : { audio })
    })
  }

  /** Requests whose cache this runner holds. */
  get held(): ReadonlyArray<string> {
    return [...this.sequences.keys()]
  }

  /**
   * Runs one step: frees, embeddings, prefills (each joining request's first token), then one
   * decode for the batch, which is the decode items and the prefilled requests that go on.
   * `emit(index, token)` reports each token as soon as it is sampled. Answers each embed item's
   * output at its index.
   */
  async step(
    items: ReadonlyArray<StepItem>,
    emit: (index: number, partial: TokenPartial) => void
  ): Promise<Array<EmbedOutput | undefined>> {
    const outputs: Array<EmbedOutput | undefined> = items.map(() => undefined)
    const indexOf = new Map(items.map((item, index) => [item.id, index]))
    const take = (id: string, partial: TokenPartial) => emit(indexOf.get(id)!, partial)
    for (const item of items) if (item.op.op === "free") this.sequences.delete(item.id)
    for (const [index, item] of items.entries()) {
      if (item.op.op === "embed") outputs[index] = await this.embedPrompt(item.op.prompt, item.op.source)
    }
    const joining = items.flatMap((item) =>
      item.op.op === "prefill" ? [{ id: item.id, prompt: item.op.prompt, sampling: item.op.sampling }] : []
    )
    if (joining.length > 0) await this.prefill(joining, take)
    const decoding = [
      ...items.filter((item) => item.op.op === "decode").map((item) => item.id),
      ...joining.map((request) => request.id)
    ].filter((id) => this.sequences.has(id))
    if (decoding.length > 0) await this.decode(decoding, take)
    return outputs
  }

  async close(): Promise<void> {
    this.sequences.clear()
    this.batch = undefined
    await Promise.all(
      [this.embed, this.decoder, this.encoders.vision, this.encoders.audio].map((session) => session?.release())
    )
  }

  private async prefill(
    joining: ReadonlyArray<{ readonly id: string; readonly prompt: PromptInput; readonly sampling: SamplingParams }>,
    take: (id: string, partial: TokenPartial) => void
  ): Promise<void> {
    const lengths = joining.map((request) => request.prompt.inputIds.length)
    const width = Math.max(...lengths)
    const embeds = await this.promptEmbeds(
      joining.map((request) => request.prompt),
      width
    )
    const positions = new BigInt64Array(joining.length * width)
    lengths.forEach((length, row) => {
      for (let p = 0; p < length; p++) positions[row * width + width - length + p] = BigInt(p)
    })
    const emptyPast = float(new Float32Array(0), [joining.length, this.heads, 0, this.headDim])
    const outputs = await this.decoder.run({
      inputs_embeds: float(embeds, [joining.length, width, this.hidden]),
      attention_mask: int64(rightAlignedMask(lengths, width), [joining.length, width]),
      position_ids: int64(positions, [joining.length, width]),
      ...Object.fromEntries(this.pastNames.map((name) => [name, emptyPast]))
    })
    const past: Past = { tensors: this.presents(outputs), width }
    const logits = outputs.logits!.data as Float32Array
    joining.forEach((request, row) => {
      const sequence: Sequence = {
        sampler: new Sampler(request.sampling, request.prompt.inputIds),
        sampling: request.sampling,
        length: lengths[row]!,
        lastToken: 0,
        generated: 0,
        cache: { past, row }
      }
      this.sequences.set(request.id, sequence)
      this.accept(
        request.id,
        sequence,
        sequence.sampler.next(logits, ((row + 1) * width - 1) * this.vocab, this.vocab),
        take
      )
    })
  }

  private async decode(ids: ReadonlyArray<string>, take: (id: string, partial: TokenPartial) => void): Promise<void> {
    const sequences = ids.map((id) => this.sequences.get(id)!)
    const past = this.batchPast(ids, sequences)
    const lastTokens = BigInt64Array.from(sequences, (sequence) => BigInt(sequence.lastToken))
    const embeds = (await this.embed.run({ input_ids: int64(lastTokens, [ids.length, 1]) })).inputs_embeds!
    const outputs = await this.decoder.run({
      inputs_embeds: embeds,
      attention_mask: int64(
        rightAlignedMask(
          sequences.map((sequence) => sequence.length + 1),
          past.width + 1
        ),
        [ids.length, past.width + 1]
      ),
      position_ids: int64(
        BigInt64Array.from(sequences, (sequence) => BigInt(sequence.length)),
        [ids.length, 1]
      ),
      ...Object.fromEntries(this.pastNames.map((name, i) => [name, past.tensors[i]!]))
    })
    const next: Past = { tensors: this.presents(outputs), width: past.width + 1 }
    this.batch = { order: ids, past: next }
    const logits = outputs.logits!.data as Float32Array
    ids.forEach((id, row) => {
      const sequence = sequences[row]!
      sequence.length++
      sequence.cache = { past: next, row }
      this.accept(id, sequence, sequence.sampler.next(logits, row * this.vocab, this.vocab), take)
    })
  }

  /** The past for a decode of `ids`: the last batch's as it is when the batch is unchanged, else its rows gathered anew. */
  private batchPast(ids: ReadonlyArray<string>, sequences: ReadonlyArray<Sequence>): Past {
    const previous = this.batch
    if (
      previous !== undefined &&
      previous.order.length === ids.length &&
      previous.order.every((id, i) => id === ids[i])
    ) {
      if (sequences.every((sequence, row) => sequence.cache.past === previous.past && sequence.cache.row === row))
        return previous.past
    }
    const rows: Array<CachedRow> = sequences.map((sequence) => ({
      past: {
        tensors: sequence.cache.past.tensors.map((tensor) => tensor.data as Float32Array),
        width: sequence.cache.past.width
      },
      row: sequence.cache.row,
      length: sequence.length
    }))
    const gathered: PastData = gatherRows(rows, this.heads, this.headDim)
    const dims = [ids.length, this.heads, gathered.width, this.headDim]
    return { tensors: gathered.tensors.map((data) => float(data, dims)), width: gathered.width }
  }

  private accept(id: string, sequence: Sequence, token: number, take: (id: string, partial: TokenPartial) => void) {
    sequence.lastToken = token
    sequence.generated++
    const finish = sequence.sampling.stopTokenIds.includes(token)
      ? "stop"
      : sequence.generated >= sequence.sampling.maxNewTokens
        ? "length"
        : undefined
    if (finish !== undefined) this.sequences.delete(id)
    take(id, finish === undefined ? { token } : { token, finish })
  }

  private presents(outputs: ort.InferenceSession.ReturnType): ReadonlyArray<ort.Tensor> {
    return this.pastNames.map((name) => outputs[name.replace("past_key_values", "present")]!)
  }

  /**
   * inputs_embeds [prompts, width, hidden] of prompts left-padded to `width`: embed_tokens of the
   * ids, with each media span's rows (encoded here, or given) written over its placeholders.
   */
  private async promptEmbeds(prompts: ReadonlyArray<PromptInput>, width: number): Promise<Float32Array> {
    const ids = new BigInt64Array(prompts.length * width).fill(BigInt(this.padId))
    prompts.forEach((prompt, row) =>
      prompt.inputIds.forEach((id, p) => (ids[row * width + width - prompt.inputIds.length + p] = BigInt(id)))
    )
    const embedded = (await this.embed.run({ input_ids: int64(ids, [prompts.length, width]) })).inputs_embeds!
    const embeds = new Float32Array(embedded.data as Float32Array)
    const spans = prompts.flatMap((prompt, row) =>
      prompt.media.map((span) => ({ span, at: row * width + width - prompt.inputIds.length + span.start }))
    )
    const rows = await this.mediaRows(spans.map(({ span }) => span.input))
    spans.forEach(({ span, at }, index) => {
      const features = rows[index]!
      if (features.length !== span.rows * this.hidden) {
        throw new Error(
          `a media item gave ${features.length / this.hidden} rows of ${this.hidden} for ${span.rows} placeholders`
        )
      }
      embeds.set(features, at * this.hidden)
    })
    return embeds
  }

  /** Each media input's rows, [rows × hidden]; the encoders run once per modality for all items. */
  private async mediaRows(inputs: ReadonlyArray<MediaInput>): Promise<Array<Float32Array>> {
    const rows: Array<Float32Array> = new Array(inputs.length)
    for (const kind of ["pixel_values", "input_values"] as const) {
      const items = inputs.flatMap((input, index) => (input.kind === kind ? [{ input, index }] : []))
      if (items.length === 0) continue
      const encoder = kind === "pixel_values" ? this.encoders.vision : this.encoders.audio
      if (encoder === undefined) throw new Error(`${this.model.path} has no encoder for ${kind}`)
      const itemSize = items[0]!.input.data.length
      const stacked = new Float32Array(items.length * itemSize)
      items.forEach(({ input }, i) => stacked.set(input.data, i * itemSize))
      const output = (
        await encoder.run({
          [encoder.inputNames[0]!]: float(stacked, [items.length, ...items[0]!.input.shape.slice(1)])
        })
      )[encoder.outputNames[0]!]!
      const features = output.data as Float32Array
      const perItem = features.length / items.length
      items.forEach(({ index }, i) => (rows[index] = features.subarray(i * perItem, (i + 1) * perItem)))
    }
    inputs.forEach((input, index) => {
      if (input.kind === "embedding") rows[index] = input.data
    })
    return rows
  }

  /** A prompt's embeddings: inputs_embeds as the decoder would take them, or its final hidden states. */
  private async embedPrompt(prompt: PromptInput, source: "embed_tokens" | "hidden_states"): Promise<EmbedOutput> {
    const length = prompt.inputIds.length
    const embeds = await this.promptEmbeds([prompt], length)
    if (source === "embed_tokens") return { embedding: embeds, shape: [length, this.hidden] }
    const output = hiddenStateOutputs.find((name) => this.decoder.outputNames.includes(name))
    if (output === undefined)
      return {
        error: `this model's decoder gives no hidden states (no ${hiddenStateOutputs.join(" or ")} output); ask for source "embed_tokens"`
      }
    const emptyPast = float(new Float32Array(0), [1, this.heads, 0, this.headDim])
    const outputs = await this.decoder.run(
      {
        inputs_embeds: float(embeds, [1, length, this.hidden]),
        attention_mask: int64(new BigInt64Array(length).fill(1n), [1, length]),
        position_ids: int64(
          BigInt64Array.from({ length }, (_, p) => BigInt(p)),
          [1, length]
        ),
        ...Object.fromEntries(this.pastNames.map((name) => [name, emptyPast]))
      },
      [output]
    )
    const states = outputs[output]!
    return {
      embedding: new Float32Array(states.data as Float32Array),
      shape: [length, states.dims[states.dims.length - 1]!]
    }
  }
}
