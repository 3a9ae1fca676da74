/**
 * What the LLM executor's router, engine and worker tell each other, inside the framework's wire
 * messages (`WorkItem.meta`, `BatchItem.meta`, partial values, results).
 *
 * Router → engine: one work item per request, keyed by what it asks for. Engine → worker: a step,
 * one batch item per request it touches. A worker keeps each request's KV cache from its prefill
 * until it finishes or the engine frees it.
 */
import { isGuided } from "../../models/JanusModel.js"
import type { EmbeddingSource, FinishReason } from "./api.js"
import type { ResponseFormat } from "./structured/GrammarNodes.js"

/** An image or audio clip for the model's own encoder, or an embedding from the sidecar. */
export type MediaInput =
  /**
   * [1, 3, h, w] for a fixed-size processor; [frames, 3, tile, tile] for Idefics3, whose encoder
   * takes them as one sequence; [patches, C·T·P·P] for Qwen2-VL, with its grid_thw in `thw`.
   */
  | {
      readonly kind: "pixel_values"
      readonly data: Float32Array
      readonly shape: ReadonlyArray<number>
      readonly thw?: readonly [number, number, number]
    }
  | { readonly kind: "input_values"; readonly data: Float32Array; readonly shape: ReadonlyArray<number> }
  /** Ultravox: a clip's Whisper features, [1, mel bins, frames]. */
  | { readonly kind: "audio_values"; readonly data: Float32Array; readonly shape: ReadonlyArray<number> }
  /**
   * An encoder's rows from the sidecar, with the grid its transfer began with (an Idefics3 image's
   * tiles [rows, cols], or a Qwen2-VL image's or video's patches [t, h, w]): what a prefill
   * executor sends on to its decode executor (KvTransferRoutes.ts).
   */
  | {
      readonly kind: "embedding"
      readonly data: Float32Array
      readonly shape: readonly [number, number]
      readonly grid?: readonly [number, number] | readonly [number, number, number]
    }

/**
 * One media item's rows in the prompt: positions [start, start + rows) of inputs_embeds, or, for
 * an item the prompt spells out in pieces (Idefics3's tiles between their position tokens), the
 * positions listed in `positions` (ascending, `rows` of them, the first being `start`).
 */
export interface MediaSpan {
  readonly start: number
  readonly rows: number
  readonly input: MediaInput
  readonly positions?: Int32Array
}

/**
 * Multimodal rotary positions (Qwen2-VL's M-RoPE) of a prompt: [3, prompt length], axis by axis
 * (temporal, height, width), and the delta a token after them adds to its index on every axis.
 * Tokens past `positions` (a continuation's) take index + delta too.
 */
export interface RopePositions {
  readonly positions: Int32Array
  readonly delta: number
}

/** A prompt as the model sees it: token ids with each media placeholder expanded to its rows. */
export interface PromptInput {
  readonly inputIds: Int32Array
  readonly media: ReadonlyArray<MediaSpan>
  /** For a decoder whose position_ids are [3, batch, sequence]; absent, each token's index on all three axes. */
  readonly rope?: RopePositions
}

export interface SamplingParams {
  /** 0 is greedy. */
  readonly temperature: number
  readonly topP: number
  /** Sample among the k most likely tokens only; absent or 0 keeps them all. */
  readonly topK?: number
  /**
   * Logits of tokens already in the sequence (prompt or generated) are divided by it when
   * positive, multiplied when negative; absent or 1 leaves them.
   */
  readonly repetitionPenalty?: number
  /** OpenAI's: subtracted from the logit of each token the completion holds, once (presence) and per time (frequency). */
  readonly presencePenalty?: number
  readonly frequencyPenalty?: number
  /** Report each token's log probability and this many most likely alternatives' (absent: none). */
  readonly logprobs?: number
  /** The output must be JSON of this format: the logits are masked at each step (see Constraints.ts). */
  readonly format?: ResponseFormat
  readonly seed: number
  readonly maxNewTokens: number
  /** Tokens that end the sequence (empty with ignore_eos). */
  readonly stopTokenIds: ReadonlyArray<number>
  /**
   * Image generation (Janus): above 1, each token is chosen with classifier-free guidance over the
   * prompt's row and an unconditional row, which holds KV cache positions of its own.
   */
  readonly guidanceScale?: number
  /** Each decode step's input token's final hidden state goes with the step's token (TokenPartial's `hidden`). */
  readonly hiddenStates?: boolean
}

/** KV cache positions a request reserves: its prompt and every token it may generate, on each row it runs. */
export const cachePositions = (prompt: PromptInput, sampling: SamplingParams): number =>
  (prompt.inputIds.length + sampling.maxNewTokens) * (isGuided(sampling.guidanceScale) ? 2 : 1)

export interface GenerateMeta {
  readonly op: "generate"
  readonly prompt: PromptInput
  readonly sampling: SamplingParams
  /** The KV cache of the prompt's first positions, sent by a prefill executor: taken as it joins. */
  readonly kv?: KvImport
  /** Where the worker streams the hidden states of the tokens it generates (with `sampling.hiddenStates`). */
  readonly states?: StatesStream
  /** A talker's: the stream of hidden states whose rows join its frames' inputs (TrailingRows.ts). */
  readonly trailing?: TrailingStates
}

/** A sidecar stream whose chunks from `firstChunk` on are rows a talker adds to its frames' inputs, a row a step. */
export interface TrailingStates {
  readonly id: string
  readonly firstChunk: number
}

/**
 * A sidecar stream of a generation's hidden states (LLMEmbeddingTask's generate "stream"): chunk
 * 0 holds the prompt's ([prompt, hidden], sent by an embed item with `stream`), then from
 * `firstChunk` on each generated token's, [1, hidden], as the step that reads it runs. The stream
 * is closed when the request ends. Its last token's is never computed: no step reads it.
 */
