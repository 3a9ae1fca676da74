/**
 * Flow control for the streams that cross the IPC channel between the platform and an app's process
 * (the app's streamed answer one way, a task's streamed output the other). The app's channel has no
 * back-pressure of its own: the reading side takes every message as it arrives. So the sender may
 * have at most a window of unacknowledged items in flight, and the receiver acknowledges them as
 * they leave it (written to the HTTP client, taken by the app's code). A slow consumer thus pauses
 * the producer instead of piling its output up in the receiver's heap.
 */
import type { AbortWatch } from "./Cancellation.js"

/** The sending side of one stream: how much is in flight, and a wait for room in the window. */
export class SendWindow {
  private inFlight = 0
  private wake: (() => void) | undefined

  constructor(private readonly size: number) {}

  /** Whether another item may be sent now; one item larger than the window goes when nothing is in flight. */
  get open(): boolean {
    return this.inFlight < this.size
  }

  /** Resolves once the window is open, or at once when `cancellation` aborts (the stream is abandoned). */
  opened(cancellation: AbortWatch): Promise<void> {
    if (this.open || cancellation.aborted) return Promise.resolve()
    return new Promise((resolve) => {
      const stopWatching = cancellation.onAbort(() => this.notify())
      this.wake = () => {
        stopWatching()
        resolve()
      }
    })
  }

  sent(amount: number): void {
    this.inFlight += amount
  }

  acknowledged(amount: number): void {
    this.inFlight -= amount
    if (this.open) this.notify()
  }

  private notify() {
    const wake = this.wake
    this.wake = undefined
    wake?.()
  }
}

/**
 * The receiving side of one stream: counts what has arrived and what has been consumed, and says
 * when to acknowledge. Acknowledgements go in batches of a quarter window, so that a stream of
 * small items (LLM tokens) does not cost a message back per item; a sender that waits has a full
 * window outstanding, so a batch is always due before it would wait forever.
 */
export class ReceiveLedger {
  private outstanding = 0
  private consumedUnacknowledged = 0

  constructor(private readonly size: number) {}

  /** Counts an arrived item; false when the sender had no room for it (it ignored the window). */
  received(amount: number): boolean {
    const withinWindow = this.outstanding < this.size
    this.outstanding += amount
    return withinWindow
  }

  /** Counts a consumed item; returns the amount to acknowledge now, or 0 to wait for more. */
  consumed(amount: number): number {
    this.consumedUnacknowledged += amount
    if (this.consumedUnacknowledged < this.size / 4) return 0
    const acknowledged = this.consumedUnacknowledged
    this.consumedUnacknowledged = 0
    this.outstanding -= acknowledged
    return acknowledged
  }
}

/** How many characters of an app's streamed JSON lines may be unacknowledged per request. */
export const answerWindowChars = 1024 * 1024

/** How many chunks of a task's streamed output may be unacknowledged per dispatch. */
export const dispatchWindowChunks = 64
