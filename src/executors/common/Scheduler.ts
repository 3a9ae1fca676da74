/**
 * The executor engine's batching policy, with no I/O: requests wait in weighted fair order between
 * the apps that send them (FairShare.ts; in arrival order within an app); a batch takes
 * not-yet-scheduled items in queue order, all with the batch key of the first (for Eric: modality
 * and model adapter; for Geri: the generation parameters), and stops at the first item with another
 * key or at `maxBatchSize`. A request completes when every one of its items is done.
 */
import { defaultShare, FairTags, insertByTag, type Share } from "./FairShare.js"

export interface SchedulerLimits {
  /** Items in one batch. */
  readonly maxBatchSize: number
  /** How long a batch smaller than maxBatchSize may wait for more items, from its oldest item. */
  readonly maxBatchDelayMs: number
  /** Requests waiting or running; one more is refused (the router answers 503). */
  readonly maxQueuedRequests: number
}

export interface ScheduledItem<T> {
  readonly requestId: string
  readonly index: number
  readonly payload: T
}

type ItemState = "queued" | "running" | "done"

interface QueuedRequest<T> {
  readonly id: string
  /** Its weighted fair queuing tag: the queue is in tag order. */
  readonly tag: number
  readonly arrivedAt: number
  readonly items: ReadonlyArray<{ readonly key: string; readonly payload: T }>
  readonly states: Array<ItemState>
}

export type Decision<T> =
  | { readonly _tag: "Batch"; readonly key: string; readonly items: ReadonlyArray<ScheduledItem<T>> }
  | { readonly _tag: "Wait"; readonly ms: number }
  | { readonly _tag: "Idle" }

export class Scheduler<T> {
  private readonly queue: Array<QueuedRequest<T>> = []
  private readonly tags = new FairTags()

  constructor(private readonly limits: SchedulerLimits) {
    if (limits.maxBatchSize < 1) throw new Error("maxBatchSize must be at least 1")
  }

  get size(): number {
    return this.queue.length
  }

  /** False when the queue is full: the request is refused, not queued. */
  enqueue(
    id: string,
    items: ReadonlyArray<{ readonly key: string; readonly payload: T }>,
    now: number,
    share: Share = defaultShare
  ): boolean {
    if (this.queue.length >= this.limits.maxQueuedRequests) return false
    if (this.queue.some((request) => request.id === id)) throw new Error(`request ${id} is already queued`)
    const tag = this.tags.tag(share, items.length)
    insertByTag(this.queue, { id, tag, arrivedAt: now, items, states: items.map(() => "queued") })
    return true
  }

  /** The next batch to run, how long to wait for a fuller one, or nothing to do. */
  next(now: number): Decision<T> {
    let key: string | undefined
    let oldest = now
    const items: Array<ScheduledItem<T>> = []
    scan: for (const request of this.queue) {
      for (const [index, item] of request.items.entries()) {
        if (request.states[index] !== "queued") continue
        if (key === undefined) key = item.key
        else if (item.key !== key) break scan
        items.push({ requestId: request.id, index, payload: item.payload })
        oldest = Math.min(oldest, request.arrivedAt)
        if (items.length === this.limits.maxBatchSize) break scan
      }
    }
    if (key === undefined) return { _tag: "Idle" }
    const waited = now - oldest
    if (
      items.length < this.limits.maxBatchSize &&
      waited < this.limits.maxBatchDelayMs &&
      !this.blockedByOtherKey(key, items.length)
    ) {
      return { _tag: "Wait", ms: this.limits.maxBatchDelayMs - waited }
    }
    for (const item of items) {
      const request = this.stateOf(item)
      request.states[item.index] = "running"
      this.tags.served(request.tag)
    }
    return { _tag: "Batch", key, items }
  }

  /** Marks a batch's items done; answers the ids of the requests that are now complete. */
  complete(items: ReadonlyArray<ScheduledItem<T>>): ReadonlyArray<string> {
    const touched = new Set<QueuedRequest<T>>()
    for (const item of items) {
      const request = this.find(item.requestId)
      if (request === undefined) continue
      request.states[item.index] = "done"
      touched.add(request)
    }
    const finished = [...touched].filter((request) => request.states.every((state) => state === "done"))
    for (const request of finished) this.remove(request.id)
    return finished.map((request) => request.id)
  }

  /** Drops a request (cancelled, or failed): its queued items will not be scheduled. */
  remove(id: string): boolean {
    const index = this.queue.findIndex((request) => request.id === id)
    if (index < 0) return false
    this.queue.splice(index, 1)
    return true
  }

  /** True when more items are queued behind the batch but with another key: waiting gains nothing. */
  private blockedByOtherKey(key: string, taken: number): boolean {
    let seen = 0
    for (const request of this.queue) {
      for (const [index, item] of request.items.entries()) {
        if (request.states[index] !== "queued") continue
        if (seen === taken) return item.key !== key
        seen++
      }
    }
    return false
  }

  private find(id: string): QueuedRequest<T> | undefined {
    return this.queue.find((request) => request.id === id)
  }

  private stateOf(item: ScheduledItem<T>): QueuedRequest<T> {
    return this.find(item.requestId)!
  }
}
