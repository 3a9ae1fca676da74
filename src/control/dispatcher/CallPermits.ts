/**
 * An app's limit on the calls it has in flight to each task (`admission.maxCallsPerTask`): a
 * request over it waits at the dispatcher, in arrival order, for one of the app's own calls to that
 * task to end. A graph takes the permits of its tasks one at a time in one global order (by task
 * id), one per distinct task however many invocations it has of it, so that two requests that
 * each hold one never wait for each other.
 */

interface Waiter {
  readonly resume: () => void
}

export class CallPermits {
  private readonly held = new Map<string, number>()
  private readonly waiting = new Map<string, Array<Waiter>>()

  /**
   * Takes the permits of `app` for `tasks` under `limit`, waiting for them; answers the release of
   * all of them (idempotent). Rejects with the signal's reason when it aborts while waiting.
   */
  async acquire(app: string, tasks: ReadonlyArray<string>, limit: number, signal: AbortSignal): Promise<() => void> {
    const keys = [...new Set(tasks)].sort().map((task) => `${app}\u0000${task}`)
    const taken: Array<string> = []
    let released = false
    const release = () => {
      if (released) return
      released = true
      for (const key of taken) this.put(key)
    }
    try {
      for (const key of keys) {
        await this.take(key, limit, signal)
        taken.push(key)
      }
    } catch (error) {
      release()
      throw error
    }
    return release
  }

  /** Calls of an app to a task in flight (for the tests and the listing). */
  inFlight(app: string, task: string): number {
    return this.held.get(`${app}\u0000${task}`) ?? 0
  }

  private take(key: string, limit: number, signal: AbortSignal): Promise<void> {
    if (signal.aborted) return Promise.reject(signal.reason)
    const held = this.held.get(key) ?? 0
    if (held < limit && (this.waiting.get(key)?.length ?? 0) === 0) {
      this.held.set(key, held + 1)
      return Promise.resolve()
    }
    return new Promise((resolve, reject) => {
      const queue = this.waiting.get(key) ?? []
      this.waiting.set(key, queue)
      const waiter: Waiter = {
        resume: () => {
          signal.removeEventListener("abort", onAbort)
          resolve()
        }
      }
      const onAbort = () => {
        const at = queue.indexOf(waiter)
        if (at >= 0) queue.splice(at, 1)
        if (queue.length === 0) this.waiting.delete(key)
        reject(signal.reason)
      }
      signal.addEventListener("abort", onAbort, { once: true })
      queue.push(waiter)
    })
  }

  /** A call ended: the first waiter takes its permit, or it is given back. */
  private put(key: string): void {
    const queue = this.waiting.get(key)
    const next = queue?.shift()
    if (queue !== undefined && queue.length === 0) this.waiting.delete(key)
    if (next !== undefined) {
      next.resume()
      return
    }
    const held = (this.held.get(key) ?? 1) - 1
    if (held <= 0) this.held.delete(key)
    else this.held.set(key, held)
  }
}
