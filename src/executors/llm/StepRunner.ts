/**
 * What the LLM worker drives one step at a time: Runner.ts, or JanusRunner.ts for Janus's image
 * tokens; the items of a step and the answers of its embed and stats items.
 */
import type { PastData } from "./PastCache.js"
import type { KvCacheStats, PrefixCacheStats, StepOp, TokenPartial } from "./protocol.js"

export interface StepItem {
  readonly id: string
  readonly op: StepOp
  /**
   * A prefill's prompt's first positions, computed by another executor (its `kv`): one row
   * [heads, positions, headDim] per cache tensor, which the request's cache starts from.
   */
  readonly imported?: PastData
}

/** A runner the worker drives. */
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
  | {
      readonly prefixCache: PrefixCacheStats | undefined
      readonly kvCache?: KvCacheStats
      /** The decoder's runs in steps so far, and their seconds. */
      readonly decoderRuns?: DecoderRuns
    }

/** How many times a runner's steps ran the decoder, and the seconds inside those runs. */
export interface DecoderRuns {
  readonly runs: number
  readonly seconds: number
}

/** Counts a runner's decoder runs and their seconds: what its steps spend in ONNX Runtime. */
export class DecoderClock {
  private runs = 0
  private seconds = 0

  async time<A>(run: () => Promise<A>): Promise<A> {
    const started = performance.now()
    try {
      return await run()
    } finally {
      this.runs++
      this.seconds += (performance.now() - started) / 1000
    }
  }

  get reading(): DecoderRuns {
    return { runs: this.runs, seconds: this.seconds }
  }
}
