/**
 * The model side of the LLM executor, on one device: the model's sessions (the decoder with its KV cache; in the split
 * layout also embed_tokens and the encoders it has) and the caches of the requests it runs. The engine drives it one
 * step at a time; a step prefills the requests that join (their first token), then decodes one token for every
 * request in the batch. How the decoder is called (input_ids or inputs_embeds, position_ids or not, the cache's names
 * and precision) is read from its graph.
 *
 * The runner executes what others decide: which graph it opens and why (DecoderPlan.ts, DecoderSessions.ts), what
 * each step runs (StepPlanner.ts), where the KV cache lies (KvLayout.ts: shared, or the decoder's copies), the token
 * input (TokenInputs.ts, with MediaEncoders.ts's encoders), and which prompt blocks are cached (PrefixCache.ts).
 */
import * as ort from "onnxruntime-node"
import type { DecoderFiles, DecoderInterface } from "../../models/DecoderLayout.js"
import type { Dtype } from "../../models/Dtype.js"
import type { ModelDirectory } from "../../models/ModelDirectory.js"
import { sharedCacheInputs } from "../../models/onnx/SharedCacheRewrite.js"
import { Constraints } from "./Constraints.js"
import type { DecoderChoice } from "./DecoderPlan.js"
import { type DecoderOptions, type DecoderSessions, openDecoderSessions } from "./DecoderSessions.js"
import { CopiedKvLayout } from "./CopiedKvLayout.js"
import { defaultPrefixCacheBytes } from "./Limits.js"
import type { KvGeometry, KvLayout, KvRun, RunPast } from "./KvLayout.js"
import type { PastData } from "./PastCache.js"
import { paddedPositions, piecePositions, type PromptPositions, promptPositions, stepPositions } from "./PositionIds.js"
import { chainKeys, defaultPrefixBlockTokens, mediaDigests, PrefixCache } from "./PrefixCache.js"
import type { MediaSpan, PromptInput, SamplingParams, TokenPartial } from "./protocol.js"
import { Sampler } from "./Sampler.js"
import { SharedKvLayout } from "./SharedKvLayout.js"
import { DecoderClock, type EmbedOutput, type StepItem, type StepRunner } from "./StepRunner.js"
import { type PlannerOptions, type StepPlan, StepPlanner } from "./StepPlanner.js"
import { float32Data, floatsAs, int64, lastRows } from "./Tensors.js"
import { TokenInputs } from "./TokenInputs.js"

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
  /** While its prompt is being prefilled (its cache holds the first `length` positions). */
  prefill?: Prefill
  /** With a prefix cache: its tokens so far (prompt, then generated) and its media's digests, for its blocks when it finishes. */
  readonly history?: { readonly ids: Array<number>; readonly media: ReadonlyMap<number, ReadonlyArray<Buffer>> }
}

interface Prefill {
  readonly prompt: PromptInput
  readonly located: PromptPositions
  /** Its whole blocks' prefix cache keys (none without the cache). */
  readonly keys: ReadonlyArray<string>
  /** Media rows encoded for an earlier piece, by span, for spans that several pieces cover. */
  readonly features: Map<MediaSpan, Float32Array>
}

/** How prompts are prefilled: the prefix cache's bound, and the tokens a step prefills while others decode. */
export interface PrefillOptions extends Pick<PlannerOptions, "chunkTokens"> {
  /** Bytes the prefix cache may hold; 0 turns it off (default 512 MiB). */
  readonly prefixCacheBytes?: number
  /** Bytes the shared KV cache's rows may take (default: no bound). */
  readonly kvStoreBytes?: number
  /** Positions per prefix cache block (default 16). */
  readonly prefixBlockTokens?: number
}

type Take = (id: string, partial: TokenPartial) => void

