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
 * with the requests batched beside it. By default such a decoder runs every request apart (each
 * prefill and decode step of a request a run of its own): a request answers exactly as it does
 * alone, as transformers.js does, at the cost of batching's throughput.
 *
 * With `quantizedRows: "per-row"`, it is also opened rewritten to take a scale per batch row
 * (RowQuantizeRewrite.ts), which runs the decode steps of several requests together: for a row
 * alone it computes what the export computes, bit for bit, but its extra nodes cost a lone request
 * about a third of its speed, so runs of one row (every prompt, and a lone request's steps) go to
 * the export as it is (the 8-bit weights are then held twice). Batched, a request's numbers differ
 * from its numbers alone by float rounding only, as in every dtype (its attention sums over a
 * padded row); but rounding the activations to 8 bits can turn such a difference into another
 * code, and a near-tie into another token. Prompts are prefilled one a run either way (a batch of
 * prompts would mix their padding into each row's range).
 *
 * The KV cache. Where the decoder's attention is written as exporters write it, the decoder is
 * opened rewritten (SharedCacheRewrite.ts) to attend over a cache the runner owns, a row per
 * request (KvStore.ts): a decode step reads the batch's rows in place, each at its own length
 * with no padding and no mask, and ONNX Runtime hands out only the step's new keys and values,
 * which go into the rows. Otherwise (a graph that does not match, a decoder that quantises per
 * tensor, a sliding-window model, or `kvCache: "copies"`) the decoder runs as exported: each
 * run's present, the whole cache copied, is the next run's past, rows right-aligned under a mask
 * (PastCache.ts) and gathered anew when the batch changes.
 *
 * Prompts are prefilled in pieces. On the decoder as exported, prompts that join with nothing
 * cached run as one batch, each whole; on the shared cache, each whole prompt is a run over its
 * own row. A prompt whose leading blocks the prefix cache holds (PrefixCache.ts) starts from them,
 * and a prompt longer than the step's budget is prefilled a chunk per step, each piece a run of
 * its own over the request's own past, between the running requests' decode steps: a long prompt
 * then holds the running streams back by one chunk per token rather than by its whole prefill.
 * The chunk is sized so that its run takes about as long as the batch's decode step (measured as
 * they run; see chunkBounds), unless the executor fixes it. Decoders that quantise per tensor
 * neither chunk nor use the prefix cache: a piece's scale would differ from the whole prompt's.
 */

/**
 * Whether the model adds position biases to its attention scores (ALiBi: BLOOM, MPT, Falcon's
 * alibi variant), which its export adds where the mask is added, and the shared-cache rewrite
 * would drop with the mask.
 */
const addsScoreBiases = (model: ModelDirectory): boolean => {
  const config = model.rawConfig
  const text = (config.text_config ?? config) as Record<string, unknown>
  return (
    text.alibi === true ||
    ["bloom", "mpt", "baichuan"].includes(String(text.model_type ?? "")) ||
    (typeof text.attn_config === "object" &&
      text.attn_config !== null &&
      "alibi" in text.attn_config &&
      text.attn_config.alibi === true)
  )
}

/** The dtypes whose exports quantise activations with DynamicQuantizeLinear. */
const dynamicallyQuantised: ReadonlyArray<Dtype> = ["q8", "int8", "uint8"]

/**
 * Whether the decoder file quantises activations with one scale over its input: it has a
 * DynamicQuantizeLinear node (its op type is in the file as written; only 8-bit exports are read).
 */
const quantisesPerTensor = async (files: DecoderFiles, bytes: () => Promise<Buffer>): Promise<boolean> =>
  dynamicallyQuantised.includes(files.dtype) && (await bytes()).includes("DynamicQuantizeLinear")
import { readFile } from "node:fs/promises"
import { dirname } from "node:path"
import * as ort from "onnxruntime-node"
import { type DecoderFiles, type DecoderInterface, decoderFiles, decoderInterface } from "../../models/DecoderLayout.js"
import type { Dtype } from "../../models/Dtype.js"
import { floatsOf, halvesOf } from "../../models/Float16.js"
import type { ModelDirectory } from "../../models/ModelDirectory.js"
import { rewriteRowQuantization } from "../../models/onnx/RowQuantizeRewrite.js"
import { rewriteSharedCache, sharedCacheInputs } from "../../models/onnx/SharedCacheRewrite.js"
import { createSession, qwen2VLGridInput } from "../common/Sessions.js"
import { KvStore } from "./KvStore.js"
import { kvBlockTokens } from "./Limits.js"
import { type CacheArray, type CachedRow, gatherRows, type PastData, rightAlignedMask } from "./PastCache.js"
import { chainKeys, mediaDigests, PrefixCache } from "./PrefixCache.js"
import type {
  KvCacheStats,
  MediaInput,
  MediaSpan,
  PrefixCacheStats,
  PromptInput,
  SamplingParams,
  StepOp,
  TokenPartial
} from "./protocol.js"
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
  /** While its prompt is being prefilled (its cache holds the first `length` positions). */
  prefill?: Prefill
  /** With a prefix cache: its tokens so far (prompt, then generated) and its media's digests, for its blocks when it finishes. */
  readonly history?: { readonly ids: Array<number>; readonly media: ReadonlyMap<number, ReadonlyArray<Buffer>> }
}