export interface StatesStream {
  readonly id: string
  readonly receivers: ReadonlyArray<string>
  readonly firstChunk: number
}

/**
 * A prompt's KV cache another executor sent through the sidecar under `id`, a chunk a cache
 * tensor ([heads, positions, headDim]); `shape` is [tensors, heads, positions, headDim]. The worker
 * that runs the request reads the chunks in place as it joins and copies them once, into the
 * request's cache; the router frees them once every request that takes them has joined.
 */
export interface KvImport {
  readonly id: string
  readonly shape: readonly [number, number, number, number]
  readonly dtype: "float32" | "float16"
}

export interface EmbedMeta {
  readonly op: "embed"
  readonly prompt: PromptInput
  readonly id: string
  readonly source: EmbeddingSource
  readonly receivers: ReadonlyArray<string>
  readonly inline: boolean
  /** Sent as chunk 0 of a stream that a generation goes on (StatesStream). */
  readonly stream?: boolean
}

export interface StatsMeta {
  readonly op: "stats"
}

/** The KV cache of a prompt's whole blocks (PrefixTransfer.ts), sent through the sidecar under `id`. */
export interface KvExportMeta {
  readonly op: "kv-export"
  readonly prompt: PromptInput
  readonly id: string
  readonly receivers: ReadonlyArray<string>
}

/**
 * A prompt's KV cache from another executor, checked against every lane's model before a request
 * takes it (KvImport): its geometry and precision, and that its positions are whole blocks within
 * the prompt.
 */
export interface KvImportMeta {
  readonly op: "kv-import"
  readonly prompt: PromptInput
  /** [tensors, heads, positions, headDim]. */
  readonly shape: readonly [number, number, number, number]
  readonly dtype: "float32" | "float16"
}

/** The result of a kv-export or kv-import item; `error` is the caller's mistake (400). */
export interface KvResult {
  readonly shape?: readonly [number, number, number, number]
  readonly dtype?: "float32" | "float16"
  /** A kv-export's positions its prefix cache held. */
  readonly cached?: number
  readonly positions?: number
  readonly error?: string
}

/** `WorkItem.meta` of the router's requests; the item's key is the op. */
export type LlmRequestMeta = GenerateMeta | EmbedMeta | StatsMeta | KvExportMeta | KvImportMeta

/** `BatchItem.meta` of a step's items. */
export type StepOp =
  /** Run the prompt, sample the first token, keep the cache, then decode with the batch. */
  | {
      readonly op: "prefill"
      readonly prompt: PromptInput
      readonly sampling: SamplingParams
      readonly kv?: KvImport
      readonly states?: StatesStream
      readonly trailing?: TrailingStates
    }
  /** One more token for a request whose cache the worker holds. */
  | { readonly op: "decode" }
  /** Drop the request's cache (cancelled). */
  | { readonly op: "free" }
  /** The worker's own counts (its prefix cache). */
  | StatsMeta
  | EmbedMeta
  | KvExportMeta
  | KvImportMeta

/** A partial value, worker → engine → router: one generated token, and whether it ends the request. */
export interface TokenPartial {
  readonly token: number
  readonly finish?: FinishReason
  /** With `logprobs` asked: the token's log probability under the model. */
  readonly logprob?: number
  /** With `logprobs` asked: the most likely tokens and their log probabilities, as [token, logprob, token, logprob, …]. */
  readonly top?: ReadonlyArray<number>
  /** A talker's: the frame's codes, one per codebook (`token` is the first). */
  readonly frame?: ReadonlyArray<number>
  /**
   * With `sampling.hiddenStates`, from the runner to its worker (which streams it through the
   * sidecar and sends the partial on without it): the final hidden state of the step's input, the
   * token before this one.
   */
  readonly hidden?: Float32Array
}

/** The result of a generate request, engine → router. */
export interface GenerateResult {
  readonly finishReason: FinishReason
  readonly completionTokens: number
}

/** A worker's prefix cache (PrefixCache.ts): its counts since it started, and its size. */
export interface PrefixCacheStats {
  /** Prompts looked up. */
  readonly lookups: number
  /** Prompts that found at least one block. */
  readonly hits: number
  /** Prompt tokens that were not prefilled, as they were cached. */
  readonly hitTokens: number
  readonly blocks: number
  readonly bytes: number
  readonly maxBytes: number
  readonly evictions: number
}

/**
 * Where a worker's KV cache lives: "shared", in buffers its runner owns, read in place by the
 * decoder's rewritten attention; "copies", the decoder as exported (with why).
 */
export interface KvCacheStats {
  readonly mode: "shared" | "copies"
  readonly reason?: string
  /** Bytes of the shared cache's buffers now. */
  readonly bytes: number
}

/** The result of a stats item, worker → engine: its prefix cache's counts (when it has one) and its KV cache. */
export interface WorkerStats {
  readonly prefixCache?: PrefixCacheStats
  readonly kvCache?: KvCacheStats
  /** Requests that joined with a KV cache another executor sent, and its positions. */
  readonly kvImports?: { readonly requests: number; readonly tokens: number }
  /** The steps that prefilled or decoded, and their time; of it, the decoder's ONNX Runtime runs. */
  readonly steps?: StepClock
}

/** Steps that prefilled or decoded: how many and their seconds, and the decoder runs within them. */
export interface StepClock {
  readonly count: number
  readonly seconds: number
  readonly decoderRuns: number
  readonly decoderSeconds: number
}

/** The result of an embed item, worker → engine → router; `error` is the caller's mistake (400). */
export interface EmbedResult {
  readonly shape?: readonly [number, number]
  readonly embedding?: Float32Array
  readonly error?: string
}
