/**
 * What each step of the LLM runner runs, as a pure policy over its requests' state, with no I/O
 * (as vLLM's scheduler decides its steps' token budget): which prompts are prefilled whole as one
 * batch, which run a piece (a chunk, or the rest after cached blocks) over their own past, and
 * which rows the decode step runs, together or each apart.
 *
 * It sits in the worker, beside the runner, rather than in the engine: what it decides from, the
 * positions the prefix cache gave a prompt when it joined and how long the device's decode steps
 * and pieces take, is known there, and each step would otherwise wait on a round trip to learn it.
 * The engine's scheduler (Scheduler.ts) decides which requests run at all.
 *
 * Prompts are prefilled in pieces. Where the KV layout batches prompts (the decoder as exported),
 * prompts that join with nothing cached run as one batch, each whole; on the shared cache, each
 * whole prompt is a run over its own row. A prompt whose leading blocks the prefix cache holds
 * starts from them, and a prompt longer than the step's budget is prefilled a chunk per step,
 * each piece a run of its own over the request's own past, between the running requests' decode
 * steps: a long prompt then holds the running streams back by one chunk per token rather than by
 * its whole prefill. The chunk is sized so that its run takes about as long as the batch's decode
 * step (measured as they run; see chunkBounds), unless the executor fixes it. Decoders that
 * quantise per tensor prefill each prompt alone and whole: a piece's scale would differ from the
 * whole prompt's.
 */

/**
 * The adaptive chunk's bounds, and the time it aims to take, as a share of the decode step's.
 * On a CPU, a run of one row reads every weight as a decode step does: a chunk of a few tokens
 * costs about a decode step, while each token in it costs several times what it would in a long
 * chunk. At least 16 tokens keeps a long prompt's own prefill within a few times its whole
 * prefill's; running streams then slow by about one decode step's time per token while it joins.
 */
export const chunkBounds = { initial: 32, min: 16, max: 512, ofDecodeStep: 1 }

/** A request whose prompt is being prefilled. */
export interface Prefilling {
  readonly id: string
  /** Positions its cache holds: the prompt's cached blocks and the pieces run so far. */
  readonly length: number
  readonly promptLength: number
}

export interface StepState {
  /** The requests whose prompts are being prefilled that the step names, in the order they joined. */
  readonly prefilling: ReadonlyArray<Prefilling>
  /** The step's decode items whose prompts are done, in the step's order. */
  readonly decoding: ReadonlyArray<string>
  /** Whether any request decodes, in this step or (a step of other items) the next: then the budget binds. */
  readonly othersDecode: boolean
}

export interface StepPlan {
  /** Prompts with nothing cached, whole, as one run. */
  readonly whole: ReadonlyArray<string>
  /** Pieces, each a run of its own over its request's past, in order. */
  readonly pieces: ReadonlyArray<{ readonly id: string; readonly count: number }>
  /**
   * The decode step's rows: the decode items, then the prompts this step completes (those whose
   * first token does not end them go on decoding in the same step).
   */
  readonly decode: ReadonlyArray<string>
  /** Each decode row a run of its own. */
  readonly rowsApart: boolean
  /** Whether its pieces' run times size the next chunk. */
  readonly adaptive: boolean
}

export interface PlannerOptions {
  /**
   * Prompt tokens a step prefills while other requests decode: "auto" sizes it so that it runs
   * no longer than their decode step (the default); 0 prefills each prompt whole.
   */
  readonly chunkTokens?: number | "auto"
  /** Each prompt is prefilled alone and whole. */
  readonly promptsApart: boolean
  /** Each request's decode steps run apart. */
  readonly rowsApart: boolean
  /** Whether the KV layout can prefill prompts with nothing cached as one batch. */
  readonly batchesPrompts: boolean
}

export class StepPlanner {
  /** Whether prompts are prefilled in chunks while others decode, and the chunk's size now. */
  private readonly chunking: "auto" | "fixed" | "off"
  private chunkTokens: number
  /** How long the last decode step took (ms), which an adaptive chunk aims below. */
  private decodeMs: number | undefined

  constructor(private readonly options: PlannerOptions) {
    const chunk = options.chunkTokens ?? "auto"
    this.chunking = options.promptsApart || chunk === 0 ? "off" : chunk === "auto" ? "auto" : "fixed"
    this.chunkTokens = chunk === "auto" ? chunkBounds.initial : chunk
  }

  /** The prompt tokens a step prefills while others decode, now. */
  get chunk(): number {
    return this.chunkTokens
  }

  /**
   * A step's runs within its budget (no bound when nothing else decodes): prompts that fit whole
   * with nothing cached as one batch where the layout batches them, and every other piece alone;
   * at least one piece runs.
   */
  plan(state: StepState): StepPlan {
    const bounded = state.othersDecode && this.chunking !== "off"
    const batches = this.options.batchesPrompts && !this.options.promptsApart
    let budget = bounded ? this.chunkTokens : Infinity
    const whole: Array<string> = []
    const pieces: Array<{ readonly id: string; readonly count: number }> = []
    const completes: Array<string> = []
    for (const { id, length, promptLength } of state.prefilling) {
      const remaining = promptLength - length
      if (budget <= 0 && whole.length + pieces.length > 0) break
      if (batches && length === 0 && remaining <= budget) {
        whole.push(id)
        budget -= remaining
        continue
      }
      const count = Math.min(remaining, budget > 0 ? budget : this.chunkTokens)
      pieces.push({ id, count })
      if (count === remaining) completes.push(id)
      budget -= count
    }
    return {
      whole,
      pieces,
      decode: [...state.decoding, ...whole, ...completes],
      rowsApart: this.options.rowsApart,
      adaptive: bounded && this.chunking === "auto"
    }
  }

  /** The batch's decode step took `ms`. */
  decodeTook(ms: number): void {
    this.decodeMs = ms
  }

  /** A piece of `count` tokens of an adaptive plan took `ms`: the chunk is sized toward its share of a decode step. */
  pieceTook(count: number, ms: number): void {
    if (this.decodeMs === undefined || count < this.chunkTokens) return
    const target = this.decodeMs * chunkBounds.ofDecodeStep
    const scale = Math.min(2, Math.max(0.5, target / Math.max(ms, 0.01)))
    this.chunkTokens = Math.min(chunkBounds.max, Math.max(chunkBounds.min, Math.round(this.chunkTokens * scale)))
  }
}