interface Prefill {
  readonly prompt: PromptInput
  readonly located: ReturnType<typeof promptPositions>
  /** Its whole blocks' prefix cache keys (none without the cache). */
  readonly keys: ReadonlyArray<string>
  /** Media rows encoded for an earlier piece, by span, for spans that several pieces cover. */
  readonly features: Map<MediaSpan, Float32Array>
}

/**
 * How a decoder that quantises activations per tensor runs: each request apart (exact), decode
 * steps batched with per-row scales, or (to show what that avoids) batched as exported.
 */
export type QuantizedRows = "apart" | "per-row" | "as-exported"

/**
 * Where the KV cache lives: "shared", in buffers the runner owns, the decoder's attention
 * rewritten at load time to read them in place and hand out only each run's new positions
 * (SharedCacheRewrite.ts; the default, where the graph matches); "copies", the decoder as
 * exported, its whole cache concatenated and handed out anew at every step.
 */
export type KvCacheMode = "shared" | "copies"

/** How prompts are prefilled: the prefix cache's bound, and the tokens a step prefills while others decode. */
export interface PrefillOptions {
  /** Bytes the prefix cache may hold; 0 turns it off (default 512 MiB). */
  readonly prefixCacheBytes?: number
  /** Bytes the shared KV cache's rows may take (default: no bound). */
  readonly kvStoreBytes?: number
  /** Positions per prefix cache block (default 16). */
  readonly prefixBlockTokens?: number
  /**
   * Prompt tokens a step prefills while other requests decode: "auto" sizes it so that it runs
   * no longer than their decode step (the default); 0 prefills each prompt whole.
   */
  readonly chunkTokens?: number | "auto"
}

/**
 * The adaptive chunk's bounds, and the time it aims to take, as a share of the decode step's.
 * On a CPU, a run of one row reads every weight as a decode step does: a chunk of a few tokens
 * costs about a decode step, while each token in it costs several times what it would in a long
 * chunk. At least 16 tokens keeps a long prompt's own prefill within a few times its whole
 * prefill's; running streams then slow by about one decode step's time per token while it joins.
 */
const chunkBounds = { initial: 32, min: 16, max: 512, ofDecodeStep: 1 }
const defaultPrefixCacheBytes = 512 * 1024 * 1024
const defaultPrefixBlockTokens = 16

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
  /** A stats item's answer. */
  | { readonly prefixCache: PrefixCacheStats | undefined; readonly kvCache?: KvCacheStats }

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

/** The past of a sequence whose cache is in the shared store. */
const detached: Past = { tensors: [], width: 0 }

const metadataOf = (values: ReadonlyArray<ort.InferenceSession.ValueMetadata>) =>
  values.flatMap((value) => (value.isTensor ? [{ name: value.name, type: value.type, shape: value.shape }] : []))

export class Runner implements StepRunner {
  private readonly sequences = new Map<string, Sequence>()
  /** The cache, with a decoder rewritten onto it; absent, each run's present is the next past. */
  private readonly store: KvStore | undefined
  /** The batch the last decode step ran, in row order, and its output past. */
  private batch: { readonly order: ReadonlyArray<string>; readonly past: Past } | undefined
  private readonly heads: number
  private readonly headDim: number
  private readonly hidden: number
  private readonly vocab: number
  private readonly padId: number
  /** Schemas and the tokenizer's vocabulary index, for requests with a response format. */
  private readonly constraints: Constraints
  /** Requests whose prompts are being prefilled, in the order they joined. */
  private prefilling: Array<string> = []
  readonly prefixCache: PrefixCache | undefined
  /** Whether prompts are prefilled in chunks while others decode, and the chunk's size now. */
  private readonly chunking: "auto" | "fixed" | "off"
  private chunkTokens: number
  /** How long the last decode step took (ms), which an adaptive chunk aims below. */
  private decodeMs: number | undefined

