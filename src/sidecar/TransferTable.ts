import { DuplicateChunk, InvalidRequest, RecvTimeout } from "./errors.js"
import { payloadBytes, type PayloadMeta, transferSecondsBuckets } from "./protocol.js"
import type { SlotPool } from "./SlotPool.js"

/**
 * The chunks a node's executors can receive, by transfer id and chunk index, and the receivers
 * waiting for chunks not here yet.
 *
 * A chunk stays until a receiver marks it done, its receivers all disconnect, or its TTL runs out
 * (then with a warning: someone forgot to mark it done). A transfer's record (its chunk count,
 * which chunks are done) outlives its chunks so that a receiver reading a stream to its end gets
 * "end" rather than a wait; idle records go after the TTL.
 */

/** A client that received chunks; when it goes, the chunks only it read are freed. */
export interface Reader {
  readonly received: Set<StoredChunk>
}

export interface StoredChunk {
  readonly id: string
  readonly chunk: number
  readonly meta: PayloadMeta
  /** The slot with the chunk's bytes, owned by the table; undefined when the chunk has none. */
  readonly offset: number | undefined
  readonly storedAt: number
  readonly readers: Set<Reader>
  /** Receivers yet to mark it done: it is freed when the last has. */
  pending: number
}

export type RecvResult = StoredChunk | "end"

interface RecvWaiter {
  readonly chunk: number
  readonly settle: (result: RecvResult) => void
}

interface Transfer {
  readonly id: string
  readonly chunks: Map<number, StoredChunk>
  readonly done: Set<number>
  numChunks: number | undefined
  readonly waiters: Set<RecvWaiter>
  touchedAt: number
  /** When its first chunk arrived (performance.now()), and the bytes of its chunks so far. */
  startedAt: number | undefined
  bytes: number
  /** Its time and bytes went into the statistics. */
  counted: boolean
}

export type ChunkOrigin = "local" | "remote"

/** Every chunk of the transfer has been marked done (its count known). */
/** A record with nothing in it: no chunk stored or done, nobody waiting, no length known. */
const isEmpty = (transfer: Transfer): boolean =>
  transfer.chunks.size === 0 &&
  transfer.done.size === 0 &&
  transfer.waiters.size === 0 &&
  transfer.numChunks === undefined

const finished = (transfer: Transfer): boolean =>
  transfer.numChunks !== undefined && transfer.done.size >= transfer.numChunks

export class TransferTable {
  private readonly transfers = new Map<string, Transfer>()
  private chunksStored = 0
  /** Per bucket of transferSecondsBuckets, and one past the last for longer transfers. */
  private readonly transferSeconds = {
    buckets: new Array<number>(transferSecondsBuckets.length + 1).fill(0),
    sum: 0,
    count: 0
  }
  private bytesTransferred = 0
  private readonly counters = {
    chunksReceivedLocal: 0,
    chunksReceivedRemote: 0,
    recvWaits: 0,
    recvTimeouts: 0,
    chunksReclaimed: 0,
    chunksReleasedOnDisconnect: 0
  }

  constructor(
    private readonly slots: SlotPool,
    private readonly ttlMs: number,
    private readonly warn: (message: string) => void
  ) {}

  /**
   * Stores a chunk and wakes its receivers. Takes over one ownership of the slot, also when it
   * throws (the slot is then released).
   */
  store(
    id: string,
    chunk: number,
    numChunks: number | undefined,
    meta: PayloadMeta,
    offset: number | undefined,
    origin: ChunkOrigin,
    /** Receivers on this node, each of which marks it done. */
    receivers = 1
  ): void {
    try {
      const transfer = this.transfer(id)
      if (transfer.chunks.has(chunk) || transfer.done.has(chunk)) throw new DuplicateChunk({ id, chunk })
      if (numChunks !== undefined) this.setChunkCount(transfer, numChunks)
      if (transfer.numChunks !== undefined && chunk >= transfer.numChunks) {
        throw new InvalidRequest({
          reason: `chunk ${chunk} is past the end of transfer "${id}" (${transfer.numChunks} chunks)`
        })
      }
      const stored: StoredChunk = {
        id,
        chunk,
        meta,
        offset,
        storedAt: Date.now(),
        readers: new Set(),
        pending: Math.max(1, receivers)
      }
      transfer.chunks.set(chunk, stored)
      transfer.startedAt ??= performance.now()
      transfer.bytes += payloadBytes(meta)
      this.chunksStored++
      if (origin === "local") this.counters.chunksReceivedLocal++
      else this.counters.chunksReceivedRemote++
      this.wake(transfer)
    } catch (error) {
      if (offset !== undefined) this.slots.release(offset)
      throw error
    }
  }

