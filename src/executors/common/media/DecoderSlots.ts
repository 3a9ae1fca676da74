import { abortReason } from "../ThreadJob.js"

/**
 * Turns for media decoders' child processes: at most `size` run at once, the others wait in the
 * order they asked. One whose signal aborts while it waits leaves the line without taking a turn.
 */
export class DecoderSlots {
  private held = 0
  private readonly line: Array<() => void> = []

  constructor(readonly size: number) {}

  /** Turns taken and not yet given back. */
  get running(): number {
    return this.held
  }

  /** Those waiting for a turn. */
  get waiting(): number {
    return this.line.length
  }

  /** Resolves with the function that gives the turn back (once, however often it is called). */
  take(signal?: AbortSignal): Promise<() => void> {
    if (signal?.aborted) return Promise.reject(abortReason(signal))
    if (this.held < this.size) {
      this.held++
      return Promise.resolve(this.giveBack())
    }
    return new Promise((resolve, reject) => {
      const grant = () => {
        signal?.removeEventListener("abort", leave)
        this.held++
        resolve(this.giveBack())
      }
      const leave = () => {
        this.line.splice(this.line.indexOf(grant), 1)
        reject(abortReason(signal!))
      }
      signal?.addEventListener("abort", leave, { once: true })
      this.line.push(grant)
    })
  }

  private giveBack(): () => void {
    let given = false
    return () => {
      if (given) return
      given = true
      this.held--
      this.line.shift()?.()
    }
  }
}