  private constructor(
    private readonly model: ModelDirectory,
    /** The files it runs: layout and dtype. */
    readonly files: DecoderFiles,
    /** Each prompt is prefilled alone and whole: the decoder's scale spans a prompt's tokens (see above). */
    readonly promptsApart: boolean,
    /** Each request's decode steps run apart too: the decoder's answer for a row depends on the others. */
    readonly rowsApart: boolean,
    private readonly io: DecoderInterface,
    private readonly embed: ort.InferenceSession | undefined,
    private readonly decoder: ort.InferenceSession,
    /** Runs of several rows, on a decoder that quantises per tensor: the per-row rewrite of `decoder`. */
    private readonly rowsDecoder: ort.InferenceSession | undefined,
    private readonly encoders: { readonly vision?: ort.InferenceSession; readonly audio?: ort.InferenceSession },
    prefill: PrefillOptions,
    /** With a decoder rewritten onto a shared cache, "shared"; else why it runs as exported. */
    readonly kvCache: { readonly mode: KvCacheMode; readonly reason?: string }
  ) {
    const spec = model.decoder!
    this.store =
      kvCache.mode === "shared"
        ? new KvStore(
            io.cache.length,
            io.kvHeads,
            io.headDim,
            io.cacheType === "float16",
            kvBlockTokens,
            prefill.kvStoreBytes
          )
        : undefined
    this.heads = io.kvHeads
    this.headDim = io.headDim
    this.hidden = spec.hiddenSize
    this.vocab = spec.vocabSize
    this.padId = model.config.pad_token_id ?? 0
    this.constraints = new Constraints(model, spec.vocabSize)
    const cacheBytes = prefill.prefixCacheBytes ?? defaultPrefixCacheBytes
    this.prefixCache =
      promptsApart || cacheBytes === 0
        ? undefined
        : new PrefixCache(prefill.prefixBlockTokens ?? defaultPrefixBlockTokens, cacheBytes, {
            tensors: io.cache.length,
            heads: io.kvHeads,
            headDim: io.headDim,
            half: io.cacheType === "float16"
          })
    const chunk = prefill.chunkTokens ?? "auto"
    this.chunking = promptsApart || chunk === 0 ? "off" : chunk === "auto" ? "auto" : "fixed"
    this.chunkTokens = chunk === "auto" ? chunkBounds.initial : chunk
  }

