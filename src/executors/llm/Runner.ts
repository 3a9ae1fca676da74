/**
 * The model side of the LLM executor, on one device: the model's sessions (the decoder with its KV
 * cache; in the split layout also embed_tokens and the encoders it has) and the caches of the
 * requests it runs. The engine drives it one step at a time; a step prefills the requests that join
 * (their first token), then decodes one token for every request in the batch. How the decoder is
 * called (input_ids or inputs_embeds, position_ids or not, the cache's names and precision) is read
 * from its graph.
 *
 * A decoder that quantises its activations on the fly (DynamicQuantizeLinear, in the community's
 * q8, int8 and uint8 exports) takes one scale over its whole input: a request's tokens would change
 * with the requests batched beside it. Such a decoder runs each request's rows apart (each
 * prefill and decode step of a request is a run of its own), so that every request answers as it
 * does alone, and as transformers.js does; the cost is batching's throughput on those dtypes.
 */

/** The dtypes whose exports quantise activations with DynamicQuantizeLinear. */
const dynamicallyQuantised: ReadonlyArray<Dtype> = ["q8", "int8", "uint8"]

/**
 * Whether the decoder file quantises activations with one scale over its input: it has a
 * DynamicQuantizeLinear node (its op type is in the file as written; only 8-bit exports are read).
 */
const quantisesPerTensor = async (files: DecoderFiles): Promise<boolean> =>
  dynamicallyQuantised.includes(files.dtype) && (await readFile(files.decoder)).includes("DynamicQuantizeLinear")
import { readFile } from "node:fs/promises"
import * as ort from "onnxruntime-node"
import { type DecoderFiles, type DecoderInterface, decoderFiles, decoderInterface } from "../../models/DecoderLayout.js"
import type { Dtype } from "../../models/Dtype.js"
import { floatsOf, halvesOf } from "../../models/Float16.js"
import type { ModelDirectory } from "../../models/ModelDirectory.js"
import { createSession, qwen2VLGridInput } from "../common/Sessions.js"
import { type CacheArray, type CachedRow, gatherRows, type PastData, rightAlignedMask } from "./PastCache.js"
import type { MediaInput, PromptInput, SamplingParams, StepOp, TokenPartial } from "./protocol.js"
import { Constraints } from "./Constraints.js"
import { Sampler } from "./Sampler.js"

/**
 * Each token's position in a prompt, axis by axis (one axis, or Qwen2-VL's three: temporal,
 * height, width): its M-RoPE positions where the prompt has them, index + delta past them, the
 * index on every axis without them.
 */
const promptPositions = (
  prompt: PromptInput,
  axes: 1 | 3
): { readonly at: (axis: number, p: number) => number; readonly delta: number } => {
  const rope = axes === 3 ? prompt.rope : undefined
  if (rope === undefined) return { at: (_, p) => p, delta: 0 }
  const length = rope.positions.length / 3
  return {
    at: (axis, p) => (p < length ? rope.positions[axis * length + p]! : p + rope.delta),
    delta: rope.delta
  }
}

/** Decoder outputs that hold final hidden states, by the names exports give them. */
const hiddenStateOutputs = ["last_hidden_state", "hidden_states"]

