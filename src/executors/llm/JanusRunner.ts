/**
 * The model side of the LLM executor for Janus-Pro (model_type "multi_modality"), which the
 * platform serves for image generation: each request's image tokens, step by step as
 * transformers.js's `MultiModalityCausalLM.generate_images` chooses them, so that greedy tokens are
 * the same.
 *
 * Under classifier-free guidance (a guidance scale above 1) a request runs two rows: its prompt
 * (conditional) and a prompt of the same length all padding with an attention mask of zeros
 * (unconditional). The prefill embeds both with prepare_inputs_embeds (the image masks of batch 1
 * and the empty [0, 0, 3, 384, 384] pixel_values transformers.js gives it), runs language_model
 * with position ids from the mask (masked positions at 1) and gen_head over every position; the
 * conditional row's last logits get -Infinity at the end of sentence where the codebook reaches it
 * (min_new_tokens), and the guided logits are `uncond + (cond - uncond) · scale` in float32. Each
 * later step feeds the chosen token to both rows through gen_img_embeds, their masks grown by one
 * position. Greedy at temperature 0; otherwise a seeded draw with the Sampler (transformers.js
 * draws with Math.random, so sampled images cannot match its).
 *
 * Each request's rows run as their own batch: no padding across requests, so a request's tokens
 * are the same whatever runs beside it.
 */
import * as ort from "onnxruntime-node"
import { janusImageSize } from "../../models/architectures/Janus.js"
import type { Dtype } from "../../models/Dtype.js"
import { floatsOf } from "../../models/Float16.js"
import { isGuided, janusGraphPath, type JanusSpec, janusSpec } from "../../models/JanusModel.js"
import type { ModelDirectory } from "../../models/ModelDirectory.js"
import { createSession } from "../common/Sessions.js"
import type { PromptInput, SamplingParams, TokenPartial } from "./protocol.js"
import type { EmbedOutput, StepItem, StepRunner } from "./StepRunner.js"
import { int64 } from "./Tensors.js"
import { Sampler } from "./Sampler.js"

interface ImageSequence {
  readonly sampler: Sampler
  /** The guidance scale when guided (two rows), else undefined (one row). */
  readonly guidance: number | undefined
  readonly rows: number
  readonly maxNewTokens: number
  generated: number
  lastToken: number
  /** Each row's attention mask over the positions in its cache, row after row. */
  mask: BigInt64Array
  /** Positions in its cache. */
  width: number
  past: ReadonlyArray<ort.Tensor>
}

/** An empty tensor of a float input's type. */
const emptyFloat = (type: string, dims: ReadonlyArray<number>) =>
  type === "float16"
    ? new ort.Tensor("float16", new Uint16Array(0), dims)
    : new ort.Tensor("float32", new Float32Array(0), dims)

const inputType = (session: ort.InferenceSession, name: string): string => {
  const metadata = session.inputMetadata.find((value) => value.name === name)
  return metadata?.isTensor === true ? metadata.type : "float32"
}

/**
 * Position ids as transformers.js makes them from an attention mask ([rows, width]): the count of
 * unmasked positions before each position, and 1 at a masked one; the last `last` of each row.
 */
export const maskPositions = (mask: BigInt64Array, rows: number, last: number): BigInt64Array => {
  const width = mask.length / rows
  const positions = new BigInt64Array(rows * last)
  for (let row = 0; row < rows; row++) {
    let sum = 0n
    for (let p = 0; p < width; p++) {
      const value = mask[row * width + p]!
      const position = value === 0n ? 1n : sum
      sum += value
      if (p >= width - last) positions[row * last + p - (width - last)] = position
    }
  }
  return positions
}

/** Each row's mask with one more unmasked position at its end. */
const grown = (mask: BigInt64Array, rows: number): BigInt64Array => {
  const width = mask.length / rows
  const next = new BigInt64Array(rows * (width + 1)).fill(1n)
  for (let row = 0; row < rows; row++) next.set(mask.subarray(row * width, (row + 1) * width), row * (width + 1))
  return next
}

