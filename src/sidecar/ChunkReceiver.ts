import type { Arena } from "./Arena.js"
import { type SidecarError, toSidecarError } from "./errors.js"
import { decodeBody, frameLengthBytes, PeerData, payloadBytes } from "./protocol.js"
import type { SlotPool } from "./SlotPool.js"
import type { TransferTable } from "./TransferTable.js"

/**
 * Reads a peer's stream of chunk frames straight into the arena.
 *
 * It drives a socket opened with `onread`: Node reads into whatever buffer `nextBuffer` names.
 * Headers land in a small scratch buffer; once a chunk's slot is allocated, the socket reads its
 * payload directly into the slot, so a large tensor crosses from the kernel into shared memory
 * with no copy in between. While the arena is full the socket is paused, which pushes back on the
 * sending sidecar through TCP flow control. The first frame is the sender's welcome, which proves
 * it holds the internal secret; nothing before it is stored.
 */

type PeerChunk = Extract<typeof PeerData.Type, { _tag: "PeerChunk" }>
export type PeerWelcome = Extract<typeof PeerData.Type, { _tag: "PeerWelcome" }>

type State =
  | { readonly kind: "frame" }
  | { readonly kind: "allocating"; readonly frame: PeerChunk }
  | {
      readonly kind: "payload"
      readonly frame: PeerChunk
      readonly offset: number
      readonly view: Buffer
      received: number
    }
  | { readonly kind: "discard"; readonly frame: PeerChunk; readonly error: unknown; remaining: number }

export interface ChunkReceiverOptions {
  readonly arena: Pick<Arena, "view">
  readonly slots: SlotPool
  readonly table: TransferTable
  /** Acknowledges a frame: error undefined means stored. */
  readonly reply: (seq: number, error: SidecarError | undefined) => void
  /** Restarts reading after a pause for an allocation. */
  readonly resume: () => void
  /** Drops the connection: what arrived after a pause is corrupt. */
  readonly fail: (error: Error) => void
  /**
   * Checks the sending node's welcome, the first frame on the connection (see PeerHandshake);
   * throws when it does not prove the secret. Nothing it sends is taken before.
   */
  readonly welcome: (message: PeerWelcome) => void
}

/** Headers are small records; a larger one means the stream is corrupt. */
const maxHeaderBytes = 64 * 1024
/**
 * At most this much is read into the scratch at once. Unparsed bytes then never exceed a partial
 * header plus one read, so after compaction the scratch always has a full read's room left: Node
 * must never be handed an empty buffer (it may read into one handed out before a pause).
 */
const scratchReadBytes = 64 * 1024
const scratchBytes = 4 * scratchReadBytes

export class ChunkReceiver {
  private readonly scratch = Buffer.alloc(scratchBytes)
  /** Unparsed bytes are scratch[start, end). */
  private start = 0
  private end = 0
  private state: State = { kind: "frame" }
  private closed = false
  private welcomed = false

  constructor(private readonly options: ChunkReceiverOptions) {}

  /** Where the next read from the socket goes. */
  nextBuffer(): Uint8Array {
    const state = this.state
    if (state.kind === "payload" && this.start === this.end) return state.view.subarray(state.received)
    if (this.start === this.end) {
      this.start = 0
      this.end = 0
    } else if (this.end > scratchBytes - scratchReadBytes) {
      this.scratch.copyWithin(0, this.start, this.end)
      this.end -= this.start
      this.start = 0
    }
    return this.scratch.subarray(this.end, this.end + scratchReadBytes)
  }

  /** Handles `bytes` bytes read into `buffer`; false pauses the socket. Throws on a corrupt stream. */
  onRead(bytes: number, buffer: Uint8Array): boolean {
    if (buffer.buffer === this.scratch.buffer) {
      const at = buffer.byteOffset - this.scratch.byteOffset
      // The buffer was handed out before the scratch was last compacted.
      if (at !== this.end) this.scratch.copyWithin(this.end, at, at + bytes)
      this.end += bytes
    } else {
      const state = this.state
      if (state.kind !== "payload") throw new Error("read into a slot while no payload was expected")
      state.received += bytes
      if (state.received === state.view.length) this.complete(state)
    }
    return this.parse()
  }

