/**
 * Whether a request (or a dispatched graph) was cancelled, as the IPC driver on either side of the
 * channel needs to know it: a flag and listeners.
 */

/** What waits on a cancellation needs of it: the flag, and a listener it can remove again. */
export interface AbortWatch {
  readonly aborted: boolean
  /** Calls `listener` once when cancelled (never, if already cancelled); returns its removal. */
  onAbort(listener: () => void): () => void
}

/** An AbortSignal seen as an AbortWatch. */
export const watchSignal = (signal: AbortSignal): AbortWatch => ({
  get aborted() {
    return signal.aborted
  },
  onAbort(listener) {
    signal.addEventListener("abort", listener, { once: true })
    return () => signal.removeEventListener("abort", listener)
  }
})

/**
 * One request's cancellation in an app's process, with an AbortSignal made only when the app's code
 * reads `signal`.
 *
 * Node 20's AbortController survives V8's young-generation collections: each one is promoted to the
 * old generation and freed only by a full mark-compact. One per request made an app's process pause
 * for a 2–5 ms scavenge every second at 2,000 requests/s, and for a mark-compact every few seconds,
 * pauses that every request in flight waited out (the gateway's p99). Most apps never read their
 * signal, and now allocate none.
 */
export class Cancellation implements AbortWatch {
  private cancelled = false
  private controller: AbortController | undefined
  private listeners: Set<() => void> | undefined

  get aborted(): boolean {
    return this.cancelled
  }

  /** An AbortSignal that aborts with this request, made on first use. */
  get signal(): AbortSignal {
    if (this.controller === undefined) {
      this.controller = new AbortController()
      if (this.cancelled) this.controller.abort()
    }
    return this.controller.signal
  }

  onAbort(listener: () => void): () => void {
    if (this.cancelled) return () => {}
    this.listeners ??= new Set()
    // A wrapper, so that the same function registered twice is called twice, as separate waits expect.
    const once = () => listener()
    this.listeners.add(once)
    return () => {
      this.listeners?.delete(once)
    }
  }

  abort(): void {
    if (this.cancelled) return
    this.cancelled = true
    const listeners = this.listeners
    this.listeners = undefined
    for (const listener of listeners ?? []) listener()
    this.controller?.abort()
  }
}