  /** Opens the model's decoder files at `dtype` (by default fp32, or the closest there is). */
  static async open(
    model: ModelDirectory,
    device: string,
    threads: number,
    dtype?: Dtype,
    /** How a decoder that quantises per tensor runs (see above), and how to prefill. */
    options: { readonly quantizedRows?: QuantizedRows; readonly kvCache?: KvCacheMode } & PrefillOptions = {}
  ): Promise<Runner> {
    const spec = model.decoder
    if (spec === undefined) throw new Error(`${model.path} is not a decoder: its config.json has no vocab_size`)
    const files = decoderFiles(model, dtype)
    // Only the decoder's threads spin between runs: the others run briefly before it, on the same cores.
    const session = (path: string | undefined, spin = false) =>
      path === undefined ? Promise.resolve(undefined) : createSession(path, device, threads, { spin })
    const mode = options.quantizedRows ?? "apart"
    // The decoder file is read once, when a check or a rewrite first needs it.
    let read: Promise<Buffer> | undefined
    const bytes = () => {
      read ??= readFile(files.decoder)
      return read
    }
    const quantises = await quantisesPerTensor(files, bytes)
    const perTensor = mode !== "as-exported" && quantises
    const perRow = mode === "per-row" && perTensor ? rewriteRowQuantization(await bytes()) : undefined
    const rewritten = perRow !== undefined && perRow.rewritten > 0
    const geometry = { heads: spec.heads, kvHeads: spec.keyValueHeads, headDim: spec.headDim }
    const shared =
      (options.kvCache ?? "shared") === "copies"
        ? { reason: "the executor runs the cache as exported" }
        : quantises && mode !== "per-row"
          ? {
              reason:
                mode === "apart"
                  ? "the decoder quantises its activations per tensor, so each request runs apart on the export as it is, answering as transformers.js does"
                  : "the decoder runs as exported"
            }
          : spec.slidingWindow !== undefined
            ? { reason: "the model attends within a sliding window" }
            : addsScoreBiases(model)
              ? { reason: "the model adds position biases (ALiBi) to its attention scores" }
              : !device.startsWith("cpu")
                ? // ONNX Runtime's CUDA GroupQueryAttention takes float16 alone; the rewrite is built and measured on CPUs.
                  { reason: "the shared cache is built for CPU devices" }
                : rewriteSharedCache(await bytes(), geometry)
    // Runs of several rows on the per-row rewrite: on the shared cache too when the decoder is.
    const sharedRows =
      rewritten && shared.bytes !== undefined ? rewriteSharedCache(perRow.bytes, geometry).bytes : undefined
    const onShared = shared.bytes !== undefined && (!rewritten || sharedRows !== undefined)
    const [embed, decoder, rowsDecoder, vision, audio] = await Promise.all([
      session(files.embedTokens),
      onShared
        ? createSession(shared.bytes!, device, threads, { spin: true, externalDataFolder: dirname(files.decoder) })
        : session(files.decoder, true),
      rewritten ? createSession(sharedRows ?? perRow.bytes, device, threads, { spin: true }) : undefined,
      session(files.vision),
      session(files.audio)
    ])
    const own = new Set<string>(Object.values(sharedCacheInputs))
    const io = decoderInterface(
      metadataOf(decoder!.inputMetadata).filter((value) => !own.has(value.name)),
      metadataOf(decoder!.outputMetadata),
      { layers: spec.layers, kvHeads: spec.keyValueHeads, headDim: spec.headDim },
      files.decoder.slice(model.path.length + 1),
      model.path
    )
    return new Runner(
      model,
      files,
      perTensor,
      perTensor && !rewritten,
      io,
      embed,
      decoder!,
      rowsDecoder,
      {
        ...(vision === undefined ? {} : { vision }),
        ...(audio === undefined ? {} : { audio })
      },
      options,
      onShared
        ? { mode: "shared" }
        : {
            mode: "copies",
            reason: "reason" in shared ? shared.reason : "the per-row rewrite did not take the shared cache"
          }
    )
  }

  /** Requests whose cache this runner holds. */
  get held(): ReadonlyArray<string> {
    return [...this.sequences.keys()]
  }

  /**
   * Runs one step: frees, embeddings, prefills (the pieces of the prompts being prefilled that
   * this step's budget allows; a prompt done gives its first token), then one decode for the
   * batch, which is the decode items and the prompts done that go on. `emit(index, token)`
   * reports each token as soon as it is sampled. Answers each embed and stats item's output at
   * its index.
   */
  async step(
    items: ReadonlyArray<StepItem>,
    emit: (index: number, partial: TokenPartial) => void
  ): Promise<Array<EmbedOutput | undefined>> {
    const outputs: Array<EmbedOutput | undefined> = items.map(() => undefined)
    const indexOf = new Map(items.map((item, index) => [item.id, index]))
    const take = (id: string, partial: TokenPartial) => {
      const index = indexOf.get(id)
      if (index !== undefined) emit(index, partial)
    }
    for (const item of items) if (item.op.op === "free") this.forget(item.id)
    for (const [index, item] of items.entries()) {
      if (item.op.op === "embed") outputs[index] = await this.embedPrompt(item.op.prompt, item.op.source)
      else if (item.op.op === "stats")
        outputs[index] = {
          prefixCache: this.prefixCache?.stats,
          kvCache: { ...this.kvCache, bytes: this.store?.bytes ?? 0 }
        }
    }
    for (const item of items) if (item.op.op === "prefill") this.join(item.id, item.op.prompt, item.op.sampling)
    // A prefilling request's decode item waits for its prompt: its pieces follow the budget.
    const decoding = items.flatMap((item) =>
      item.op.op === "decode" && this.sequences.get(item.id)?.prefill === undefined && this.sequences.has(item.id)
        ? [item.id]
        : []
    )
    // The budget binds while any request decodes, in this step or (a step of other items) the next.
    const done = await this.prefillPieces(this.sequences.size > this.prefilling.length, take, (id) => indexOf.has(id))
    decoding.push(...done.filter((id) => this.sequences.has(id)))
    if (decoding.length > 0) {
      const started = performance.now()
      if (this.rowsApart) for (const id of decoding) await this.decode([id], take)
      else await this.decode(decoding, take)
      this.decodeMs = performance.now() - started
    }
    return outputs
  }