interface Sequence {
  readonly sampler: Sampler
  readonly sampling: SamplingParams
  /** Positions in its cache, which is also the index of its next token. */
  length: number
  /** Added to a token's index to give its position (M-RoPE after media; 0 otherwise). */
  readonly positionDelta: number
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

/** What the worker drives one step at a time: this Runner, or JanusRunner for Janus's image tokens. */
export interface StepRunner {
  /** Requests whose cache it holds. */
  readonly held: ReadonlyArray<string>
  /** Runs one step; `emit(index, token)` reports each token as it is chosen; answers each embed item's output at its index. */
  step(
    items: ReadonlyArray<StepItem>,
    emit: (index: number, partial: TokenPartial) => void
  ): Promise<Array<EmbedOutput | undefined>>
  close(): Promise<void>
}

/** An embed item's answer; `error` is the caller's mistake. */
export type EmbedOutput =
  | { readonly embedding: Float32Array; readonly shape: readonly [number, number] }
  | { readonly error: string }

const float = (data: Float32Array, dims: ReadonlyArray<number>) => new ort.Tensor("float32", data, dims)
const int64 = (data: BigInt64Array, dims: ReadonlyArray<number>) => new ort.Tensor("int64", data, dims)
/** A cache tensor of either precision. */
const cacheTensor = (data: CacheArray, dims: ReadonlyArray<number>) =>
  data instanceof Uint16Array ? new ort.Tensor("float16", data, dims) : new ort.Tensor("float32", data, dims)

/** Float32 values as a tensor of `type`. */
const floatsAs = (type: "float32" | "float16", data: Float32Array, dims: ReadonlyArray<number>) =>
  type === "float16" ? new ort.Tensor("float16", halvesOf(data), dims) : float(data, dims)

/** A float tensor's data as float32 (a copy for float16). */
const float32Data = (tensor: ort.Tensor): Float32Array =>
  tensor.type === "float16" ? floatsOf(tensor.data as Uint16Array) : (tensor.data as Float32Array)

const metadataOf = (values: ReadonlyArray<ort.InferenceSession.ValueMetadata>) =>
  values.flatMap((value) => (value.isTensor ? [{ name: value.name, type: value.type, shape: value.shape }] : []))

export class Runner implements StepRunner {
  private readonly sequences = new Map<string, Sequence>()
  /** The batch the last decode step ran, in row order, and its output past. */
  private batch: { readonly order: ReadonlyArray<string>; readonly past: Past } | undefined
  private readonly heads: number
  private readonly headDim: number
  private readonly hidden: number
  private readonly vocab: number
  private readonly padId: number
  /** Schemas and the tokenizer's vocabulary index, for requests with a response format. */
  private readonly constraints: Constraints

  private constructor(
    private readonly model: ModelDirectory,
    /** The files it runs: layout and dtype. */
    readonly files: DecoderFiles,
    /** Each request's rows run apart: the decoder's answer for a row depends on the others (see above). */
    readonly rowsApart: boolean,
    private readonly io: DecoderInterface,
    private readonly embed: ort.InferenceSession | undefined,
    private readonly decoder: ort.InferenceSession,
    private readonly encoders: { readonly vision?: ort.InferenceSession; readonly audio?: ort.InferenceSession }
  ) {
    const spec = model.decoder!
    this.heads = io.kvHeads
    this.headDim = io.headDim
    this.hidden = spec.hiddenSize
    this.vocab = spec.vocabSize
    this.padId = model.config.pad_token_id ?? 0
    this.constraints = new Constraints(model, spec.vocabSize)
  }

