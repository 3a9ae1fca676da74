/**
 * Which decoder graph the LLM runner opens, with which load-time rewrites, and why: a pure
 * decision over what is known of the model, its file and the device, then over what the rewrites
 * gave. Opening the sessions (DecoderSessions.ts) follows it.
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
 * opened rewritten (SharedCacheRewrite.ts) to attend over a cache the runner owns
 * (SharedKvLayout.ts). Otherwise (a graph that does not match, a decoder that quantises per
 * tensor, a sliding-window model, a model with ALiBi, a device other than a CPU, or
 * `kvCache: "copies"`) the decoder runs as exported (CopiedKvLayout.ts).
 */

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

/** What is known before any rewrite: the executor's settings, the model, its file and the device. */
export interface DecoderFacts {
  readonly quantizedRows: QuantizedRows
  readonly kvCache: KvCacheMode
  /** The file quantises its activations with one scale per tensor (DynamicQuantizeLinear). */
  readonly quantisesPerTensor: boolean
  /** The model attends within a sliding window. */
  readonly slidingWindow: boolean
  /** The model adds position biases to its attention scores (ALiBi). */
  readonly scoreBiases: boolean
  readonly device: string
}

/** The rewrites to try, and what follows from the facts alone. */
export interface DecoderPlan {
  /** Each prompt is prefilled alone and whole, and the prefix cache is off: the decoder's scale spans a run's tokens. */
  readonly promptsApart: boolean
  /** Rewrite the decoder to quantise per row, for runs of several rows. */
  readonly rowRewrite: boolean
  /** Rewrite the decoder onto the shared cache, or why it runs as exported. */
  readonly sharedCache: { readonly rewrite: true } | { readonly rewrite: false; readonly reason: string }
}

export const planDecoder = (facts: DecoderFacts): DecoderPlan => {
  const { quantizedRows: mode, quantisesPerTensor: quantises } = facts
  const perTensor = mode !== "as-exported" && quantises
  const notShared = (reason: string) => ({ rewrite: false as const, reason })
  const sharedCache =
    facts.kvCache === "copies"
      ? notShared("the executor runs the cache as exported")
      : quantises && mode !== "per-row"
        ? notShared(
            mode === "apart"
              ? "the decoder quantises its activations per tensor, so each request runs apart on the export as it is, answering as transformers.js does"
              : "the decoder runs as exported"
          )
        : facts.slidingWindow
          ? notShared("the model attends within a sliding window")
          : facts.scoreBiases
            ? notShared("the model adds position biases (ALiBi) to its attention scores")
            : !facts.device.startsWith("cpu")
              ? // ONNX Runtime's CUDA GroupQueryAttention takes float16 alone; the rewrite is built and measured on CPUs.
                notShared("the shared cache is built for CPU devices")
              : { rewrite: true as const }
  return { promptsApart: perTensor, rowRewrite: mode === "per-row" && perTensor, sharedCache }
}

/** What the rewrites the plan asked for gave. */
export interface RewriteResults {
  /** The per-row rewrite changed the graph (it found quantisation nodes to rewrite). */
  readonly rows: boolean
  /** The shared-cache rewrite of the export: matched, or why not. */
  readonly shared: { readonly matched: true } | { readonly matched: false; readonly reason: string } | undefined
  /** The shared-cache rewrite of the per-row rewrite matched. */
  readonly sharedRows: boolean
}

/** The sessions to open and how the runner uses them. */
export interface DecoderChoice {
  /** The graph for runs of one row (and every run, without a rows decoder). */
  readonly decoder: "exported" | "shared"
  /** The graph for runs of several rows, where it differs. */
  readonly rowsDecoder: "rows" | "shared-rows" | undefined
  readonly promptsApart: boolean
  /** Each request's decode steps run apart too: the decoder's answer for a row depends on the others. */
  readonly rowsApart: boolean
  /** With a decoder rewritten onto a shared cache, "shared"; else why it runs as exported. */
  readonly kvCache: { readonly mode: KvCacheMode; readonly reason?: string }
}

/** The sessions to open, after the rewrites: both decoders must take the shared cache for either to. */
export const chooseDecoder = (plan: DecoderPlan, results: RewriteResults): DecoderChoice => {
  const rows = plan.rowRewrite && results.rows
  const matched = results.shared?.matched === true
  const onShared = matched && (!rows || results.sharedRows)
  const reason = !plan.sharedCache.rewrite
    ? plan.sharedCache.reason
    : results.shared !== undefined && !results.shared.matched
      ? results.shared.reason
      : "the per-row rewrite did not take the shared cache"
  return {
    decoder: onShared ? "shared" : "exported",
    rowsDecoder: rows ? (onShared ? "shared-rows" : "rows") : undefined,
    promptsApart: plan.promptsApart,
    rowsApart: plan.promptsApart && !rows,
    kvCache: onShared ? { mode: "shared" } : { mode: "copies", reason }
  }
}

/**
 * Whether the model adds position biases to its attention scores (ALiBi: BLOOM, MPT, Falcon's
 * alibi variant), which its export adds where the mask is added, and the shared-cache rewrite
 * would drop with the mask.
 */
export const addsScoreBiases = (config: Readonly<Record<string, unknown>>): boolean => {
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
