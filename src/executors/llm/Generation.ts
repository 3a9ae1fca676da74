/**
 * One chat completion in the router: submits it to the engine, turns its tokens into text as they
 * stream in (stop strings included: one ends the request and cancels it in the engine), and hands
 * the text to whoever answers the client, a streaming response or a whole one.
 */
import type { EngineClient } from "../common/EngineClient.js"
import type { WorkItem, WorkItemContext } from "../common/wire.js"
import type { FinishReason } from "./api.js"
import type { GenerateMeta, GenerateResult, TokenPartial } from "./protocol.js"
import type { TokenLogprobs } from "./Sampler.js"
import { type Detokenizer, TextStream } from "./TextStream.js"

export interface Outcome {
  readonly finishReason: FinishReason
  readonly completionTokens: number
}

/** A generated token with its log probabilities, when the request asked for them. */
export interface GeneratedToken extends TokenLogprobs {
  readonly token: number
}

export interface GenerationListener {
  /**
   * `tokens`: the ids of the tokens this text completes (tokens whose text was held back come with
   * the next); `logprobs`: theirs, when the request asked for them.
   */
  text(text: string, tokens: ReadonlyArray<number>, logprobs: ReadonlyArray<GeneratedToken>): void
  end(outcome: Outcome): void
  error(error: Error): void
}

export class Generation {
  readonly id: string
  /** Everything said so far. */
  text = ""
  /** Settles at the first token, or when the request ends or fails: when the client's answer can start. */
  readonly started: Promise<void>
  /** The outcome; rejects with the engine's failure. */
  readonly done: Promise<Outcome>
  /** Every token said so far with its log probabilities, when the request asked for them. */
  readonly logprobs: Array<GeneratedToken> = []
  private readonly backlog: Array<{
    readonly text: string
    readonly tokens: ReadonlyArray<number>
    readonly logprobs: ReadonlyArray<GeneratedToken>
  }> = []
  /** Tokens generated since the last text said, and their log probabilities when asked for. */
  private pending: Array<number> = []
  private pendingLogprobs: Array<GeneratedToken> = []
  private listener: GenerationListener | undefined
  private result: { readonly outcome: Outcome } | { readonly error: Error } | undefined
  private markStarted!: () => void
  private settled!: (result: { readonly outcome: Outcome } | { readonly error: Error }) => void

  constructor(
    private readonly engine: EngineClient,
    meta: GenerateMeta,
    tokenizer: Detokenizer,
    stops: ReadonlyArray<string>,
    /** Tokens another executor generated already: they are part of the prompt, and their text was said. */
    continued: ReadonlyArray<number> = [],
    /** The request's trace and share (see WorkItem). */
    itemContext: WorkItemContext = {}
  ) {
    this.started = new Promise((resolve) => (this.markStarted = resolve))
    this.done = new Promise(
      (resolve, reject) =>
        (this.settled = (result) => ("outcome" in result ? resolve(result.outcome) : reject(result.error)))
    )
    // A client that never subscribes still must not see an unhandled rejection.
    this.done.catch(() => undefined)
    const stream = new TextStream(tokenizer, stops)
    for (const token of continued) stream.push(token)
    const item: WorkItem<GenerateMeta> = { key: meta.op, inputs: {}, meta, ...itemContext }
    const submitted = engine.submit<GenerateResult, TokenPartial>([item], (_, partial) => {
      if (this.result !== undefined) return
      const token = partial.token
      this.pending.push(token)
      if (partial.logprob !== undefined)
        this.pendingLogprobs.push({ token, logprob: partial.logprob, top: partial.top ?? [] })
      const delta = stream.push(token)
      this.markStarted()
      this.say(delta.text)
      if (delta.stopped) {
        engine.cancel(submitted.id)
        this.settle({ outcome: { finishReason: "stop", completionTokens: stream.tokens } })
      }
    })
    this.id = submitted.id
    submitted.results.then(
      (results) => {
        if (this.result !== undefined) return
        const rest = stream.end()
        this.say(rest.text)
        const result = results[0]!
        this.settle({
          outcome: {
            finishReason: rest.stopped ? "stop" : result.finishReason,
            completionTokens: continued.length + result.completionTokens
          }
        })
      },
      (error: Error) => this.settle({ error })
    )
  }

  /** The engine's failure, once the request has failed. */
  get failure(): Error | undefined {
    return this.result !== undefined && "error" in this.result ? this.result.error : undefined
  }

  /** Replays the text so far, then reports as it comes. */
  subscribe(listener: GenerationListener): void {
    this.listener = listener
    for (const said of this.backlog.splice(0)) listener.text(said.text, said.tokens, said.logprobs)
    if (this.result !== undefined) this.deliver(this.result)
  }

  /** Every token generated and the outcome, once the request has ended: for a caller that wants the ids, not a stream. */
  tokens(): Promise<{ readonly outcome: Outcome; readonly tokens: ReadonlyArray<number> }> {
    const tokens: Array<number> = []
    return new Promise((resolve, reject) =>
      this.subscribe({
        text: (_, said) => tokens.push(...said),
        end: (outcome) => resolve({ outcome, tokens: [...tokens, ...this.takeUnsaid()] }),
        error: reject
      })
    )
  }

  /** Tokens generated whose text was never said (an end-of-sequence token, say), now that the request ended. */
  takeUnsaid(): ReadonlyArray<number> {
    const tokens = this.pending
    this.pending = []
    this.pendingLogprobs = []
    return tokens
  }

  /** The client went away: the engine drops the request and frees its cache. */
  cancel(): void {
    this.engine.cancel(this.id)
  }

  private say(text: string) {
    if (text.length === 0) return
    const tokens = this.pending
    const logprobs = this.pendingLogprobs
    this.pending = []
    this.pendingLogprobs = []
    this.text += text
    this.logprobs.push(...logprobs)
    if (this.listener === undefined) this.backlog.push({ text, tokens, logprobs })
    else this.listener.text(text, tokens, logprobs)
    this.markStarted()
  }

  private settle(result: { readonly outcome: Outcome } | { readonly error: Error }) {
    if (this.result !== undefined) return
    this.result = result
    this.settled(result)
    this.markStarted()
    if (this.listener !== undefined) this.deliver(result)
  }

  private deliver(result: { readonly outcome: Outcome } | { readonly error: Error }) {
    if ("outcome" in result) this.listener!.end(result.outcome)
    else this.listener!.error(result.error)
  }
}
