/**
 * The rows a talker reads while it speaks (TalkRequest's `trailing`): a thinker's hidden states
 * streamed through the sidecar as its generation runs, read in the talker's worker chunk by chunk
 * (each copied out and freed at once) and handed to the runner a row at a time. A talker step that
 * needs a row that has not come yet waits for it, or for the stream's end: after the end, its
 * frames go on without rows.
 */
import type { SidecarClient } from "../../sidecar/SidecarClient.js"
import { Tensor } from "../../sidecar/Tensor.js"

export class TrailingRows {
  private readonly rows: Array<Float32Array> = []
  private ended = false
  private wake: () => void = () => undefined
  private arrival: Promise<void>

  /**
   * Starts reading chunks `firstChunk`, `firstChunk + 1`, … of `id`, each float32 [rows, width]. A
   * chunk that does not come within `waitMs`, or one of another shape, ends the rows there (the
   * thinker's own call fails with it, and the request with that).
   */
  constructor(
    sidecar: SidecarClient,
    readonly id: string,
    firstChunk: number,
    private readonly width: number,
    waitMs: number
  ) {
    this.arrival = this.nextArrival()
    void this.read(sidecar, firstChunk, waitMs)
  }

  /** Rows that have come so far. */
  get count(): number {
    return this.rows.length
  }

  /**
   * Row `index` (from 0): the row, undefined when the stream ended before it, or "waiting" when it
   * may still come.
   */
  row(index: number): Float32Array | undefined | "waiting" {
    if (index < this.rows.length) return this.rows[index]
    return this.ended ? undefined : "waiting"
  }

  /** Settles when the next row comes or the stream ends. */
  get changed(): Promise<void> {
    return this.arrival
  }

  /** Stops reading: what comes later is left to the sidecar (its sender's stream is dropped with the request). */
  stop(): void {
    this.finish()
  }

  private nextArrival(): Promise<void> {
    return new Promise((resolve) => (this.wake = resolve))
  }

  private notify(): void {
    const wake = this.wake
    this.arrival = this.nextArrival()
    wake()
  }

  private finish(): void {
    if (this.ended) return
    this.ended = true
    this.notify()
  }

  private async read(sidecar: SidecarClient, firstChunk: number, waitMs: number): Promise<void> {
    try {
      for (let chunk = firstChunk; !this.ended; chunk++) {
        const payload = await sidecar.recv(this.id, chunk, { timeoutMs: waitMs })
        if (payload === undefined || this.ended) break
        try {
          if (
            !(payload instanceof Tensor) ||
            payload.dtype !== "float32" ||
            payload.shape.length !== 2 ||
            payload.shape[1] !== this.width
          )
            break
          const data = payload.data as Float32Array
          for (let row = 0; row < payload.shape[0]!; row++)
            this.rows.push(data.slice(row * this.width, (row + 1) * this.width))
        } finally {
          await sidecar.markDone(this.id, chunk)
        }
        this.notify()
      }
    } catch {
      // A chunk that never came: the rows end here.
    }
    this.finish()
  }
}
