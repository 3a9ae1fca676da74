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
 * A spare slot is one kept for a sender ahead of its next chunk, so that the chunk is copied in
 * without waiting for an allocation first: the slot of its last chunk, once everyone is done with
 * it, which also keeps a sender writing into memory it wrote last. Slots become spares only in an
 * arena with room to spare (no allocation waiting, no more than `spareShare` of it in use), and
 * they are counted apart from the slots that hold data until their sender uses them.
 */

/** The share of the arena in use, the slot at hand included, up to which a slot is kept as a spare. */
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
  /** Who may keep a slot as a spare once its last owner lets go: offset → whether they take it. */
  private readonly keepers = new Map<number, () => boolean>()
  /** Spare slots not used yet: offset → slot bytes. */
  private readonly spares = new Map<number, number>()
  private spareBytes = 0
  private readonly waiters: Array<Waiter> = []
  private waits = 0
  private timeouts = 0

  /**
   * `commit` gives a block memory before it is handed out (the arena grows on demand); a block it
   * cannot commit is not handed out, as if the arena were full.
   */
  constructor(
    readonly nodeId: string,
    private readonly allocator: SizeClassAllocator,
    private readonly commit: (offset: number, bytes: number) => boolean = () => true
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
   * When the slot's last owner lets go and the arena has room to spare, `keep` is asked first: if
   * it returns true, the slot stays allocated, as a spare with one owner (freed with `release`, or
   * an ordinary slot again with `useSpare`), rather than being freed.
   */
  offerAsSpare(offset: number, keep: () => boolean): void {
    if (!this.owners.has(offset)) throw new RangeError(`no slot is allocated at offset ${offset}`)
    this.keepers.set(offset, keep)
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
    const keep = this.keepers.get(offset)
    this.keepers.delete(offset)
    this.useSpare(offset)
    if (keep !== undefined && this.hasRoomToSpare() && keep()) {
      const slotBytes = this.allocator.sizeAt(offset)!
      this.spares.set(offset, slotBytes)
      this.spareBytes += slotBytes
      return
    }
    this.owners.delete(offset)
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

  private hasRoomToSpare(): boolean {
    return this.waiters.length === 0 && this.allocator.usedBytes <= this.allocator.capacityBytes * spareShare
  }

  private checkFits(bytes: number) {
    if (this.allocator.blockBytes(bytes) === undefined) {
      throw new TensorTooLarge({ nodeId: this.nodeId, bytes, largestBytes: this.allocator.largestBlockBytes })
    }
  }

  private take(bytes: number): number | undefined {
    const offset = this.allocator.allocate(bytes)
    if (offset === undefined) return undefined
    if (!this.commit(offset, this.allocator.sizeAt(offset)!)) {
      this.allocator.release(offset)
      return undefined
    }
    this.owners.set(offset, 1)
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