  /** Ends a stream: receivers of chunk numChunks and later get "end". */
  close(id: string, numChunks: number): void {
    const transfer = this.transfer(id)
    this.setChunkCount(transfer, numChunks)
    this.wake(transfer)
    if (finished(transfer)) this.count(transfer)
  }

  /** The chunk, "end" past the last one, or RecvTimeout after waiting timeoutMs for it. */
  recv(id: string, chunk: number, timeoutMs: number, reader: Reader, signal: AbortSignal): Promise<RecvResult> {
    const transfer = this.transfer(id)
    let ready: RecvResult | undefined
    try {
      ready = this.lookup(transfer, chunk)
    } catch (error) {
      return Promise.reject(error)
    }
    if (ready !== undefined) return Promise.resolve(this.deliver(ready, reader))
    this.counters.recvWaits++
    return new Promise((resolve, reject) => {
      const finish = () => {
        clearTimeout(timer)
        signal.removeEventListener("abort", onAbort)
        transfer.waiters.delete(waiter)
      }
      const waiter: RecvWaiter = {
        chunk,
        settle: (result) => {
          finish()
          resolve(this.deliver(result, reader))
        }
      }
      const timeout = () => {
        finish()
        // A wait for data that never came leaves no record of it behind.
        if (this.transfers.get(id) === transfer && isEmpty(transfer)) this.transfers.delete(id)
        this.counters.recvTimeouts++
        reject(new RecvTimeout({ id, chunk, waitedMs: timeoutMs }))
      }
      // Unref'd: a wait alone never keeps a stopping sidecar alive.
      const timer = setTimeout(timeout, timeoutMs).unref()
      const onAbort = () => {
        finish()
        reject(signal.reason)
      }
      signal.addEventListener("abort", onAbort, { once: true })
      transfer.waiters.add(waiter)
    })
  }

  /**
   * One receiver is done with one chunk, freed once every receiver it was sent to is; or (chunk
   * undefined) every chunk of the transfer and its record are freed.
   */
  markDone(id: string, chunk: number | undefined): void {
    const transfer = this.transfers.get(id)
    if (transfer === undefined) return
    if (chunk !== undefined) {
      const stored = transfer.chunks.get(chunk)
      if (stored !== undefined && --stored.pending > 0) {
        transfer.touchedAt = Date.now()
        return
      }
      if (stored !== undefined) this.free(transfer, stored)
      transfer.done.add(chunk)
      transfer.touchedAt = Date.now()
      if (finished(transfer)) this.count(transfer)
      return
    }
    for (const stored of transfer.chunks.values()) this.free(transfer, stored)
    // Receivers already waiting on the id keep its record, so that a new send still wakes them.
    if (transfer.waiters.size === 0) this.transfers.delete(id)
    else transfer.done.clear()
  }

  /** A client went away: the chunks that no one else has read are freed. */
  releaseReader(reader: Reader): void {
    for (const stored of reader.received) {
      stored.readers.delete(reader)
      if (stored.readers.size > 0) continue
      const transfer = this.transfers.get(stored.id)
      if (transfer?.chunks.get(stored.chunk) !== stored) continue
      this.free(transfer, stored)
      this.counters.chunksReleasedOnDisconnect++
    }
    reader.received.clear()
  }

