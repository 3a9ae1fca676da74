/**
 * Admission control for one app: at most `maxConcurrency` requests run at once, at most `maxQueue`
 * more wait for a turn (in arrival order), for at most `queueTimeoutMs`; any other request is
 * refused on arrival, before any of its work starts. A client that goes away while queued leaves
 * the queue.
 */
export interface AdmissionLimits {
  /** Requests that may run at once (Infinity: no limit). */
  readonly maxConcurrency: number
  /** Requests that may wait for a turn once maxConcurrency run. */
  readonly maxQueue: number
  /** How long a queued request may wait before it is refused. */
  readonly queueTimeoutMs: number
}

export const unlimitedAdmission: AdmissionLimits = {
  maxConcurrency: Number.POSITIVE_INFINITY,
  maxQueue: 0,
  queueTimeoutMs: 0
}

/** What became of a request asking to run. */
export type AdmissionOutcome =
  | { readonly _tag: "Admitted"; readonly release: () => void }
  | { readonly _tag: "Overloaded" }
  | { readonly _tag: "TimedOut"; readonly waitedMs: number }

interface Waiter {
  readonly settle: (outcome: AdmissionOutcome) => void
  readonly timer: NodeJS.Timeout
}

/** The longest delay a Node timer keeps: a longer one fires at once. */
const longestTimerMs = 2 ** 31 - 1

/** A count of at least `least`, or `least` itself for anything that is not a number (NaN included). */
const atLeast = (value: number, least: number) => (Number.isNaN(value) ? least : Math.max(value, least))

/**
 * Limits that cannot misbehave, whatever they were given: registration bounds them already, but a
 * queue timeout past a timer's range would refuse every queued request at once, and a NaN count
 * would queue without end. Sound limits are kept as they are (the same object: `unlimitedAdmission`
 * is told apart by identity).
 */
const saneLimits = (limits: AdmissionLimits): AdmissionLimits => {
  const sane = {
    maxConcurrency: atLeast(limits.maxConcurrency, 1),
    maxQueue: atLeast(limits.maxQueue, 0),
    queueTimeoutMs: Math.min(atLeast(limits.queueTimeoutMs, 0), longestTimerMs)
  }
  const unchanged =
    sane.maxConcurrency === limits.maxConcurrency &&
    sane.maxQueue === limits.maxQueue &&
    sane.queueTimeoutMs === limits.queueTimeoutMs
  return unchanged ? limits : sane
}

export class Admission {
  private running = 0
  private readonly queue: Array<Waiter> = []
  readonly limits: AdmissionLimits

  constructor(limits: AdmissionLimits) {
    this.limits = saneLimits(limits)
  }

  /** No limit: every request runs at once, and none needs to be counted. */
  get unlimited(): boolean {
    return this.limits.maxConcurrency === Number.POSITIVE_INFINITY
  }

  get inFlight(): number {
    return this.running
  }

  get queued(): number {
    return this.queue.length
  }

  /**
   * Runs `settle` once with the request's outcome: at once when it is admitted or refused, later
   * when it waits. A request that waits gets a function that takes it out of the queue (its client
   * went away), which does nothing once the request was settled.
   */
  enter(settle: (outcome: AdmissionOutcome) => void): (() => void) | undefined {
    if (this.running < this.limits.maxConcurrency) {
      settle(this.admit())
      return undefined
    }
    if (this.queue.length >= this.limits.maxQueue) {
      settle({ _tag: "Overloaded" })
      return undefined
    }
    const timer = setTimeout(() => {
      this.remove(waiter)
      settle({ _tag: "TimedOut", waitedMs: this.limits.queueTimeoutMs })
    }, this.limits.queueTimeoutMs)
    const waiter: Waiter = { settle, timer }
    this.queue.push(waiter)
    return () => {
      if (this.remove(waiter)) clearTimeout(timer)
    }
  }

  private admit(): AdmissionOutcome {
    this.running++
    let released = false
    return {
      _tag: "Admitted",
      release: () => {
        if (released) return
        released = true
        this.running--
        this.next()
      }
    }
  }

  private next() {
    while (this.running < this.limits.maxConcurrency) {
      const waiter = this.queue.shift()
      if (waiter === undefined) return
      clearTimeout(waiter.timer)
      waiter.settle(this.admit())
    }
  }

  private remove(waiter: Waiter): boolean {
    const index = this.queue.indexOf(waiter)
    if (index < 0) return false
    this.queue.splice(index, 1)
    return true
  }
}