  async close(): Promise<void> {
    this.sequences.clear()
    this.prefilling = []
    this.batch = undefined
    for (const id of this.store?.held ?? []) this.store!.release(id)
    this.prefixCache?.clear()
    await Promise.all(
      [this.embed, this.decoder, this.rowsDecoder, this.encoders.vision, this.encoders.audio].map((session) =>
        session?.release()
      )
    )
  }

  private forget(id: string): void {
    this.sequences.delete(id)
    this.release(id)
    this.prefilling = this.prefilling.filter((other) => other !== id)
  }

  /** Frees a request's row of the shared cache; the rows left give back room they no longer need. */
  private release(id: string): void {
    const store = this.store
    if (store === undefined || !store.has(id)) return
    store.release(id)
    let longest = 0
    for (const sequence of this.sequences.values()) longest = Math.max(longest, sequence.length + 1)
    store.fit(longest)
  }

  /** A request joins: its sequence starts from the prompt's cached blocks, if any. */
  private join(id: string, prompt: PromptInput, sampling: SamplingParams): void {
    const cache = this.prefixCache
    const media = cache === undefined ? undefined : mediaDigests(prompt, cache.blockTokens)
    const keys = cache === undefined ? [] : chainKeys(prompt.inputIds, media!, cache.blockTokens)
    // At least one token runs: its logits give the first token.
    const cached =
      cache === undefined ? 0 : cache.lookup(keys, Math.floor((prompt.inputIds.length - 1) / cache.blockTokens))
    const store = this.store
    const past: Past =
      store !== undefined
        ? (() => {
            const row = store.acquire(id)
            // Room for the whole prompt at once: its chunks then write into the rows as they are.
            store.ensureWidth(prompt.inputIds.length + 1)
            if (cached === 0) return detached
            const read = cache!.read(keys, cached)
            store.ensureWidth(read.width)
            store.writePast(read.tensors, row, read.width)
            return { tensors: [], width: read.width }
          })()
        : cached === 0
          ? { tensors: this.emptyPast(1), width: 0 }
          : (() => {
              const read = cache!.read(keys, cached)
              const dims = [1, this.heads, read.width, this.headDim]
              return { tensors: read.tensors.map((data) => cacheTensor(data, dims)), width: read.width }
            })()
    const located = promptPositions(prompt, this.io.positionAxes)
    this.sequences.set(id, {
      sampler: new Sampler(
        sampling,
        prompt.inputIds,
        sampling.format === undefined ? undefined : this.constraints.decoder(sampling.format)
      ),
      sampling,
      length: past.width,
      positionDelta: located.delta,
      lastToken: 0,
      generated: 0,
      cache: { past, row: 0 },
      prefill: { prompt, located, keys, features: new Map() },
      ...(media === undefined ? {} : { history: { ids: Array.from(prompt.inputIds), media } })
    })
    this.prefilling.push(id)
  }

