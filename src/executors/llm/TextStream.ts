/**
 * Generated tokens → text, one token at a time, as a client should see it: only whole characters
 * (a token that ends inside a multi-byte character waits for the next), special tokens left out,
 * and generation cut before the first stop string. While stop strings are set, the last
 * (longest stop − 1) characters are held back, since they could be the start of one.
 */

export interface Detokenizer {
  decode(ids: ReadonlyArray<number>, options: { readonly skipSpecialTokens?: boolean }): string
}

/** A token's effect: text the client may now see, and whether a stop string ended generation. */
export interface TextDelta {
  readonly text: string
  readonly stopped: boolean
}

const incomplete = "\uFFFD"

export class TextStream {
  private readonly ids: Array<number> = []
  /** The decoded window starts here; the text of ids before readOffset is already in `text`. */
  private prefixOffset = 0
  private readOffset = 0
  private text = ""
  private shown = 0
  private stopped = false
  private readonly holdBack: number

  constructor(
    private readonly tokenizer: Detokenizer,
    private readonly stops: ReadonlyArray<string> = []
  ) {
    this.holdBack = Math.max(0, ...stops.map((stop) => stop.length - 1))
  }

  get tokens(): number {
    return this.ids.length
  }

  push(token: number): TextDelta {
    if (this.stopped) return { text: "", stopped: true }
    this.ids.push(token)
    const before = this.decode(this.prefixOffset, this.readOffset)
    const after = this.decode(this.prefixOffset, this.ids.length)
    if (after.length > before.length && !after.endsWith(incomplete)) {
      this.text += after.slice(before.length)
      this.prefixOffset = this.readOffset
      this.readOffset = this.ids.length
    }
    return this.release(false)
  }

  /** Generation ended: whatever was held back. */
  end(): TextDelta {
    if (this.stopped) return { text: "", stopped: true }
    this.text += this.decode(this.prefixOffset, this.ids.length).slice(
      this.decode(this.prefixOffset, this.readOffset).length
    )
    this.readOffset = this.ids.length
    return this.release(true)
  }

  private release(final: boolean): TextDelta {
    const stopAt = this.findStop()
    if (stopAt !== undefined) {
      this.stopped = true
      const text = this.text.slice(this.shown, Math.max(this.shown, stopAt))
      this.shown = Math.max(this.shown, stopAt)
      return { text, stopped: true }
    }
    const visible = final ? this.text.length : Math.max(this.shown, this.text.length - this.holdBack)
    const text = this.text.slice(this.shown, visible)
    this.shown = visible
    return { text, stopped: false }
  }

  /** Where the first stop string starts in the text not shown yet (stop strings may begin in held-back text). */
  private findStop(): number | undefined {
    let first: number | undefined
    for (const stop of this.stops) {
      if (stop.length === 0) continue
      const at = this.text.indexOf(stop, Math.max(0, this.shown - stop.length + 1))
      if (at >= 0 && (first === undefined || at < first)) first = at
    }
    return first
  }

  private decode(from: number, to: number): string {
    return this.tokenizer.decode(this.ids.slice(from, to), { skipSpecialTokens: true })
  }
}