export class Runner implements StepRunner {
  private readonly sequences = new Map<string, Sequence>()
  /** The decoder's runs in steps (prefills and decodes), and their seconds. */
  private readonly clock = new DecoderClock()
  private readonly kv: KvLayout
  private readonly planner: StepPlanner
  private readonly tokens: TokenInputs
  private readonly io: DecoderInterface
  private readonly decoder: ort.InferenceSession
  /** Runs of several rows, on a decoder that quantises per tensor: the per-row rewrite of `decoder`. */
  private readonly rowsDecoder: ort.InferenceSession | undefined
  private readonly hidden: number
  private readonly vocab: number
  /** What a step reads of the decoder's outputs: logits and the cache (not its hidden states). */
  private readonly fetches: ReadonlyArray<string>
  /** Schemas and the tokenizer's vocabulary index, for requests with a response format. */
  private readonly constraints: Constraints
  /** Requests whose prompts are being prefilled, in the order they joined. */
  private prefilling: Array<string> = []
  readonly prefixCache: PrefixCache | undefined
  /** The files it runs: layout and dtype. */
  readonly files: DecoderFiles
  /** Each prompt is prefilled alone and whole: the decoder's scale spans a prompt's tokens (DecoderPlan.ts). */
  readonly promptsApart: boolean
  /** Each request's decode steps run apart too: the decoder's answer for a row depends on the others. */
  readonly rowsApart: boolean
  /** With a decoder rewritten onto a shared cache, "shared"; else why it runs as exported. */
  readonly kvCache: DecoderChoice["kvCache"]
  /** Its cache tensors (each layer's key and value): their count, heads, head size and precision. */
  readonly cacheGeometry: KvGeometry
  /** With a packed-weights folder: where its decoder's packed weights came from (PackedWeights.ts). */
  readonly packedWeights: DecoderSessions["packedWeights"]

  private constructor(model: ModelDirectory, sessions: DecoderSessions, prefill: PrefillOptions) {
    const spec = model.decoder!
    const { choice, io } = sessions
    this.files = sessions.files
    this.packedWeights = sessions.packedWeights
    this.promptsApart = choice.promptsApart
    this.rowsApart = choice.rowsApart
    this.kvCache = choice.kvCache
    this.io = io
    this.decoder = sessions.decoder
    this.rowsDecoder = sessions.rowsDecoder
    this.hidden = spec.hiddenSize
    this.vocab = spec.vocabSize
    this.fetches = ["logits", ...io.cache.map((names) => names.output)]
    this.constraints = new Constraints(model, spec.vocabSize)
    this.tokens = new TokenInputs(
      model.path,
      sessions.embed,
      sessions.encoders,
      spec.hiddenSize,
      io.embedsType,
      model.config.pad_token_id ?? 0
    )
    const geometry = {
      tensors: io.cache.length,
      heads: io.kvHeads,
      headDim: io.headDim,
      half: io.cacheType === "float16"
    }
    this.cacheGeometry = geometry
    this.kv =
      choice.kvCache.mode === "shared"
        ? new SharedKvLayout(geometry, prefill.kvStoreBytes)
        : new CopiedKvLayout(geometry)
    this.planner = new StepPlanner({
      ...(prefill.chunkTokens === undefined ? {} : { chunkTokens: prefill.chunkTokens }),
      promptsApart: choice.promptsApart,
      rowsApart: choice.rowsApart,
      batchesPrompts: this.kv.batchesPrompts
    })
    const cacheBytes = prefill.prefixCacheBytes ?? defaultPrefixCacheBytes
    this.prefixCache =
      choice.promptsApart || cacheBytes === 0
        ? undefined
        : new PrefixCache(prefill.prefixBlockTokens ?? defaultPrefixBlockTokens, cacheBytes, geometry)
  }

  /** Opens the model's decoder files at `dtype` (by default fp32, or the closest there is). */
  static async open(
    model: ModelDirectory,
    device: string,
    threads: number,
    dtype?: Dtype,
    /** How a decoder that quantises per tensor runs (DecoderPlan.ts), where its cache lies, and how to prefill. */
    options: DecoderOptions & PrefillOptions = {}
  ): Promise<Runner> {
    return new Runner(model, await openDecoderSessions(model, device, threads, dtype, options), options)
  }

  /** Requests whose cache this runner holds. */
  get held(): ReadonlyArray<string> {
    return [...this.sequences.keys()]
  }