export class JanusRunner implements StepRunner {
  private readonly sequences = new Map<string, ImageSequence>()
  /** language_model's past inputs and the outputs that become them, in the same order. */
  private readonly cache: ReadonlyArray<{ readonly input: string; readonly output: string }>
  private readonly cacheType: string

  private constructor(
    readonly spec: JanusSpec,
    private readonly prepare: ort.InferenceSession,
    private readonly language: ort.InferenceSession,
    private readonly head: ort.InferenceSession,
    private readonly imageEmbeds: ort.InferenceSession
  ) {
    this.cache = language.inputNames
      .filter((name) => name.startsWith("past_key_values."))
      .map((input) => ({ input, output: `present.${input.slice("past_key_values.".length)}` }))
    if (this.cache.length !== 2 * spec.layers)
      throw new Error(
        `language_model.onnx takes ${this.cache.length} past tensors; language_config's ${spec.layers} layers need ${2 * spec.layers}`
      )
    this.cacheType = inputType(language, this.cache[0]!.input)
  }

  /** Opens the graphs image generation runs, each at `dtype` when the directory has it. */
  static async open(model: ModelDirectory, device: string, threads: number, dtype?: Dtype): Promise<JanusRunner> {
    const spec = janusSpec(model)
    const session = (stem: string, spin = false) =>
      createSession(janusGraphPath(model, stem, dtype), device, threads, { spin })
    const [prepare, language, head, imageEmbeds] = await Promise.all([
      session("prepare_inputs_embeds"),
      session("language_model", true),
      session("gen_head"),
      session("gen_img_embeds")
    ])
    return new JanusRunner(spec, prepare, language, head, imageEmbeds)
  }

  get held(): ReadonlyArray<string> {
    return [...this.sequences.keys()]
  }

  /**
   * Runs one step: frees, then each joining request's prefill (its first token), then one token
   * for every request that goes on (those that joined included). Embed items are refused: a Janus
   * model gives image tokens, not prompt embeddings.
   */
  async step(
    items: ReadonlyArray<StepItem>,
    emit: (index: number, partial: TokenPartial) => void
  ): Promise<Array<EmbedOutput | undefined>> {
    const outputs: Array<EmbedOutput | undefined> = items.map(() => undefined)
    for (const item of items) if (item.op.op === "free") this.sequences.delete(item.id)
    const going: Array<{ readonly id: string; readonly index: number }> = []
    for (const [index, item] of items.entries()) {
      if (item.op.op === "embed") outputs[index] = { error: "a Janus model gives image tokens, not prompt embeddings" }
      else if (item.op.op === "prefill") {
        const token = await this.prefill(item.id, item.op.prompt, item.op.sampling)
        this.accept(item.id, token, (partial) => emit(index, partial))
        going.push({ id: item.id, index })
      } else if (item.op.op === "decode") going.push({ id: item.id, index })
    }
    for (const { id, index } of going) {
      if (!this.sequences.has(id)) continue
      const token = await this.decode(this.sequences.get(id)!)
      this.accept(id, token, (partial) => emit(index, partial))
    }
    return outputs
  }

  async close(): Promise<void> {
    this.sequences.clear()
    await Promise.all([this.prepare, this.language, this.head, this.imageEmbeds].map((session) => session.release()))
  }