  /** Frees chunks older than the TTL (with a warning) and forgets idle records. */
  sweep(now: number): void {
    for (const transfer of this.transfers.values()) {
      for (const stored of transfer.chunks.values()) {
        if (now - stored.storedAt < this.ttlMs) continue
        this.warn(
          `reclaimed chunk ${stored.chunk} of transfer "${stored.id}" (${payloadBytes(stored.meta)} bytes): ` +
            `not marked done within the ${this.ttlMs / 1000} s TTL`
        )
        this.free(transfer, stored)
        this.counters.chunksReclaimed++
      }
      if (transfer.chunks.size === 0 && transfer.waiters.size === 0 && now - transfer.touchedAt >= this.ttlMs) {
        this.transfers.delete(transfer.id)
      }
    }
  }

  /** A finished transfer's time and bytes, into the statistics (once). */
  private count(transfer: Transfer) {
    if (transfer.counted || transfer.startedAt === undefined) return
    transfer.counted = true
    const seconds = (performance.now() - transfer.startedAt) / 1000
    const bucket = transferSecondsBuckets.findIndex((bound) => seconds <= bound)
    this.transferSeconds.buckets[bucket === -1 ? transferSecondsBuckets.length : bucket]!++
    this.transferSeconds.sum += seconds
    this.transferSeconds.count++
    this.bytesTransferred += transfer.bytes
  }

  get stats() {
    // A transfer whose chunks were all read and marked done, with nobody waiting, is finished: its
    // record stays until the TTL only so that a late duplicate of a chunk is refused.
    let transfersActive = 0
    for (const transfer of this.transfers.values()) {
      if (transfer.chunks.size > 0 || transfer.waiters.size > 0 || !finished(transfer)) transfersActive++
    }
    return {
      transfersActive,
      transfersRemembered: this.transfers.size - transfersActive,
      chunksStored: this.chunksStored,
      transferSeconds: { ...this.transferSeconds, buckets: [...this.transferSeconds.buckets] },
      bytesTransferred: this.bytesTransferred,
      ...this.counters
    }
  }

  private transfer(id: string): Transfer {
    let transfer = this.transfers.get(id)
    if (transfer === undefined) {
      transfer = {
        id,
        chunks: new Map(),
        done: new Set(),
        numChunks: undefined,
        waiters: new Set(),
        touchedAt: 0,
        startedAt: undefined,
        bytes: 0,
        counted: false
      }
      this.transfers.set(id, transfer)
    }
    transfer.touchedAt = Date.now()
    return transfer
  }

  private setChunkCount(transfer: Transfer, numChunks: number) {
    if (transfer.numChunks !== undefined && transfer.numChunks !== numChunks) {
      throw new InvalidRequest({
        reason: `transfer "${transfer.id}" has ${transfer.numChunks} chunks, not ${numChunks}`
      })
    }
    transfer.numChunks = numChunks
  }

  private lookup(transfer: Transfer, chunk: number): RecvResult | undefined {
    if (transfer.done.has(chunk)) {
      throw new InvalidRequest({ reason: `chunk ${chunk} of transfer "${transfer.id}" was already marked done` })
    }
    const stored = transfer.chunks.get(chunk)
    if (stored !== undefined) return stored
    if (transfer.numChunks !== undefined && chunk >= transfer.numChunks) return "end"
    return undefined
  }

  private deliver(result: RecvResult, reader: Reader): RecvResult {
    if (result !== "end") {
      result.readers.add(reader)
      reader.received.add(result)
    }
    return result
  }

  private wake(transfer: Transfer) {
    for (const waiter of transfer.waiters) {
      const stored = transfer.chunks.get(waiter.chunk)
      if (stored !== undefined) waiter.settle(stored)
      else if (transfer.numChunks !== undefined && waiter.chunk >= transfer.numChunks) waiter.settle("end")
    }
  }

  private free(transfer: Transfer, stored: StoredChunk) {
    transfer.chunks.delete(stored.chunk)
    this.chunksStored--
    for (const reader of stored.readers) reader.received.delete(stored)
    if (stored.offset !== undefined) this.slots.release(stored.offset)
  }
}