  /**
   * Runs one step: frees, embeddings, then what the step planner plans: prefill pieces (a prompt
   * done gives its first token), then one decode for the batch, which is the decode items and the
   * prompts done that go on. `emit(index, token)` reports each token as soon as it is sampled.
   * Answers each embed and stats item's output at its index (a stats item's after the step's runs).
   */
  async step(items: ReadonlyArray<StepItem>, emit: (index: number, partial: TokenPartial) => void) {
    const outputs: Array<EmbedOutput | undefined> = items.map(() => undefined)
    const indexOf = new Map(items.map((item, index) => [item.id, index]))
    const take: Take = (id, partial) => {
      const index = indexOf.get(id)
      if (index !== undefined) emit(index, partial)
    }
    for (const item of items) if (item.op.op === "free") this.forget(item.id)
    for (const [index, item] of items.entries())
      if (item.op.op === "embed") outputs[index] = await this.embedPrompt(item.op.prompt, item.op.source)
    for (const item of items)
      if (item.op.op === "prefill") this.join(item.id, item.op.prompt, item.op.sampling, item.imported)
    const plan = this.planner.plan({
      // Its first token can only be emitted at its item: a step prefills the requests it names.
      prefilling: this.prefilling.flatMap((id) => {
        const sequence = this.sequences.get(id)!
        const promptLength = sequence.prefill!.prompt.inputIds.length
        return indexOf.has(id) ? [{ id, length: sequence.length, promptLength }] : []
      }),
      // A prefilling request's decode item waits for its prompt: its pieces follow the budget.
      decoding: items.flatMap((item) =>
        item.op.op === "decode" && this.sequences.get(item.id)?.prefill === undefined && this.sequences.has(item.id)
          ? [item.id]
          : []
      ),
      othersDecode: this.sequences.size > this.prefilling.length
    })
    await this.prefill(plan, take)
    const decoding = plan.decode.filter((id) => this.sequences.has(id))
    if (decoding.length > 0) {
      const started = performance.now()
      if (plan.rowsApart) for (const id of decoding) await this.decode([id], take)
      else await this.decode(decoding, take)
      this.planner.decodeTook(performance.now() - started)
    }
    // Stats last: they count this step's runs, as the worker's step count does.
    for (const [index, item] of items.entries())
      if (item.op.op === "stats")
        outputs[index] = {
          prefixCache: this.prefixCache?.stats,
          kvCache: { ...this.kvCache, bytes: this.kv.bytes },
          decoderRuns: this.clock.reading
        }
    return outputs
  }

  async close(): Promise<void> {
    this.sequences.clear()
    this.prefilling = []
    this.kv.close()
    this.prefixCache?.clear()
    await Promise.all([this.tokens.release(), this.decoder.release(), this.rowsDecoder?.release()])
  }

  private forget(id: string): void {
    this.sequences.delete(id)
    this.release(id)
    this.prefilling = this.prefilling.filter((other) => other !== id)
  }

  /** Frees a request's cache; the rows left may give back room they no longer need. */
  private release(id: string): void {
    let longest = 0
    for (const sequence of this.sequences.values()) longest = Math.max(longest, sequence.length + 1)
    this.kv.release(id, longest)
  }

  /** A request joins from its prompt's cached blocks, if any, or from positions another executor sent (kept out of the prefix cache). */
  private join(id: string, prompt: PromptInput, sampling: SamplingParams, imported?: PastData): void {
    const cache = imported === undefined ? this.prefixCache : undefined
    const media = cache === undefined ? undefined : mediaDigests(prompt, cache.blockTokens)
    const keys = cache === undefined ? [] : chainKeys(prompt.inputIds, media!, cache.blockTokens)
    // At least one token runs: its logits give the first token.
    const cached =
      cache === undefined ? 0 : cache.lookup(keys, Math.floor((prompt.inputIds.length - 1) / cache.blockTokens))
    const read = imported ?? (cached === 0 ? undefined : cache!.read(keys, cached))
    this.kv.join(id, prompt.inputIds.length, read)
    const located = promptPositions(prompt, this.io.positionAxes, this.io.firstPosition)
    this.sequences.set(id, {
      sampler: new Sampler(
        sampling,
        prompt.inputIds,
        sampling.format === undefined ? undefined : this.constraints.decoder(sampling.format)
      ),
      sampling,
      length: read?.width ?? 0,
      positionDelta: located.delta,
      lastToken: 0,
      generated: 0,
      prefill: { prompt, located, keys, features: new Map() },
      ...(media === undefined ? {} : { history: { ids: Array.from(prompt.inputIds), media } })
    })
    this.prefilling.push(id)
  }