  /** Opens the model's decoder files at `dtype` (by default fp32, or the closest there is). */
  static async open(
    model: ModelDirectory,
    device: string,
    threads: number,
    dtype?: Dtype,
    /** Whether to run each request's rows apart; by default, when the decoder quantises per tensor. */
    options: { readonly rowsApart?: boolean } = {}
  ): Promise<Runner> {
    const spec = model.decoder
    if (spec === undefined) throw new Error(`${model.path} is not a decoder: its config.json has no vocab_size`)
    const files = decoderFiles(model, dtype)
    // Only the decoder's threads spin between runs: the others run briefly before it, on the same cores.
    const session = (path: string | undefined, spin = false) =>
      path === undefined ? Promise.resolve(undefined) : createSession(path, device, threads, { spin })
    const [embed, decoder, vision, audio, rowsApart] = await Promise.all([
      session(files.embedTokens),
      session(files.decoder, true),
      session(files.vision),
      session(files.audio),
      options.rowsApart ?? quantisesPerTensor(files)
    ])
    const io = decoderInterface(
      metadataOf(decoder!.inputMetadata),
      metadataOf(decoder!.outputMetadata),
      { layers: spec.layers, kvHeads: spec.keyValueHeads, headDim: spec.headDim },
      files.decoder.slice(model.path.length + 1),
      model.path
    )
    return new Runner(model, files, rowsApart, io, embed, decoder!, {
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
    if (joining.length > 0) {
      if (this.rowsApart) for (const request of joining) await this.prefill([request], take)
      else await this.prefill(joining, take)
    }
    const decoding = [
      ...items.filter((item) => item.op.op === "decode").map((item) => item.id),
      ...joining.map((request) => request.id)
    ].filter((id) => this.sequences.has(id))
    if (decoding.length > 0) {
      if (this.rowsApart) for (const id of decoding) await this.decode([id], take)
      else await this.decode(decoding, take)
    }
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
    const axes = this.io.positionAxes
    const batch = joining.length
    // Padding takes position 1, as transformers gives masked positions; the mask hides it anyway.
    const positions = new BigInt64Array(axes * batch * width).fill(1n)
    const located = joining.map((request) => promptPositions(request.prompt, axes))
    lengths.forEach((length, row) => {
      for (let axis = 0; axis < axes; axis++) {
        const base = (axis * batch + row) * width + width - length
        for (let p = 0; p < length; p++) positions[base + p] = BigInt(located[row]!.at(axis, p))
      }
    })
    const outputs = await this.runDecoder(
      await this.promptTokens(
        joining.map((request) => request.prompt),
        width
      ),
      rightAlignedMask(lengths, width),
      positions,
      [joining.length, width],
      this.emptyPast(joining.length)
    )
    const past: Past = { tensors: this.presents(outputs), width }
    const logits = this.lastLogits(outputs.logits!, joining.length)
    joining.forEach((request, row) => {
      const sequence: Sequence = {
        sampler: new Sampler(
          request.sampling,
          request.prompt.inputIds,
          request.sampling.format === undefined ? undefined : this.constraints.decoder(request.sampling.format)
        ),
        sampling: request.sampling,
        length: lengths[row]!,
        positionDelta: located[row]!.delta,
        lastToken: 0,
        generated: 0,
        cache: { past, row }
      }
      this.sequences.set(request.id, sequence)
      this.accept(request.id, sequence, this.draw(sequence, logits, row), take)
    })
  }

  private async decode(ids: ReadonlyArray<string>, take: (id: string, partial: TokenPartial) => void): Promise<void> {
    const sequences = ids.map((id) => this.sequences.get(id)!)
    const past = this.batchPast(ids, sequences)
    const lastTokens = BigInt64Array.from(sequences, (sequence) => BigInt(sequence.lastToken))
    const tokens =
      this.embed === undefined
        ? int64(lastTokens, [ids.length, 1])
        : (await this.embed.run({ input_ids: int64(lastTokens, [ids.length, 1]) })).inputs_embeds!
    const outputs = await this.runDecoder(
      tokens,
      rightAlignedMask(
        sequences.map((sequence) => sequence.length + 1),
        past.width + 1
      ),
      this.decodePositions(sequences),
      [ids.length, 1],
      past.tensors
    )
    const next: Past = { tensors: this.presents(outputs), width: past.width + 1 }
    this.batch = { order: ids, past: next }
    const logits = this.lastLogits(outputs.logits!, ids.length)
    ids.forEach((id, row) => {
      const sequence = sequences[row]!
      sequence.length++
      sequence.cache = { past: next, row }
      this.accept(id, sequence, this.draw(sequence, logits, row), take)
    })
  }

  /** Each sequence's next position, on every axis the decoder takes. */
  private decodePositions(sequences: ReadonlyArray<Sequence>): BigInt64Array {
    const one = BigInt64Array.from(sequences, (sequence) => BigInt(sequence.length + sequence.positionDelta))
    if (this.io.positionAxes === 1) return one
    const positions = new BigInt64Array(3 * one.length)
    for (let axis = 0; axis < 3; axis++) positions.set(one, axis * one.length)
    return positions
  }

  /** The past for a decode of `ids`: the last batch's as it is when the batch is unchanged, else its rows gathered anew. */
  private batchPast(ids: ReadonlyArray<string>, sequences: ReadonlyArray<Sequence>): Past {
    // A request alone whose past is its own, unpadded: as it is (requests run apart take this path).
    const only = sequences.length === 1 ? sequences[0]! : undefined
    if (
      only !== undefined &&
      only.cache.row === 0 &&
      only.cache.past.tensors[0]?.dims[0] === 1 &&
      only.cache.past.width === only.length
    )
      return only.cache.past
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
        tensors: sequence.cache.past.tensors.map((tensor) => tensor.data as CacheArray),
        width: sequence.cache.past.width
      },
      row: sequence.cache.row,
      length: sequence.length
    }))
    const gathered: PastData = gatherRows(rows, this.heads, this.headDim)
    const dims = [ids.length, this.heads, gathered.width, this.headDim]
    return { tensors: gathered.tensors.map((data) => cacheTensor(data, dims)), width: gathered.width }
  }

  /** A sequence's next token from its row of the step's logits. */
  private draw(sequence: Sequence, logits: Float32Array, row: number): number {
    const remaining = sequence.sampling.maxNewTokens - sequence.generated
    return sequence.sampler.next(logits, row * this.vocab, this.vocab, remaining)
  }

  private accept(id: string, sequence: Sequence, token: number, take: (id: string, partial: TokenPartial) => void) {
    sequence.lastToken = token
    sequence.generated++
    // A constrained value that is whole ends the sequence: nothing may follow it.
    const finish =
      sequence.sampling.stopTokenIds.includes(token) || sequence.sampler.constraintDone
        ? "stop"
        : sequence.generated >= sequence.sampling.maxNewTokens
          ? "length"
          : undefined
    if (finish !== undefined) this.sequences.delete(id)
    const logprobs = sequence.sampler.lastLogprobs
    take(id, {
      token,
      ...(finish === undefined ? {} : { finish }),
      ...(logprobs === undefined ? {} : { logprob: logprobs.logprob, top: logprobs.top })
    })
  }

  private presents(outputs: ort.InferenceSession.ReturnType): ReadonlyArray<ort.Tensor> {
    return this.io.cache.map((names) => outputs[names.output]!)
  }

  /** A past of no positions for `batch` requests. */
  private emptyPast(batch: number): ReadonlyArray<ort.Tensor> {
    const dims = [batch, this.heads, 0, this.headDim]
    const empty = cacheTensor(this.io.cacheType === "float16" ? new Uint16Array(0) : new Float32Array(0), dims)
    return this.io.cache.map(() => empty)
  }

  /** One decoder run with the inputs its graph takes. `shape` is [batch, new positions]. */
  private runDecoder(
    tokens: ort.Tensor,
    mask: BigInt64Array,
    positions: BigInt64Array,
    shape: readonly [number, number],
    past: ReadonlyArray<ort.Tensor>
  ): Promise<ort.InferenceSession.ReturnType> {
    const [batch, length] = shape
    const feeds: Record<string, ort.Tensor> = {
      [this.io.tokens]: tokens,
      attention_mask: int64(mask, [batch, mask.length / batch])
    }
    if (this.io.positionIds)
      feeds.position_ids = int64(positions, this.io.positionAxes === 3 ? [3, batch, length] : [batch, length])
    if (this.io.useCacheBranch)
      feeds.use_cache_branch = new ort.Tensor("bool", Uint8Array.of(past[0]!.dims[2]! > 0 ? 1 : 0), [1])
    if (this.io.numLogitsToKeep) feeds.num_logits_to_keep = new ort.Tensor("int64", BigInt64Array.of(1n), [])
    this.io.cache.forEach((names, i) => (feeds[names.input] = past[i]!))
    return this.decoder.run(feeds)
  }

  /** Each row's logits at its last position, [batch × vocab] as float32. */
  private lastLogits(logits: ort.Tensor, batch: number): Float32Array {
    const width = logits.dims[1]!
    // A decode step (or num_logits_to_keep) gives one float32 position per row: already the layout wanted.
    if (width === 1 && logits.data instanceof Float32Array) return logits.data
    const out = new Float32Array(batch * this.vocab)
    const data = logits.data as Float32Array | Uint16Array
    for (let row = 0; row < batch; row++) {
      const from = ((row + 1) * width - 1) * this.vocab
      out.set(
        data instanceof Uint16Array ? floatsOf(data, from, from + this.vocab) : data.subarray(from, from + this.vocab),
        row * this.vocab
      )
    }
    return out
  }

  /** The decoder's token input for prompts left-padded to `width`: their ids, or (split layout) their embeddings. */
  private async promptTokens(prompts: ReadonlyArray<PromptInput>, width: number): Promise<ort.Tensor> {
    if (this.embed === undefined) {
      const withMedia = prompts.find((prompt) => prompt.media.length > 0)
      if (withMedia !== undefined) {
        throw new Error(
          `${this.model.path} is a text-only export (onnx/model.onnx takes input_ids), so it cannot take media`
        )
      }
      return int64(this.paddedIds(prompts, width), [prompts.length, width])
    }
    return floatsAs(this.io.embedsType, await this.promptEmbeds(prompts, width), [prompts.length, width, this.hidden])
  }

  private paddedIds(prompts: ReadonlyArray<PromptInput>, width: number): BigInt64Array {
    const ids = new BigInt64Array(prompts.length * width).fill(BigInt(this.padId))
    prompts.forEach((prompt, row) =>
      prompt.inputIds.forEach((id, p) => (ids[row * width + width - prompt.inputIds.length + p] = BigInt(id)))
    )
    return ids
  }

  /**
   * inputs_embeds [prompts, width, hidden] of prompts left-padded to `width`: embed_tokens of the
   * ids, with each media span's rows (encoded here, or given) written over its placeholders.
   */
  private async promptEmbeds(prompts: ReadonlyArray<PromptInput>, width: number): Promise<Float32Array> {
    const embed = this.embed!
    const ids = this.paddedIds(prompts, width)
    const embedded = (await embed.run({ input_ids: int64(ids, [prompts.length, width]) })).inputs_embeds!
    const embeds = new Float32Array(float32Data(embedded))
    const spans = prompts.flatMap((prompt, row) =>
      prompt.media.map((span) => ({ span, base: row * width + width - prompt.inputIds.length }))
    )
    const rows = await this.mediaRows(spans.map(({ span }) => span.input))
    spans.forEach(({ span, base }, index) => {
      const features = rows[index]!
      if (features.length !== span.rows * this.hidden) {
        throw new Error(
          `a media item gave ${features.length / this.hidden} rows of ${this.hidden} for ${span.rows} placeholders`
        )
      }
      if (span.positions === undefined) {
        embeds.set(features, (base + span.start) * this.hidden)
        return
      }
      span.positions.forEach((position, i) =>
        embeds.set(features.subarray(i * this.hidden, (i + 1) * this.hidden), (base + position) * this.hidden)
      )
    })
    return embeds
  }

  /** Each media input's rows, [rows × hidden]; the encoders run once per modality for all items. */
  private async mediaRows(inputs: ReadonlyArray<MediaInput>): Promise<Array<Float32Array>> {
    const rows: Array<Float32Array> = new Array(inputs.length)
    for (const kind of ["pixel_values", "input_values", "audio_values"] as const) {
      const items = inputs.flatMap((input, index) => (input.kind === kind ? [{ input, index }] : []))
      if (items.length === 0) continue
      const encoder = kind === "pixel_values" ? this.encoders.vision : this.encoders.audio
      if (encoder === undefined) throw new Error(`${this.model.path} has no encoder for ${kind}`)
      if (kind === "audio_values") {
        // Ultravox: each clip's features have a length of their own: one clip a run.
        for (const { input, index } of items) {
          const output = (await encoder.run({ audio_values: float(input.data, input.shape) }))[encoder.outputNames[0]!]!
          rows[index] = float32Data(output)
        }
        continue
      }
      const gridInput = qwen2VLGridInput(encoder)
      if (gridInput !== undefined) {
        // Qwen2-VL: one item a run. Its encoder attends within each frame through a mask over all
        // the patches it is given, so a call of several items costs the square of their patches.
        for (const { input, index } of items) {
          if (input.kind !== "pixel_values" || input.thw === undefined)
            throw new Error("a Qwen2-VL image without its grid")
          const output = (
            await encoder.run({
              pixel_values: float(input.data, input.shape),
              [gridInput]: int64(BigInt64Array.from(input.thw, BigInt), [1, 3])
            })
          )[encoder.outputNames[0]!]!
          rows[index] = float32Data(output)
        }
        continue
      }
      if (encoder.inputNames.includes("pixel_attention_mask")) {
        // Idefics3: every item's frames as one sequence; each frame gives its own features.
        const frames = items.map(({ input }) => input.shape[0]!)
        const [, channels, height, width] = items[0]!.input.shape as [number, number, number, number]
        const total = frames.reduce((sum, count) => sum + count, 0)
        const stacked = new Float32Array(total * channels * height * width)
        let at = 0
        for (const { input } of items) {
          stacked.set(input.data, at)
          at += input.data.length
        }
        const output = (
          await encoder.run({
            pixel_values: float(stacked, [1, total, channels, height, width]),
            pixel_attention_mask: new ort.Tensor("bool", new Uint8Array(total * height * width).fill(1), [
              1,
              total,
              height,
              width
            ])
          })
        )[encoder.outputNames[0]!]!
        const features = float32Data(output)
        const perFrame = features.length / total
        let frame = 0
        items.forEach(({ index }, i) => {
          rows[index] = features.subarray(frame * perFrame, (frame + frames[i]!) * perFrame)
          frame += frames[i]!
        })
        continue
      }
      const itemSize = items[0]!.input.data.length
      const stacked = new Float32Array(items.length * itemSize)
      items.forEach(({ input }, i) => stacked.set(input.data, i * itemSize))
      const output = (
        await encoder.run({
          [encoder.inputNames[0]!]: float(stacked, [items.length, ...items[0]!.input.shape.slice(1)])
        })
      )[encoder.outputNames[0]!]!
      const features = float32Data(output)
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
    if (this.embed === undefined) {
      return {
        error: `this model is a text-only export (onnx/model.onnx) with no embed_tokens or hidden-state output: it gives no prompt embeddings`
      }
    }
    const embeds = await this.promptEmbeds([prompt], length)
    if (source === "embed_tokens") return { embedding: embeds, shape: [length, this.hidden] }
    const output = hiddenStateOutputs.find((name) => this.decoder.outputNames.includes(name))
    if (output === undefined)
      return {
        error: `this model's decoder gives no hidden states (no ${hiddenStateOutputs.join(" or ")} output); ask for source "embed_tokens"`
      }
    const feeds: Record<string, ort.Tensor> = {
      inputs_embeds: floatsAs(this.io.embedsType, embeds, [1, length, this.hidden]),
      attention_mask: int64(new BigInt64Array(length).fill(1n), [1, length])
    }
    if (this.io.positionIds) {
      const axes = this.io.positionAxes
      const located = promptPositions(prompt, axes)
      feeds.position_ids = int64(
        BigInt64Array.from({ length: axes * length }, (_, i) => BigInt(located.at(Math.floor(i / length), i % length))),
        axes === 3 ? [3, 1, length] : [1, length]
      )
    }
    const empty = this.emptyPast(1)
    this.io.cache.forEach((names, i) => (feeds[names.input] = empty[i]!))
    const outputs = await this.decoder.run(feeds, [output])
    const states = outputs[output]!
    return {
      embedding: new Float32Array(float32Data(states)),
      shape: [length, states.dims[states.dims.length - 1]!]
    }
  }
}