  /**
   * This step's prefill pieces, within its budget (no bound when nothing else decodes): prompts
   * that fit whole with nothing cached run as one batch, and every other piece alone over its
   * request's own past; at least one piece runs. Answers the requests whose prompts are done, whose
   * first tokens it has emitted.
   */
  private async prefillPieces(
    othersDecode: boolean,
    take: (id: string, partial: TokenPartial) => void,
    /** Whether the step names the request (its first token can only be emitted at its item). */
    named: (id: string) => boolean
  ) {
    const bounded = othersDecode && this.chunking !== "off"
    let budget = bounded ? this.chunkTokens : Infinity
    const whole: Array<string> = []
    const pieces: Array<{ readonly id: string; readonly count: number }> = []
    for (const id of this.prefilling.filter(named)) {
      const sequence = this.sequences.get(id)!
      const remaining = sequence.prefill!.prompt.inputIds.length - sequence.length
      if (budget <= 0 && whole.length + pieces.length > 0) break
      if (!this.promptsApart && this.store === undefined && sequence.length === 0 && remaining <= budget) {
        whole.push(id)
        budget -= remaining
        continue
      }
      const count = Math.min(remaining, budget > 0 ? budget : this.chunkTokens)
      pieces.push({ id, count })
      budget -= count
    }
    const firsts: Array<{ readonly id: string; readonly logits: Float32Array; readonly row: number }> = []
    if (whole.length > 0) firsts.push(...(await this.prefillWhole(whole)))
    for (const { id, count } of pieces) {
      const started = performance.now()
      const first = await this.prefillPiece(id, count)
      if (first !== undefined) firsts.push(first)
      if (bounded && this.chunking === "auto" && this.decodeMs !== undefined)
        this.resize(count, performance.now() - started)
    }
    const done: Array<string> = []
    for (const { id, logits, row } of firsts) {
      const sequence = this.sequences.get(id)!
      const prefill = sequence.prefill!
      this.prefilling = this.prefilling.filter((other) => other !== id)
      delete sequence.prefill
      if (this.prefixCache !== undefined && prefill.keys.length > 0)
        this.prefixCache.insert(prefill.keys, this.cachedRow(id, sequence))
      this.accept(id, sequence, this.draw(sequence, logits, row), take)
      done.push(id)
    }
    return done
  }

  /** An adaptive chunk after a piece of `count` tokens took `ms`: sized toward its share of a decode step. */
  private resize(count: number, ms: number): void {
    if (count < this.chunkTokens) return
    const target = this.decodeMs! * chunkBounds.ofDecodeStep
    const scale = Math.min(2, Math.max(0.5, target / Math.max(ms, 0.01)))
    this.chunkTokens = Math.min(chunkBounds.max, Math.max(chunkBounds.min, Math.round(this.chunkTokens * scale)))
  }

  /** Prompts with nothing cached, whole, as one batch, left-padded to the longest. */
  private async prefillWhole(ids: ReadonlyArray<string>) {
    const sequences = ids.map((id) => this.sequences.get(id)!)
    const prompts = sequences.map((sequence) => sequence.prefill!.prompt)
    const lengths = prompts.map((prompt) => prompt.inputIds.length)
    const width = Math.max(...lengths)
    const axes = this.io.positionAxes
    const batch = ids.length
    // Padding takes position 1, as transformers gives masked positions; the mask hides it anyway.
    const positions = new BigInt64Array(axes * batch * width).fill(1n)
    lengths.forEach((length, row) => {
      const located = sequences[row]!.prefill!.located
      for (let axis = 0; axis < axes; axis++) {
        const base = (axis * batch + row) * width + width - length
        for (let p = 0; p < length; p++) positions[base + p] = BigInt(located.at(axis, p))
      }
    })
    const outputs = await this.runDecoder(
      await this.promptTokens(prompts, width),
      rightAlignedMask(lengths, width),
      positions,
      [batch, width],
      this.emptyPast(batch)
    )
    const past: Past = { tensors: this.presents(outputs), width }
    const logits = this.lastLogits(outputs.logits!, batch)
    return sequences.map((sequence, row) => {
      sequence.length = lengths[row]!
      sequence.cache = { past, row }
      return { id: ids[row]!, logits, row }
    })
  }

  /**
   * The next `count` tokens of a request's prompt, alone, over its own past; its logits when
   * that ends the prompt.
   */
  private async prefillPiece(id: string, count: number) {
    const sequence = this.sequences.get(id)!
    const prefill = sequence.prefill!
    const from = sequence.length
    const to = from + count
    const axes = this.io.positionAxes
    const positions = new BigInt64Array(axes * count)
    for (let axis = 0; axis < axes; axis++)
      for (let p = from; p < to; p++) positions[axis * count + p - from] = BigInt(prefill.located.at(axis, p))
    const tokens = await this.pieceTokens(prefill, from, to)
    const store = this.store
    if (store !== undefined) {
      store.ensureWidth(to)
      const row = store.row(id)
      const outputs = await this.runDecoder(
        tokens,
        new BigInt64Array(to).fill(1n),
        positions,
        [1, count],
        this.storePast(row, 1),
        {
          seqlens: Int32Array.of(to - 1),
          total: to
        }
      )
      this.presents(outputs).forEach((present, t) => store.write(t, row, from, present.data as CacheArray, 0, count))
      sequence.length = to
      if (to < prefill.prompt.inputIds.length) return undefined
      return { id, logits: this.lastLogits(outputs.logits!, 1), row: 0 }
    }
    const outputs = await this.runDecoder(
      tokens,
      new BigInt64Array(to).fill(1n),
      positions,
      [1, count],
      sequence.cache.past.tensors
    )
    sequence.length = to
    sequence.cache = { past: { tensors: this.presents(outputs), width: to }, row: 0 }
    if (to < prefill.prompt.inputIds.length) return undefined
    return { id, logits: this.lastLogits(outputs.logits!, 1), row: 0 }
  }

