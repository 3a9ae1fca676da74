/**
 * The LLM engine's continuous-batching policy, with no I/O. Requests wait in weighted fair order
 * between the apps that send them (FairShare.ts; in arrival order within an app); at each
 * step boundary of a device (a lane), waiting requests join its running batch as long as its batch
 * size and KV cache budget allow; a finished or cancelled request leaves and gives its cache back.
 * A request reserves its whole KV cache when it joins (prompt plus the most tokens it may
 * generate), so a running request never runs out of cache and nothing is ever preempted. The
 * budget is in bytes, counted as the worker's KV store holds them: a row per request, each as
 * wide as the longest request's positions (in the store's blocks).
 */

import { defaultShare, FairTags, insertByTag, type Share } from "../common/FairShare.js"
import { type KvBudget, rowsBytes } from "./Limits.js"

export interface ContinuousLimits {
  /** Devices, each with its own batch and cache. */
  readonly lanes: number
  /** Requests decoding together on one device. */
  readonly maxRunning: number
  /** The KV cache's bytes per device for running requests' rows, and how positions count in them. */
  readonly kvCache: Pick<KvBudget, "rowBytes" | "bytesPerPosition" | "blockTokens">
  /** Requests waiting or running, all devices together; one more is refused (503). */
  readonly maxQueuedRequests: number
}

export type Admission =
  | { readonly _tag: "Queued" }
  | { readonly _tag: "QueueFull" }
  /** It needs more cache than a device has: it could never run. */
  | { readonly _tag: "TooLarge"; readonly neededBytes: number; readonly budgetBytes: number }

export type Placement = { readonly _tag: "Waiting" } | { readonly _tag: "Running"; readonly lane: number }

interface Lane {
  readonly running: Array<string>
  usedTokens: number
}

export class ContinuousScheduler {
  private readonly waiting: Array<{ readonly id: string; readonly tokens: number; readonly tag: number }> = []
  private readonly tags = new FairTags()
  private readonly lanes: ReadonlyArray<Lane>
  private readonly placements = new Map<string, { readonly lane: number; readonly tokens: number }>()

  constructor(private readonly limits: ContinuousLimits) {
    // A decoder whose geometry is not known (Janus's image-token LLM) counts no bytes: it needs no room.
    const needsRoom = limits.kvCache.bytesPerPosition > 0
    if (limits.lanes < 1 || limits.maxRunning < 1 || (needsRoom && limits.kvCache.rowBytes < 1))
      throw new Error("an LLM engine needs a lane, a batch and a cache")
    this.lanes = Array.from({ length: limits.lanes }, () => ({ running: [], usedTokens: 0 }))
  }

  /** Queues a request that will hold `tokens` cache positions while it runs. */
  enqueue(id: string, tokens: number, share: Share = defaultShare): Admission {
    const alone = rowsBytes(this.limits.kvCache, 1, tokens)
    if (alone > this.limits.kvCache.rowBytes)
      return { _tag: "TooLarge", neededBytes: alone, budgetBytes: this.limits.kvCache.rowBytes }
    if (this.waiting.length + this.placements.size >= this.limits.maxQueuedRequests) return { _tag: "QueueFull" }
    if (this.placements.has(id) || this.waiting.some((request) => request.id === id))
      throw new Error(`request ${id} is already queued`)
    insertByTag(this.waiting, { id, tokens, tag: this.tags.tag(share, 1) })
    return { _tag: "Queued" }
  }

  /**
   * At a step boundary of `lane`: the waiting requests that join it now, in fair order. The queue's
   * head blocks those behind it (no overtaking), and a request goes to the lane with the fewest
   * running requests among those it fits in.
   */
  admit(lane: number): ReadonlyArray<string> {
    const joined: Array<string> = []
    for (;;) {
      const head = this.waiting[0]
      if (head === undefined || !this.fits(lane, head.tokens)) break
      const fewest = Math.min(
        ...this.lanes.map((other, index) => (this.fits(index, head.tokens) ? other.running.length : Infinity))
      )
      if (this.lanes[lane]!.running.length > fewest) break
      this.waiting.shift()
      this.tags.served(head.tag)
      this.lanes[lane]!.running.push(head.id)
      this.lanes[lane]!.usedTokens += head.tokens
      this.placements.set(head.id, { lane, tokens: head.tokens })
      joined.push(head.id)
    }
    return joined
  }

  /** The requests decoding on `lane`, in the order they joined. */
  running(lane: number): ReadonlyArray<string> {
    return this.lanes[lane]!.running
  }

  /** Where a request is, if it is still here. */
  placement(id: string): Placement | undefined {
    const placed = this.placements.get(id)
    if (placed !== undefined) return { _tag: "Running", lane: placed.lane }
    return this.waiting.some((request) => request.id === id) ? { _tag: "Waiting" } : undefined
  }

  /** Removes a finished, failed or cancelled request and frees its cache; says where it was. */
  release(id: string): Placement | undefined {
    const placed = this.placements.get(id)
    if (placed !== undefined) {
      this.placements.delete(id)
      const lane = this.lanes[placed.lane]!
      lane.running.splice(lane.running.indexOf(id), 1)
      lane.usedTokens -= placed.tokens
      return { _tag: "Running", lane: placed.lane }
    }
    const index = this.waiting.findIndex((request) => request.id === id)
    if (index < 0) return undefined
    this.waiting.splice(index, 1)
    return { _tag: "Waiting" }
  }

  get stats(): {
    readonly waiting: number
    readonly running: number
    readonly usedTokens: number
    /** Bytes the running requests' rows take, all lanes together. */
    readonly reservedBytes: number
    /** The rows' budget, all lanes together. */
    readonly budgetBytes: number
  } {
    return {
      waiting: this.waiting.length,
      running: this.placements.size,
      usedTokens: this.lanes.reduce((sum, lane) => sum + lane.usedTokens, 0),
      reservedBytes: this.lanes.reduce((sum, _, index) => sum + this.laneBytes(index, 0, 0), 0),
      budgetBytes: this.limits.kvCache.rowBytes * this.limits.lanes
    }
  }

  /** Bytes `lane`'s rows take with `more` requests of `tokens` positions beside its running ones. */
  private laneBytes(lane: number, more: number, tokens: number): number {
    const { running } = this.lanes[lane]!
    const widest = running.reduce((most, id) => Math.max(most, this.placements.get(id)!.tokens), tokens)
    return rowsBytes(this.limits.kvCache, running.length + more, widest)
  }

  private fits(lane: number, tokens: number): boolean {
    const state = this.lanes[lane]!
    return (
      state.running.length < this.limits.maxRunning && this.laneBytes(lane, 1, tokens) <= this.limits.kvCache.rowBytes
    )
  }
}