  /** The connection is gone: the slot of a half-received chunk is freed. */
  close(): void {
    this.closed = true
    if (this.state.kind === "payload") this.options.slots.release(this.state.offset)
    this.state = { kind: "frame" }
  }

  private parse(): boolean {
    for (;;) {
      const state = this.state
      const available = this.end - this.start
      switch (state.kind) {
        case "allocating":
          return false
        case "payload": {
          const count = Math.min(available, state.view.length - state.received)
          if (count > 0) {
            this.scratch.copy(state.view, state.received, this.start, this.start + count)
            this.start += count
            state.received += count
          }
          if (state.received < state.view.length) return true
          this.complete(state)
          continue
        }
        case "discard": {
          const count = Math.min(available, state.remaining)
          this.start += count
          state.remaining -= count
          if (state.remaining > 0) return true
          this.state = { kind: "frame" }
          this.options.reply(state.frame.seq, toSidecarError(state.error))
          continue
        }
        case "frame": {
          if (available < frameLengthBytes) return true
          const length = this.scratch.readUInt32LE(this.start)
          if (length > maxHeaderBytes) throw new Error(`a peer frame header of ${length} bytes is corrupt`)
          if (available < frameLengthBytes + length) return true
          const body = this.scratch.subarray(this.start + frameLengthBytes, this.start + frameLengthBytes + length)
          this.start += frameLengthBytes + length
          const message = decodeBody(PeerData, body)
          if (message._tag === "PeerWelcome") {
            if (this.welcomed) throw new Error("a second welcome on one connection")
            this.options.welcome(message)
            this.welcomed = true
          } else if (!this.welcomed) {
            throw new Error(`a ${message._tag} before the handshake`)
          } else if (message._tag === "PeerClose") {
            this.settle(message.seq, () => this.options.table.close(message.id, message.numChunks))
          } else {
            this.begin(message)
          }
        }
      }
    }
  }

  /** Starts a chunk: stores it when it has no bytes, else finds its slot (maybe waiting for one). */
  private begin(frame: PeerChunk) {
    const bytes = payloadBytes(frame.meta)
    if (bytes === 0) {
      this.settle(frame.seq, () => this.store(frame, undefined))
      return
    }
    let offset: number | undefined
    try {
      offset = this.options.slots.tryAllocate(bytes)
    } catch (error) {
      this.state = { kind: "discard", frame, error, remaining: bytes }
      return
    }
    if (offset !== undefined) {
      this.state = { kind: "payload", frame, offset, view: this.options.arena.view(offset, bytes), received: 0 }
      return
    }
    this.state = { kind: "allocating", frame }
    this.options.slots.allocate(bytes, frame.timeoutMs).then(
      (slot) => {
        if (this.closed) return this.options.slots.release(slot)
        this.state = { kind: "payload", frame, offset: slot, view: this.options.arena.view(slot, bytes), received: 0 }
        this.continueAfterPause()
      },
      (error: unknown) => {
        if (this.closed) return
        this.state = { kind: "discard", frame, error, remaining: bytes }
        this.continueAfterPause()
      }
    )
  }

  private continueAfterPause() {
    try {
      if (this.parse()) this.options.resume()
    } catch (error) {
      this.options.fail(error as Error)
    }
  }

  private complete(state: Extract<State, { kind: "payload" }>) {
    this.state = { kind: "frame" }
    this.settle(state.frame.seq, () => this.store(state.frame, state.offset))
  }

  private store(frame: PeerChunk, offset: number | undefined) {
    this.options.table.store(
      frame.id,
      frame.chunk,
      frame.numChunks ?? undefined,
      frame.meta,
      offset,
      "remote",
      frame.readers ?? 1
    )
  }

  private settle(seq: number, action: () => void) {
    try {
      action()
      this.options.reply(seq, undefined)
    } catch (error) {
      this.options.reply(seq, toSidecarError(error))
    }
  }
}