  private async decode(ids: ReadonlyArray<string>, take: (id: string, partial: TokenPartial) => void): Promise<void> {
    const sequences = ids.map((id) => this.sequences.get(id)!)
    const lastTokens = BigInt64Array.from(sequences, (sequence) => BigInt(sequence.lastToken))
    const tokens =
      this.embed === undefined
        ? int64(lastTokens, [ids.length, 1])
        : (await this.embed.run({ input_ids: int64(lastTokens, [ids.length, 1]) })).inputs_embeds!
    const store = this.store
    if (store !== undefined) {
      // A request alone reads its row where it is (requests run apart take this path every step).
      const first = ids.length === 1 ? store.row(ids[0]!) : 0
      if (ids.length > 1) store.arrange(ids)
      const lengths = sequences.map((sequence) => sequence.length)
      const total = Math.max(...lengths) + 1
      store.ensureWidth(total)
      const outputs = await this.runDecoder(
        tokens,
        rightAlignedMask(
          lengths.map((length) => length + 1),
          total
        ),
        this.decodePositions(sequences),
        [ids.length, 1],
        this.storePast(first, ids.length),
        { seqlens: Int32Array.from(lengths), total }
      )
      this.presents(outputs).forEach((present, t) =>
        lengths.forEach((length, row) => store.write(t, first + row, length, present.data as CacheArray, row, 1))
      )
      const logits = this.lastLogits(outputs.logits!, ids.length)
      ids.forEach((id, row) => {
        const sequence = sequences[row]!
        sequence.length++
        this.accept(id, sequence, this.draw(sequence, logits, row), take)
      })
      return
    }
    const past = this.batchPast(ids, sequences)
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
    sequence.history?.ids.push(token)
    if (finish !== undefined) {
      this.sequences.delete(id)
      this.keepBlocks(id, sequence)
      this.release(id)
    }
    const logprobs = sequence.sampler.lastLogprobs
    take(id, {
      token,
      ...(finish === undefined ? {} : { finish }),
      ...(logprobs === undefined ? {} : { logprob: logprobs.logprob, top: logprobs.top })
    })
  }

  /**
   * A finished request's blocks, its generated tokens' included, for the prefix cache: the next
   * turn of a chat begins with them. Its cache holds every token but the last.
   */
  private keepBlocks(id: string, sequence: Sequence): void {
    const { history } = sequence
    if (this.prefixCache === undefined || history === undefined || sequence.prefill !== undefined) return
    const keys = chainKeys(
      Int32Array.from(history.ids.slice(0, sequence.length)),
      history.media,
      this.prefixCache.blockTokens
    )
    if (keys.length === 0) return
    this.prefixCache.insert(keys, this.cachedRow(id, sequence))
  }

  /** Where a request's cached positions lie, for the prefix cache to copy. */
  private cachedRow(id: string, sequence: Sequence) {
    const store = this.store
    if (store !== undefined)
      return {
        past: { tensors: store.data, width: store.width },
        row: store.row(id),
        length: sequence.length,
        start: 0
      }
    const { past, row } = sequence.cache
    return {
      past: { tensors: past.tensors.map((tensor) => tensor.data as CacheArray), width: past.width },
      row,
      length: sequence.length
    }
  }

  private presents(outputs: ort.InferenceSession.ReturnType): ReadonlyArray<ort.Tensor> {
    return this.io.cache.map((names) => outputs[names.output]!)
  }

