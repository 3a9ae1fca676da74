import { AllocationTimeout, TensorTooLarge } from "./errors.js"
import type { SizeClassAllocator } from "./SizeClassAllocator.js"

/**
 * Slots of the arena with back-pressure and shared ownership.
 *
 * When the arena is full an allocation waits, first come first served, until enough is freed or
 * its time runs out; it never fails for lack of memory right away and never over-commits. A slot
 * can be held by several owners at once (the transfer table and each TCP write of it to a peer);
 * it is freed when the last one lets go.
 *
 * A spare slot is one handed to a sender ahead of its next chunk, so that the chunk is copied in
 * without waiting for an allocation first. Spares are given only from an arena with room to spare
 * (no allocation waiting, and no more than `spareShare` of it in use afterwards), and they are
 * counted apart from the slots that hold data until their sender uses them.
 */

/** The share of the arena in use, spare included, up to which a spare slot is given. */
const spareShare = 0.5

interface Waiter {
  readonly bytes: number
  readonly resolve: (offset: number) => void
  readonly reject: (error: unknown) => void
  readonly timer: NodeJS.Timeout
  readonly detach: () => void
}

export class SlotPool {
  private readonly owners = new Map<number, number>()
  /** Spare slots not used yet: offset → slot bytes. */
  private readonly spares = new Map<number, number>()
  private spareBytes = 0
  private readonly waiters: Array<Waiter> = []
  private waits = 0
  private timeouts = 0

  constructor(
    readonly nodeId: string,
    private readonly allocator: SizeClassAllocator
  ) {}

  /** A slot now, or undefined when the arena is full or others wait ahead; throws if it can never fit. */
  tryAllocate(bytes: number): number | undefined {
    this.checkFits(bytes)
    if (this.waiters.length > 0) return undefined
    return this.take(bytes)
  }

  /** A slot of at least `bytes`, waiting up to timeoutMs for one; an abort gives up the wait. */
  allocate(bytes: number, timeoutMs: number, signal?: AbortSignal): Promise<number> {
    let offset: number | undefined
    try {
      offset = this.tryAllocate(bytes)
    } catch (error) {
      return Promise.reject(error)
    }
    if (offset !== undefined) return Promise.resolve(offset)
    if (signal?.aborted) return Promise.reject(signal.reason)
    this.waits++
    return new Promise((resolve, reject) => {
      const onAbort = () => this.drop(waiter, signal?.reason)
      const timeout = () => {
        this.timeouts++
        const { usedBytes, capacityBytes } = this.allocator
        this.drop(
          waiter,
          new AllocationTimeout({ nodeId: this.nodeId, bytes, waitedMs: timeoutMs, usedBytes, capacityBytes })
        )
      }
      const waiter: Waiter = {
        bytes,
        resolve,
        reject,
        // Unref'd: a wait alone never keeps a stopping sidecar alive.
        timer: setTimeout(timeout, timeoutMs).unref(),
        detach: () => signal?.removeEventListener("abort", onAbort)
      }
      signal?.addEventListener("abort", onAbort, { once: true })
      this.waiters.push(waiter)
    })
  }

  /**
   * A spare slot of the size class of `bytes`, or undefined when the arena has no room to spare.
   * It is freed with `release` or becomes an ordinary slot with `useSpare`.
   */
  trySpare(bytes: number): number | undefined {
    const slotBytes = this.allocator.blockBytes(bytes)
    if (slotBytes === undefined || this.waiters.length > 0) return undefined
    if (this.allocator.usedBytes + slotBytes > this.allocator.capacityBytes * spareShare) return undefined
    const offset = this.take(bytes)
    if (offset === undefined) return undefined
    this.spares.set(offset, slotBytes)
    this.spareBytes += slotBytes
    return offset
  }

  /** A spare slot now holds data, or it was not a spare. */
  useSpare(offset: number): void {
    const slotBytes = this.spares.get(offset)
    if (slotBytes === undefined) return
    this.spares.delete(offset)
    this.spareBytes -= slotBytes
  }

  /** One more owner for an allocated slot. */
  retain(offset: number): void {
    const owners = this.owners.get(offset)
    if (owners === undefined) throw new RangeError(`no slot is allocated at offset ${offset}`)
    this.owners.set(offset, owners + 1)
  }

  /** One owner fewer; the last one frees the slot and lets waiting allocations in. */
  release(offset: number): void {
    const owners = this.owners.get(offset)
    if (owners === undefined) throw new RangeError(`no slot is allocated at offset ${offset}`)
    if (owners > 1) {
      this.owners.set(offset, owners - 1)
      return
    }
    this.owners.delete(offset)
    this.useSpare(offset)
    this.allocator.release(offset)
    this.serveWaiters()
  }

  /** The smallest slot: what a request of fewer bytes takes. */
  get minSlotBytes(): number {
    return this.allocator.minBlockBytes
  }

  /** The size of the slot at `offset`, or undefined when none is allocated there. */
  slotBytes(offset: number): number | undefined {
    return this.allocator.sizeAt(offset)
  }

  get stats() {
    return {
      arenaBytes: this.allocator.capacityBytes,
      bytesInUse: this.allocator.usedBytes - this.spareBytes,
      slotsInUse: this.allocator.allocationCount - this.spares.size,
      bytesReserved: this.spareBytes,
      slotsReserved: this.spares.size,
      largestFreeBytes: this.allocator.largestFreeBytes,
      allocationWaits: this.waits,
      allocationTimeouts: this.timeouts
    }
  }

  private checkFits(bytes: number) {
    if (this.allocator.blockBytes(bytes) === undefined) {
      throw new TensorTooLarge({ nodeId: this.nodeId, bytes, largestBytes: this.allocator.largestBlockBytes })
    }
  }

  private take(bytes: number): number | undefined {
    const offset = this.allocator.allocate(bytes)
    if (offset !== undefined) this.owners.set(offset, 1)
    return offset
  }

  private serveWaiters() {
    // Strictly in order: a large request at the head is not starved by small ones behind it.
    while (this.waiters.length > 0) {
      const waiter = this.waiters[0]!
      const offset = this.take(waiter.bytes)
      if (offset === undefined) return
      this.waiters.shift()
      clearTimeout(waiter.timer)
      waiter.detach()
      waiter.resolve(offset)
    }
  }

  private drop(waiter: Waiter, error: unknown) {
    const index = this.waiters.indexOf(waiter)
    if (index === -1) return
    this.waiters.splice(index, 1)
    clearTimeout(waiter.timer)
    waiter.detach()
    waiter.reject(error)
    // The one that left may have been the head that blocked the others.
    if (index === 0) this.serveWaiters()
  }
}
