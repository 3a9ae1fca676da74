/**
 * A wake-up for whoever waits on it: `wakeAll` ends every wait pending at that moment (a wake with
 * nobody waiting is not kept, so a waiter checks its condition before it waits). A wait may also end
 * after `timeoutMs` or when `signal` aborts; however it ends, it leaves no timer or listener behind.
 * An engine's loops wait on one for work; a task's calls wait on one for a free executor.
 */
export class Wakeup {
  private waiters = new Set<() => void>()

  wait(timeoutMs?: number, signal?: AbortSignal): Promise<void> {
    if (timeoutMs === undefined && signal === undefined)
      return new Promise((resolve) => {
        this.waiters.add(resolve)
      })
    return new Promise((resolve) => {
      if (signal?.aborted) return resolve()
      const end = () => {
        clearTimeout(timer)
        signal?.removeEventListener("abort", end)
        this.waiters.delete(end)
        resolve()
      }
      const timer = timeoutMs === undefined ? undefined : setTimeout(end, timeoutMs)
      signal?.addEventListener("abort", end, { once: true })
      this.waiters.add(end)
    })
  }

  wakeAll(): void {
    if (this.waiters.size === 0) return
    const waiters = this.waiters
    this.waiters = new Set()
    for (const wake of waiters) wake()
  }
}