  private async prefill(id: string, prompt: PromptInput, sampling: SamplingParams): Promise<number> {
    const guidance = isGuided(sampling.guidanceScale) ? sampling.guidanceScale : undefined
    const rows = guidance === undefined ? 1 : 2
    const length = prompt.inputIds.length
    const ids = new BigInt64Array(rows * length).fill(BigInt(this.spec.padTokenId))
    prompt.inputIds.forEach((token, p) => (ids[p] = BigInt(token)))
    const mask = new BigInt64Array(rows * length)
    mask.fill(1n, 0, length)
    const pixelType = inputType(this.prepare, "pixel_values")
    const { inputs_embeds } = await this.prepare.run({
      input_ids: int64(ids, [rows, length]),
      pixel_values: emptyFloat(pixelType, [0, 0, 3, janusImageSize, janusImageSize]),
      images_seq_mask: new ort.Tensor("bool", new Uint8Array(length), [1, length]),
      images_emb_mask: new ort.Tensor("bool", new Uint8Array(0), [1, 0, this.spec.imageTokens])
    })
    const emptyPast = emptyFloat(this.cacheType, [rows, this.spec.kvHeads, 0, this.spec.headDim])
    const sequence: ImageSequence = {
      sampler: new Sampler({ temperature: sampling.temperature, topP: 1, topK: 0, seed: sampling.seed }),
      guidance,
      rows,
      maxNewTokens: sampling.maxNewTokens,
      generated: 0,
      lastToken: 0,
      mask,
      width: length,
      past: this.cache.map(() => emptyPast)
    }
    this.sequences.set(id, sequence)
    return this.forward(sequence, inputs_embeds!, length)
  }

  private async decode(sequence: ImageSequence): Promise<number> {
    const ids = new BigInt64Array(sequence.rows).fill(BigInt(sequence.lastToken))
    const { inputs_embeds } = await this.imageEmbeds.run({ image_ids: int64(ids, [sequence.rows, 1]) })
    sequence.mask = grown(sequence.mask, sequence.rows)
    sequence.width++
    return this.forward(sequence, inputs_embeds!, 1)
  }

  /** language_model and gen_head over `fresh` new positions of the sequence's rows; the token chosen from the last. */
  private async forward(sequence: ImageSequence, embeds: ort.Tensor, fresh: number): Promise<number> {
    const { rows } = sequence
    const feeds: Record<string, ort.Tensor> = {
      inputs_embeds: embeds,
      attention_mask: int64(sequence.mask, [rows, sequence.width]),
      position_ids: int64(maskPositions(sequence.mask, rows, fresh), [rows, fresh])
    }
    this.cache.forEach((names, i) => (feeds[names.input] = sequence.past[i]!))
    const outputs = await this.language.run(feeds)
    sequence.past = this.cache.map((names) => outputs[names.output]!)
    const { logits } = await this.head.run({ last_hidden_state: outputs.last_hidden_state! })
    return sequence.sampler.next(this.guided(sequence, logits!), 0, this.spec.codebookSize)
  }

  /**
   * The last position's logits as transformers.js's processors leave them: the end of sentence
   * masked in the conditional row, then classifier-free guidance merging the two rows.
   */
  private guided(sequence: ImageSequence, logits: ort.Tensor): Float32Array {
    const [, width, codebook] = logits.dims as [number, number, number]
    const data = logits.data as Float32Array | Uint16Array
    const row = (r: number): Float32Array => {
      const from = ((r + 1) * width - 1) * codebook
      return data instanceof Uint16Array ? floatsOf(data, from, from + codebook) : data.slice(from, from + codebook)
    }
    const conditional = row(0)
    for (const eos of this.spec.eosTokenIds) if (eos < codebook) conditional[eos] = -Infinity
    if (sequence.guidance === undefined) return conditional
    const scores = row(1)
    for (let i = 0; i < codebook; i++) scores[i]! += (conditional[i]! - scores[i]!) * sequence.guidance
    return scores
  }

  private accept(id: string, token: number, take: (partial: TokenPartial) => void) {
    const sequence = this.sequences.get(id)!
    sequence.lastToken = token
    sequence.generated++
    const done = sequence.generated >= sequence.maxNewTokens
    if (done) this.sequences.delete(id)
    take(done ? { token, finish: "length" } : { token })
  }
}