  /** The shared cache's rows [from, from + count) as the decoder's past, as they lie. */
  private storePast(from: number, count: number): ReadonlyArray<ort.Tensor> {
    const store = this.store!
    const dims = [count, this.heads, store.width, this.headDim]
    return this.io.cache.map((_, t) => cacheTensor(store.view(t, from, count), dims))
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
    past: ReadonlyArray<ort.Tensor>,
    /** For a decoder on the shared cache: each row's length after the run, less one, and the longest. */
    lengths?: { readonly seqlens: Int32Array; readonly total: number }
  ): Promise<ort.InferenceSession.ReturnType> {
    const [batch, length] = shape
    const feeds: Record<string, ort.Tensor> = {
      [this.io.tokens]: tokens,
      attention_mask: int64(mask, [batch, mask.length / batch])
    }
    if (lengths !== undefined) {
      feeds[sharedCacheInputs.seqlens] = new ort.Tensor("int32", lengths.seqlens, [batch])
      feeds[sharedCacheInputs.total] = new ort.Tensor("int32", Int32Array.of(lengths.total), [])
    }
    if (this.io.positionIds)
      feeds.position_ids = int64(positions, this.io.positionAxes === 3 ? [3, batch, length] : [batch, length])
    if (this.io.useCacheBranch)
      feeds.use_cache_branch = new ort.Tensor("bool", Uint8Array.of(past[0]!.dims[2]! > 0 ? 1 : 0), [1])
    if (this.io.numLogitsToKeep) feeds.num_logits_to_keep = new ort.Tensor("int64", BigInt64Array.of(1n), [])
    this.io.cache.forEach((names, i) => (feeds[names.input] = past[i]!))
    return (batch > 1 && this.rowsDecoder !== undefined ? this.rowsDecoder : this.decoder).run(feeds)
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
    spans.forEach(({ span, base }, index) => this.placeSpan(embeds, span, rows[index]!, base, 0, Infinity))
    return embeds
  }

  /** The decoder's token input for positions [from, to) of a prompt being prefilled, as one row. */
  private async pieceTokens(prefill: Prefill, from: number, to: number): Promise<ort.Tensor> {
    const { prompt } = prefill
    const count = to - from
    if (this.embed === undefined) {
      if (prompt.media.length > 0)
        throw new Error(
          `${this.model.path} is a text-only export (onnx/model.onnx takes input_ids), so it cannot take media`
        )
      return int64(BigInt64Array.from(prompt.inputIds.subarray(from, to), BigInt), [1, count])
    }
    const ids = int64(BigInt64Array.from(prompt.inputIds.subarray(from, to), BigInt), [1, count])
    const embeds = new Float32Array(float32Data((await this.embed.run({ input_ids: ids })).inputs_embeds!))
    const last = (span: MediaSpan) =>
      span.positions === undefined ? span.start + span.rows - 1 : span.positions[span.rows - 1]!
    const spans = prompt.media.filter((span) => span.start < to && last(span) >= from)
    // A span that later pieces also cover keeps its rows until the prompt is done.
    const missing = spans.filter((span) => !prefill.features.has(span))
    const encoded = await this.mediaRows(missing.map((span) => span.input))
    missing.forEach((span, index) => {
      if (last(span) >= to) prefill.features.set(span, encoded[index]!)
    })
    spans.forEach((span) => {
      const features = prefill.features.get(span) ?? encoded[missing.indexOf(span)]!
      this.placeSpan(embeds, span, features, -from, from, to)
      if (last(span) < to) prefill.features.delete(span)
    })
    return floatsAs(this.io.embedsType, embeds, [1, count, this.hidden])
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
    if (features.length !== span.rows * this.hidden) {
      throw new Error(
        `a media item gave ${features.length / this.hidden} rows of ${this.hidden} for ${span.rows} placeholders`
      )
    }
    for (let i = 0; i < span.rows; i++) {
      const position = span.positions === undefined ? span.start + i : span.positions[i]!
      if (position < from || position >= to) continue
      embeds.set(features.subarray(i * this.hidden, (i + 1) * this.hidden), (base + position) * this.hidden)
    }
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
    if (this.store !== undefined) {
      feeds[sharedCacheInputs.seqlens] = new ort.Tensor("int32", Int32Array.of(length - 1), [1])
      feeds[sharedCacheInputs.total] = new ort.Tensor("int32", Int32Array.of(length), [])
    }
    const outputs = await this.decoder.run(feeds, [output])
    const states = outputs[output]!
    return {
      embedding: new Float32Array(float32Data(states)),
      shape: [length, states.dims[states.dims.length - 1]!]
    }
  }
}
