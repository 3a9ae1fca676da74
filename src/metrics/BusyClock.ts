/**
 * Time during which at least one of some overlapping activities was running: the wall time a
 * request spent inside executors, say, when its encoder and LLM calls overlap. Each `enter` must be
 * matched by one `leave`.
 */
export class BusyClock {
  private active = 0
  private since = 0
  private busy = 0

  enter(now = performance.now()): void {
    if (this.active++ === 0) this.since = now
  }

  leave(now = performance.now()): void {
    if (this.active === 0) return
    if (--this.active === 0) this.busy += now - this.since
  }

  /** Busy milliseconds so far, counting an activity still running up to `now`. */
  busyMs(now = performance.now()): number {
    return this.active > 0 ? this.busy + (now - this.since) : this.busy
  }
}

/** What one request spent where: inside task dispatches, and inside executor calls. */
export interface RequestTiming {
  readonly dispatches: BusyClock
  readonly executors: BusyClock
}
