import { StringDecoder } from "node:string_decoder"

/** How much of an app's output is kept, and how much of it reaches the platform's own log. */
export interface AppLogLimits {
  /** A longer line is cut here: an app's line never costs the platform more than this. */
  readonly maxLineChars: number
  /** The last characters of output kept in memory for the app's log route. */
  readonly tailChars: number
  /** The rate at which the app's lines are copied to the platform's log, in characters per second. */
  readonly forwardCharsPerSecond: number
  /** As many characters may be copied at once after a quiet spell. */
  readonly forwardBurstChars: number
}

export const defaultAppLogLimits: AppLogLimits = {
  maxLineChars: 2_000,
  tailChars: 64 * 1024,
  forwardCharsPerSecond: 16 * 1024,
  forwardBurstChars: 64 * 1024
}

/** How long after the first line it held back the log says how many it held back. */
const droppedNoteDelayMs = 1_000

/**
 * Characters that would let a line pass for something else on a terminal or to a log reader:
 * control characters (escape sequences, carriage returns, backspaces) and Unicode line breaks.
 */
// biome-ignore lint/suspicious/noControlCharactersInRegex: matching control characters is the point.
const disguising = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u2028\u2029]/g

const visible = (text: string): string =>
  text.replace(disguising, (char) => `\\u${char.charCodeAt(0).toString(16).padStart(4, "0")}`)

const writeToStderr = (line: string) => {
  process.stderr.write(`${line}\n`)
}

/** One of an app's output streams, cut into lines. */
export interface AppOutputReader {
  write(chunk: Buffer): void
  /** The stream closed: a last line without its newline is a line too. */
  end(): void
}

/**
 * What one app writes to its stdout and stderr, which are pipes the platform reads, never the
 * platform's own. Every line is cut to a bound and its control characters escaped; the last
 * `tailChars` are kept for the app's log route, and lines reach the platform's log prefixed with
 * `[app ID]` and only at a bounded rate, so an app can neither flood the platform's log nor write a
 * line that reads as the platform's. Lines over the rate are counted, and the count is logged.
 *
 * One per app, across its process's restarts: the tail shows what the app wrote before it crashed.
 */
export class AppLog {
  private readonly kept: Array<string> = []
  private keptChars = 0
  private credit: number
  private creditAt = Date.now()
  private dropped = 0
  private droppedNote: NodeJS.Timeout | undefined
  private readonly followers = new Set<(line: string) => void>()

  constructor(
    readonly appId: string,
    private readonly forward: (line: string) => void = writeToStderr,
    private readonly limits: AppLogLimits = defaultAppLogLimits
  ) {
    this.credit = limits.forwardBurstChars
  }

  /** A reader for one stream of one process of the app's. */
  reader(): AppOutputReader {
    const decoder = new StringDecoder("utf8")
    let pending = ""
    /** The current line was cut at the bound: the rest of it, up to its newline, is dropped. */
    let cut = false
    const take = (text: string) => {
      for (let start = 0; start < text.length; ) {
        const newline = text.indexOf("\n", start)
        const end = newline === -1 ? text.length : newline
        if (!cut) {
          pending += text.slice(start, Math.min(end, start + this.limits.maxLineChars - pending.length + 1))
          if (pending.length > this.limits.maxLineChars) {
            this.line(`${pending.slice(0, this.limits.maxLineChars)}… (cut)`)
            pending = ""
            cut = true
          }
        }
        if (newline === -1) return
        if (!cut) this.line(pending)
        pending = ""
        cut = false
        start = newline + 1
      }
    }
    return {
      write: (chunk) => take(decoder.write(chunk)),
      end: () => {
        take(decoder.end())
        if (pending.length > 0 && !cut) this.line(pending)
        pending = ""
      }
    }
  }

  /** A line of the platform's about the app (an outbound connection it refused), marked as the platform's. */
  note(text: string): void {
    this.line(`(platform) ${text}`)
  }

  /** Calls `listener` with each line from now on (as the tail keeps it); answers how to stop. */
  follow(listener: (line: string) => void): () => void {
    this.followers.add(listener)
    return () => this.followers.delete(listener)
  }

  /** The last lines the app wrote, oldest first, each ending with a newline. */
  tail(): string {
    return this.kept.map((line) => `${line}\n`).join("")
  }

  private line(raw: string) {
    const line = visible(raw.endsWith("\r") ? raw.slice(0, -1) : raw)
    this.keep(line)
    for (const follower of this.followers) follower(line)
    const shown = `[app ${this.appId}] ${line}`
    if (this.spend(shown.length + 1)) {
      this.forward(shown)
    } else {
      this.dropped++
      this.droppedNote ??= setTimeout(() => this.reportDropped(), droppedNoteDelayMs).unref()
    }
  }

  private keep(line: string) {
    this.kept.push(line)
    this.keptChars += line.length + 1
    while (this.keptChars > this.limits.tailChars && this.kept.length > 1) {
      this.keptChars -= this.kept.shift()!.length + 1
    }
  }

  /** Takes `chars` of the forwarding credit, which refills at the forwarding rate up to the burst. */
  private spend(chars: number): boolean {
    const now = Date.now()
    this.credit = Math.min(
      this.limits.forwardBurstChars,
      this.credit + ((now - this.creditAt) / 1_000) * this.limits.forwardCharsPerSecond
    )
    this.creditAt = now
    if (this.credit < chars) return false
    this.credit -= chars
    return true
  }

  private reportDropped() {
    this.droppedNote = undefined
    if (this.dropped === 0) return
    const rate = Math.round(this.limits.forwardCharsPerSecond / 1024)
    this.forward(
      `[app ${this.appId}] (${this.dropped} more line(s) not shown here: the app writes faster than ${rate} KiB/s; its log keeps the last ${Math.round(this.limits.tailChars / 1024)} KiB)`
    )
    this.dropped = 0
  }
}