  /** Runs a plan's prefill: whole prompts as one batch, then each piece; emits the first token of each prompt done. */
  private async prefill(plan: StepPlan, take: Take): Promise<void> {
    const firsts: Array<{ readonly id: string; readonly logits: Float32Array; readonly row: number }> = []
    if (plan.whole.length > 0) firsts.push(...(await this.prefillWhole(plan.whole)))
    for (const { id, count } of plan.pieces) {
      const started = performance.now()
      const first = await this.prefillPiece(id, count)
      if (first !== undefined) firsts.push(first)
      if (plan.adaptive) this.planner.pieceTook(count, performance.now() - started)
    }
    for (const { id, logits, row } of firsts) {
      const sequence = this.sequences.get(id)!
      const prefill = sequence.prefill!
      this.prefilling = this.prefilling.filter((other) => other !== id)
      delete sequence.prefill
      if (this.prefixCache !== undefined && prefill.keys.length > 0)
        this.prefixCache.insert(prefill.keys, this.kv.row(id, sequence.length))
      this.accept(id, sequence, this.draw(sequence, logits, row), take)
    }
  }

  /** Prompts with nothing cached, whole, as one batch, left-padded to the longest. */
  private async prefillWhole(ids: ReadonlyArray<string>) {
    const sequences = ids.map((id) => this.sequences.get(id)!)
    const prompts = sequences.map((sequence) => sequence.prefill!.prompt)
    const lengths = prompts.map((prompt) => prompt.inputIds.length)
    const width = Math.max(...lengths)
    const positions = paddedPositions(
      sequences.map((sequence, row) => ({ located: sequence.prefill!.located, length: lengths[row]! })),
      width,
      this.io.positionAxes
    )
    const tokens = await this.tokens.prompts(prompts, width)
    const { logits } = await this.run({ kind: "prompts", ids, lengths, width }, tokens, positions, [ids.length, width])
    return sequences.map((sequence, row) => {
      sequence.length = lengths[row]!
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
    const positions = piecePositions(prefill.located, from, to, this.io.positionAxes)
    const tokens = await this.tokens.piece(prefill.prompt, prefill.features, from, to)
    const { logits } = await this.run({ kind: "piece", id, from, to }, tokens, positions, [1, count])
    sequence.length = to
    if (to < prefill.prompt.inputIds.length) return undefined
    return { id, logits, row: 0 }
  }

  private async decode(ids: ReadonlyArray<string>, take: Take): Promise<void> {
    const sequences = ids.map((id) => this.sequences.get(id)!)
    const tokens = await this.tokens.decode(BigInt64Array.from(sequences, (sequence) => BigInt(sequence.lastToken)))
    const lengths = sequences.map((sequence) => sequence.length)
    const positions = stepPositions(
      sequences.map((sequence) => sequence.length + sequence.positionDelta),
      this.io.positionAxes
    )
    // A request that streams its hidden states gets its step input's (its last token's) with its next token.
    const states = sequences.some((sequence) => sequence.sampling.hiddenStates === true)
    const run = await this.run({ kind: "decode", ids, lengths }, tokens, positions, [ids.length, 1], states)
    ids.forEach((id, row) => {
      const sequence = sequences[row]!
      sequence.length++
      const rows = sequence.sampling.hiddenStates === true ? run.states : undefined
      const hidden = rows?.slice(row * this.hidden, (row + 1) * this.hidden)
      this.accept(id, sequence, this.draw(sequence, run.logits, row), take, hidden)
    })
  }

  /** A sequence's next token from its row of the step's logits. */
  private draw(sequence: Sequence, logits: Float32Array, row: number): number {
    const remaining = sequence.sampling.maxNewTokens - sequence.generated
    return sequence.sampler.next(logits, row * this.vocab, this.vocab, remaining)
  }

  private accept(id: string, sequence: Sequence, token: number, take: Take, hidden?: Float32Array) {
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
      ...(logprobs === undefined ? {} : { logprob: logprobs.logprob, top: logprobs.top }),
      ...(hidden === undefined ? {} : { hidden })
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
    this.prefixCache.insert(keys, this.kv.row(id, sequence.length))
  }

  /**
   * One decoder run of `run` with the inputs its graph takes, its past laid out by the KV layout,
   * which keeps its presents; answers each row's logits at its last position (and with `withStates`,
   * its final hidden states, [batch × length × hidden]).
   */
  private async run(
    run: KvRun,
    tokens: ort.Tensor,
    positions: BigInt64Array,
    shape: readonly [batch: number, length: number],
    withStates = false
  ): Promise<{ readonly logits: Float32Array; readonly states?: Float32Array }> {
    const [batch] = shape
    const runPast = this.kv.past(run)
    const feeds = this.feeds(tokens, runPast, positions, shape)
    if (this.io.useCacheBranch)
      feeds.use_cache_branch = new ort.Tensor("bool", Uint8Array.of(runPast.past[0]!.dims[2]! > 0 ? 1 : 0), [1])
    if (this.io.numLogitsToKeep) feeds.num_logits_to_keep = new ort.Tensor("int64", BigInt64Array.of(1n), [])
    const decoder = batch > 1 && this.rowsDecoder !== undefined ? this.rowsDecoder : this.decoder
    const states = withStates ? this.statesOutput : undefined
    const fetches = states === undefined ? this.fetches : [...this.fetches, states]
    const outputs = await this.clock.time(() => decoder.run(feeds, fetches))
    this.kv.write(
      run,
      this.io.cache.map((names) => outputs[names.output]!)
    )
    const logits = lastRows(outputs.logits!, batch, this.vocab)
    return states === undefined ? { logits } : { logits, states: float32Data(outputs[states]!) }
  }

  /** The inputs every run takes: tokens, mask, the shared cache's lengths, positions and past. */
  private feeds(
    tokens: ort.Tensor,
    { past, mask, lengths }: RunPast,
    positions: BigInt64Array,
    [batch, length]: readonly [number, number]
  ): Record<string, ort.Tensor> {
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
    this.io.cache.forEach((names, i) => (feeds[names.input] = past[i]!))
    return feeds
  }

  /** The decoder's output of its final hidden states (DecoderSessions.ts opens it rewritten to give them). */
  private get statesOutput(): string | undefined {
    return hiddenStateOutputs.find((name) => this.decoder.outputNames.includes(name))
  }

  /** The decoder's cache outputs, in cache order. */
  get presentNames(): ReadonlyArray<string> {
    return this.io.cache.map((names) => names.output)
  }

  /**
   * The decoder run over `prompt`'s first `length` positions alone, from nothing or after `after`
   * (its first positions' keys and values), keeping nothing: its `outputs` (hidden states, or the
   * presents: the keys and values of the positions run, or of all of them as exported).
   */
  async runAlone(prompt: PromptInput, length: number, outputs: ReadonlyArray<string>, after?: PastData) {
    const [axes, from, hidden] = [this.io.positionAxes, after?.width ?? 0, this.hidden]
    const rows = this.tokens.embeds ? await this.tokens.promptEmbeds([prompt], prompt.inputIds.length) : undefined
    const feeds = this.feeds(
      rows === undefined
        ? int64(BigInt64Array.from(prompt.inputIds.subarray(from, length), BigInt), [1, length - from])
        : floatsAs(this.io.embedsType, rows.subarray(from * hidden, length * hidden), [1, length - from, hidden]),
      this.kv.past({ kind: "alone", length, ...(after === undefined ? {} : { after }) }),
      piecePositions(promptPositions(prompt, axes, this.io.firstPosition), from, length, axes),
      [1, length - from]
    )
    if (this.io.useCacheBranch) feeds.use_cache_branch = new ort.Tensor("bool", Uint8Array.of(from > 0 ? 1 : 0), [1])
    if (this.io.numLogitsToKeep) feeds.num_logits_to_keep = new ort.Tensor("int64", BigInt64Array.of(1n), [])
    return this.decoder.run(feeds, outputs)
  }

  /**
   * A prompt's embeddings: inputs_embeds as the decoder would take them, or its final hidden states
   * (a decoder that gives none is opened rewritten to: see HiddenStatesOutput.ts), run alone.
   */
  private async embedPrompt(prompt: PromptInput, source: "embed_tokens" | "hidden_states"): Promise<EmbedOutput> {
    const length = prompt.inputIds.length
    if (source === "embed_tokens")
      return this.tokens.embeds
        ? { embedding: await this.tokens.promptEmbeds([prompt], length), shape: [length, this.hidden] }
        : {
            error: `this model is a text-only export (onnx/model.onnx) with no embed_tokens: it gives no input embeddings; ask for source "hidden_states"`
          }
    const output = this.statesOutput
    if (output === undefined)
      return {
        error: `this model's decoder gives no hidden states (no ${hiddenStateOutputs.join(" or ")} output, and no lm_head to read them before); ask for source "embed_tokens"`
      }
    const states = (await this.runAlone(prompt, length, [output]))[output]!
    return { embedding: new Float32Array(float32Data(states)), shape: [length, states.dims.at(-1)!] }
  }
}
