/**
 * What one request holds until it ends (executor leases, abort listeners, timers), each registered
 * with the way to give it back, and given back exactly once: early, through the handle its
 * registration answers, or when the scope closes, the last registered first. A scope closes once;
 * what is registered on a closed scope is given back at once. Plain callbacks, not fibers: every
 * request's path runs through one.
 */
export class RequestScope {
  private readonly releases: Array<() => void> = []
  private open = true

  get closed(): boolean {
    return !this.open
  }

  /** Runs `cleanup` once: when the handle is called, or when the scope closes. */
  defer(cleanup: () => void): () => void {
    let pending = true
    const run = () => {
      if (!pending) return
      pending = false
      cleanup()
    }
    if (this.open) this.releases.push(run)
    else run()
    return run
  }

  /**
   * Holds something given back with an outcome (a lease: "ok", "failed", ...). The handle gives it
   * back with the outcome its caller names; closing the scope gives it back with `onClose` when
   * nobody did before.
   */
  hold<Outcome>(giveBack: (outcome: Outcome) => void, onClose: NoInfer<Outcome>): (outcome: Outcome) => void {
    let outcome = onClose
    const release = this.defer(() => giveBack(outcome))
    return (given) => {
      outcome = given
      release()
    }
  }

  /**
   * Calls `listener` when `signal` aborts, until the handle or the scope's close removes it. As with
   * `addEventListener`, a signal aborted already does not call it.
   */
  onAbort(signal: AbortSignal, listener: () => void): () => void {
    signal.addEventListener("abort", listener, { once: true })
    return this.defer(() => signal.removeEventListener("abort", listener))
  }

  /** Calls `fire` after `ms` unless the handle or the scope's close clears the timer first. */
  timeout(ms: number, fire: () => void): () => void {
    const timer = setTimeout(fire, ms)
    return this.defer(() => clearTimeout(timer))
  }

  /**
   * Gives back everything still held, the last registered first. Every cleanup runs even when one
   * throws; the first error is thrown once they all ran.
   */
  close(): void {
    if (!this.open) return
    this.open = false
    let failure: { readonly error: unknown } | undefined
    for (let index = this.releases.length - 1; index >= 0; index--) {
      try {
        this.releases[index]!()
      } catch (error) {
        failure ??= { error }
      }
    }
    this.releases.length = 0
    if (failure !== undefined) throw failure.error
  }
}
