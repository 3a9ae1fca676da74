import net from "node:net"
import { Arena } from "./Arena.js"
import { InvalidRequest, SidecarUnavailable } from "./errors.js"
import {
  type ClientReply,
  type ClientRequest,
  decodeMessage,
  decodeServerFrame,
  encodeFrame,
  FrameReader,
  type PayloadMeta,
  Send,
  type ServerFrame,
  type SidecarStats,
  unpackBody
} from "./protocol.js"
import { type DType, Tensor, tensorByteLength } from "./Tensor.js"

/**
 * What an executor uses to hand data to executors on its own node or on others.
 *
 * Control messages go to the node's sidecar over its Unix socket; tensor and byte data go through
 * the node's arena, which the client maps at connect time: a sent tensor is copied once into a
 * slot (or written there in the first place, see `allocate`), and a received one is a view of its
 * slot, valid until it is marked done.
 *
 * A send that copies asks the sidecar to give its slot back once everyone is done with the chunk,
 * so that the next chunk of that size is copied in at once rather than after a round trip for a
 * slot, and into memory this process wrote last. A spare not used within `spareIdleMs` goes back
 * to the arena.
 */

/** What can be sent: a tensor or bytes (through the arena), or a small string or number (inline). */
export type Payload = Tensor | Uint8Array | string | number

export interface SidecarClientOptions {
  /** How long a send waits for room in a full arena, here or on a receiving node (default 30 s). */
  readonly allocTimeoutMs?: number
  /** How long a receive waits for its chunk (default 60 s). */
  readonly recvTimeoutMs?: number
  /** How long any request waits for an answer beyond the waits above (default 30 s). */
  readonly answerTimeoutMs?: number
  /** How long a request waits for the node's sidecar to be back once it went away (default 5 s). */
  readonly reconnectWaitMs?: number
  /** How long a spare slot waits for the next send of its size before it is given back (default 1 s; 0: no spares). */
  readonly spareIdleMs?: number
}

export interface SendOptions {
  /** The receiving nodes; this client's own node id for an executor on the same node. */
  readonly to: ReadonlyArray<string>
  /** This chunk's index (default 0). */
  readonly chunk?: number
  /** How many chunks the transfer has (default 1). */
  readonly numChunks?: number
  /** The number of chunks is not known yet: `closeStream` ends the transfer. */
  readonly stream?: boolean
  readonly timeoutMs?: number
  /** The sender's span (W3C traceparent): the sidecar's span of the send is its child. */
  readonly traceparent?: string
}

interface PendingAnswer {
  /** The connection the request went out on. */
  readonly socket: net.Socket
  readonly resolve: (reply: ClientReply) => void
  readonly reject: (error: unknown) => void
  readonly timer: NodeJS.Timeout
}

/** What a client remembers of a stream it sends, so that closeStream(id) needs nothing else. */
interface OpenStream {
  readonly to: Set<string>
  numChunks: number
}

/** The slot of a chunk sent earlier, given back by the sidecar for the next chunk of its size class. */
interface Spare {
  readonly offset: number
  /** Gives it back once it has waited spareIdleMs. */
  readonly timer: NodeJS.Timeout
}

/** How often a client whose sidecar went away tries to connect to the one that replaces it. */
const reconnectIntervalMs = 100

/**
 * A client outlives its sidecar: when the sidecar goes away (killed, restarted by the node agent),
 * what was asked of it fails as SidecarUnavailable, and the next request connects to the sidecar
 * that replaces it at the same socket, waiting up to `reconnectWaitMs` for it to be there.
 */
export class SidecarClient {
  private readonly pending = new Map<number, PendingAnswer>()
  /** Slots handed out by `allocate` and not sent yet: offset → bytes. */
  private readonly allocations = new Map<number, number>()
  private readonly streams = new Map<string, OpenStream>()
  /** Spare slots by slot size. */
  private readonly spares = new Map<number, Spare>()
  private minSlotBytes = 1
  private nextRid = 0
  private socket: net.Socket | undefined
  /** Counts the connections made, so that a request can tell whether its connection was replaced. */
  private connections = 0
  private reconnecting: Promise<void> | undefined
  private closedByClient = false
  private arena: Arena | undefined
  private node = ""
  private readonly allocTimeoutMs: number
  private readonly recvTimeoutMs: number
  private readonly answerTimeoutMs: number
  private readonly reconnectWaitMs: number
  private readonly spareIdleMs: number

  private constructor(
    readonly socketPath: string,
    options: SidecarClientOptions
  ) {
    this.allocTimeoutMs = options.allocTimeoutMs ?? 30_000
    this.recvTimeoutMs = options.recvTimeoutMs ?? 60_000
    this.answerTimeoutMs = options.answerTimeoutMs ?? 30_000
    this.reconnectWaitMs = options.reconnectWaitMs ?? 5_000
    this.spareIdleMs = options.spareIdleMs ?? 1_000
  }

  /** Connects to the node's sidecar and maps its arena. */
  static async connect(socketPath: string, options: SidecarClientOptions = {}): Promise<SidecarClient> {
    const client = new SidecarClient(socketPath, options)
    await client.open()
    return client
  }

  /** Opens a connection to whichever sidecar listens at the socket now, and maps its arena. */
  private async open(): Promise<void> {
    const socket = net.connect(this.socketPath)
    await new Promise<void>((resolve, reject) => {
      socket.once("connect", resolve)
      socket.once("error", (error) => reject(this.unavailable(error.message)))
    })
    let closedReason: string | undefined
    const reader = new FrameReader()
    socket.on("data", (data: Buffer) => {
      try {
        for (const body of reader.push(data)) this.answer(decodeServerFrame(unpackBody(body)))
      } catch (error) {
        socket.destroy(error as Error)
      }
    })
    socket.on("error", (error) => (closedReason ??= error.message))
    socket.once("close", () => {
      const error = this.unavailable(
        this.closedByClient ? "the client closed" : (closedReason ?? "the connection closed")
      )
      for (const [rid, answer] of this.pending) {
        if (answer.socket !== socket) continue
        this.pending.delete(rid)
        clearTimeout(answer.timer)
        answer.reject(error)
      }
    })
    this.socket = socket
    this.connections++
    try {
      const info = await this.request({ _tag: "Hello", pid: process.pid }, "ArenaInfo", this.answerTimeoutMs)
      this.node = info.nodeId
      this.minSlotBytes = info.minSlotBytes
      this.arena = Arena.open(info.arenaPath, info.segmentBytes)
    } catch (error) {
      socket.destroy()
      throw error
    }
  }

  /**
   * Connects to the sidecar that replaced the one that went away, trying until `reconnectWaitMs`
   * has passed. What this client allocated or streamed belonged to the old sidecar and went with it.
   */
  private reconnect(): Promise<void> {
    this.reconnecting ??= (async () => {
      const deadline = Date.now() + this.reconnectWaitMs
      for (;;) {
        try {
          this.dropSpares()
          await this.open()
          this.allocations.clear()
          this.streams.clear()
          return
        } catch (error) {
          if (Date.now() + reconnectIntervalMs > deadline)
            throw this.unavailable(`no sidecar is back within ${this.reconnectWaitMs} ms: ${(error as Error).message}`)
          await new Promise((resolve) => setTimeout(resolve, reconnectIntervalMs))
        }
      }
    })().finally(() => (this.reconnecting = undefined))
    return this.reconnecting
  }

  /** Resolves once a connection is open and its sidecar's arena mapped, reconnecting if need be. */
  private async connected(): Promise<void> {
    if (this.reconnecting !== undefined || this.socket?.destroyed !== false) await this.reconnect()
  }

  /** Whether the connection a request was made on (`connection`, from `connections`) has gone since. */
  private lost(connection: number): boolean {
    return !this.closedByClient && (connection !== this.connections || this.socket?.destroyed === true)
  }

  /** The node this client's sidecar serves. */
  get nodeId(): string {
    return this.node
  }

  /**
   * Sends one chunk of transfer `id` to the executors of the nodes in `to`. Resolves once every
   * destination holds the chunk; the caller may then reuse `data` (unless it came from `allocate`,
   * whose slot now belongs to the transfer).
   */
  async send(id: string, data: Payload, options: SendOptions): Promise<void> {
    const chunk = options.chunk ?? 0
    const timeoutMs = options.timeoutMs ?? this.allocTimeoutMs
    const { meta, bytes } = describePayload(data)
    // Checked before a slot is taken, so that a malformed send cannot strand one.
    const message = decodeMessage(Send, {
      _tag: "Send",
      id,
      chunk,
      numChunks: options.stream === true ? null : (options.numChunks ?? 1),
      to: options.to,
      meta,
      timeoutMs,
      offset: null,
      spare: false,
      ...(options.traceparent === undefined ? {} : { trace: options.traceparent })
    })
    const sendOnce = async () => {
      if (options.stream === true) this.trackStream(id, chunk, options.to)
      const placed = bytes === undefined || bytes.length === 0 ? undefined : await this.place(bytes, timeoutMs)
      const copy = placed !== undefined && !placed.inPlace
      const connection = this.connections
      await this.request(
        { ...message, offset: placed?.offset ?? null, spare: copy && this.spareIdleMs > 0 },
        "Ok",
        timeoutMs + this.answerTimeoutMs,
        copy ? () => this.copyIn(bytes!, placed.offset, connection) : undefined
      )
    }
    const connection = this.connections
    try {
      await sendOnce()
    } catch (error) {
      // The sidecar went away before it answered, and everything it held with it: the chunk
      // cannot arrive twice, so it is sent again, to the sidecar that replaces it.
      if (!(error instanceof SidecarUnavailable) || !this.lost(connection)) throw error
      await sendOnce()
    }
  }

  /**
   * Chunk `chunk` of transfer `id`, waiting for it if it has not arrived; undefined past the last
   * chunk of the transfer. A tensor or bytes are a view of the arena: no copy, valid until the
   * chunk is marked done. Receiving the same chunk again gives the same data.
   */
  async recv(id: string, chunk = 0, options: { readonly timeoutMs?: number } = {}): Promise<Payload | undefined> {
    const timeoutMs = options.timeoutMs ?? this.recvTimeoutMs
    const reply = await this.request(
      { _tag: "Recv", id, chunk, timeoutMs },
      ["Received", "StreamEnd"],
      timeoutMs + this.answerTimeoutMs
    )
    if (reply._tag === "StreamEnd") return undefined
    return this.materialize(reply.meta, reply.offset)
  }

  /** Frees a received chunk, or (no chunk given) everything left of the transfer. */
  async markDone(id: string, chunk?: number): Promise<void> {
    await this.request({ _tag: "MarkDone", id, chunk: chunk ?? null }, "Ok", this.answerTimeoutMs)
  }

  /**
   * Drops transfer `id` on this node: waits up to `timeoutMs` for its first chunk, then frees
   * everything of it. Best effort: data that never arrives is left to the sidecar's time limit.
   */
  async drop(id: string, timeoutMs: number): Promise<void> {
    await this.recv(id, 0, { timeoutMs }).then(
      () => this.markDone(id),
      () => undefined
    )
  }

  /**
   * Ends a stream sent with `stream: true`: its receivers get undefined past the last chunk. By
   * default the chunk count and destinations are those of the chunks this client sent.
   */
  async closeStream(
    id: string,
    options: { readonly numChunks?: number; readonly to?: ReadonlyArray<string> } = {}
  ): Promise<void> {
    const stream = this.streams.get(id)
    const numChunks = options.numChunks ?? stream?.numChunks ?? 0
    const to = options.to ?? [...(stream?.to ?? [])]
    if (to.length === 0)
      throw new InvalidRequest({
        reason: `closeStream("${id}") needs destinations: no chunk of it was sent with stream: true`
      })
    await this.request(
      { _tag: "CloseStream", id, numChunks, to: to as [string, ...Array<string>] },
      "Ok",
      this.answerTimeoutMs
    )
    this.streams.delete(id)
  }

  /**
   * A tensor in the arena for a producer to write its output into directly; sending it then moves
   * no bytes at all. Like Buffer.allocUnsafe it is not cleared (it holds what the slot last held):
   * the producer writes all of it. Until it is sent, `discard` gives it back.
   */
  async allocate<D extends DType>(
    dtype: D,
    shape: ReadonlyArray<number>,
    options: { readonly timeoutMs?: number } = {}
  ): Promise<Tensor<D>> {
    const bytes = tensorByteLength(dtype, shape)
    if (bytes === 0) return Tensor.zeros(dtype, shape)
    const timeoutMs = options.timeoutMs ?? this.allocTimeoutMs
    const { offset } = await this.request(
      { _tag: "Allocate", bytes, timeoutMs },
      "Allocated",
      timeoutMs + this.answerTimeoutMs
    )
    this.allocations.set(offset, bytes)
    const view = this.mapped().view(offset, bytes)
    return Tensor.view(dtype, shape, view.buffer, view.byteOffset)
  }

  /** Gives back a tensor from `allocate` that will not be sent. */
  async discard(tensor: Tensor): Promise<void> {
    const offset = this.mapped().offsetOf(tensor.bytes)
    if (offset === undefined || !this.allocations.delete(offset)) return
    await this.request({ _tag: "Release", offset }, "Ok", this.answerTimeoutMs)
  }

  /** The sidecar's counters (for /metrics). */
  async stats(): Promise<SidecarStats> {
    return this.request({ _tag: "GetStats" }, "SidecarStats", this.answerTimeoutMs)
  }

  /** Replaces the sidecar's peers: node id → "host:port" of its peer port. */
  async setPeers(peers: Readonly<Record<string, string>>): Promise<void> {
    await this.request({ _tag: "SetPeers", peers }, "Ok", this.answerTimeoutMs)
  }

  /** Disconnects; the sidecar frees what this client allocated and did not send. */
  async close(): Promise<void> {
    this.closedByClient = true
    // The sidecar frees the spares of a client that disconnects.
    this.dropSpares()
    const socket = this.socket
    if (socket === undefined || socket.destroyed) return
    const closed = new Promise((resolve) => socket.once("close", resolve))
    socket.end()
    await closed
  }

  /**
   * The slot for bytes to send: their own when they came from `allocate` (in place), else a spare
   * or a new slot for them to be copied into.
   */
  private async place(
    bytes: Uint8Array,
    timeoutMs: number
  ): Promise<{ readonly offset: number; readonly inPlace: boolean; readonly slotBytes: number }> {
    // What was allocated in the arena of a sidecar that went away is no place to send from.
    await this.connected()
    const slotBytes = this.slotBytesFor(bytes.length)
    const own = this.mapped().offsetOf(bytes)
    if (own !== undefined && this.allocations.get(own) === bytes.length) {
      this.allocations.delete(own)
      return { offset: own, inPlace: true, slotBytes }
    }
    const offset =
      this.takeSpare(slotBytes) ??
      (
        await this.request(
          { _tag: "Allocate", bytes: bytes.length, timeoutMs },
          "Allocated",
          timeoutMs + this.answerTimeoutMs
        )
      ).offset
    return { offset, inPlace: false, slotBytes }
  }

  /** Copies a chunk into the slot it was given on `connection`, unless another sidecar has replaced that one since. */
  private copyIn(bytes: Uint8Array, offset: number, connection: number) {
    if (connection !== this.connections) throw this.unavailable("the sidecar was replaced while the chunk was placed")
    this.mapped().view(offset, bytes.length).set(bytes)
  }

  /** The size of the slot the sidecar gives for `bytes`: the power of two that holds them, at least the smallest slot. */
  private slotBytesFor(bytes: number): number {
    const slotBytes = 2 ** Math.ceil(Math.log2(bytes))
    // Math.log2 may round 2^k + 1 down to k for very large k.
    return Math.max(this.minSlotBytes, slotBytes < bytes ? slotBytes * 2 : slotBytes)
  }

  private takeSpare(slotBytes: number): number | undefined {
    const spare = this.spares.get(slotBytes)
    if (spare === undefined) return undefined
    clearTimeout(spare.timer)
    this.spares.delete(slotBytes)
    return spare.offset
  }

  /** Keeps a slot the sidecar gave back as a spare, for spareIdleMs. */
  private keepSpare(slotBytes: number, offset: number) {
    if (this.closedByClient) return
    if (this.spares.has(slotBytes)) return this.giveBack(offset)
    const timer = setTimeout(() => {
      if (this.spares.get(slotBytes)?.offset !== offset) return
      this.spares.delete(slotBytes)
      this.giveBack(offset)
    }, this.spareIdleMs).unref()
    this.spares.set(slotBytes, { offset, timer })
  }

  /** Releases a spare; nothing is lost if the sidecar is gone, since the spare went with it. */
  private giveBack(offset: number) {
    if (this.closedByClient || this.socket?.destroyed !== false) return
    this.request({ _tag: "Release", offset }, "Ok", this.answerTimeoutMs).catch(() => undefined)
  }

  private dropSpares() {
    for (const spare of this.spares.values()) clearTimeout(spare.timer)
    this.spares.clear()
  }

  private materialize(meta: PayloadMeta, offset: number | null): Payload {
    switch (meta._tag) {
      case "Value":
        return meta.value
      case "Bytes": {
        if (offset === null) return new Uint8Array(0)
        const view = this.mapped().view(offset, meta.length)
        return new Uint8Array(view.buffer, view.byteOffset, view.length)
      }
      case "Tensor": {
        if (offset === null) return Tensor.zeros(meta.dtype, meta.shape)
        const view = this.mapped().view(offset, tensorByteLength(meta.dtype, meta.shape))
        return Tensor.view(meta.dtype, meta.shape, view.buffer, view.byteOffset)
      }
    }
  }

  private trackStream(id: string, chunk: number, to: ReadonlyArray<string>) {
    const stream = this.streams.get(id) ?? { to: new Set<string>(), numChunks: 0 }
    for (const node of to) stream.to.add(node)
    stream.numChunks = Math.max(stream.numChunks, chunk + 1)
    this.streams.set(id, stream)
  }

  /**
   * Sends a request and waits for its answer. `beforeWrite` runs once the request is encoded and
   * just before it goes out: a send copies its chunk in there, after the work that the copy would
   * otherwise push out of the processor's caches.
   */
  private async request<T extends ClientReply["_tag"]>(
    request: ClientRequest,
    expected: T | ReadonlyArray<T>,
    deadlineMs: number,
    beforeWrite?: () => void
  ): Promise<Extract<ClientReply, { _tag: T }>> {
    if (this.closedByClient) throw this.unavailable("the client closed")
    // Hello goes out on the connection being opened; any other request waits until one is open
    // and its arena mapped, since an answer may name a place in that arena.
    if (request._tag !== "Hello") await this.connected()
    const socket = this.socket!
    const rid = this.nextRid++
    const frame = encodeFrame({ rid, request })
    return new Promise<ClientReply>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(rid)
        reject(this.unavailable(`no answer to ${request._tag} within ${deadlineMs} ms`))
      }, deadlineMs)
      this.pending.set(rid, { socket, resolve, reject, timer })
      try {
        beforeWrite?.()
      } catch (error) {
        this.pending.delete(rid)
        clearTimeout(timer)
        return reject(error)
      }
      socket.write(frame)
    }).then((reply) => {
      const tags: ReadonlyArray<string> = typeof expected === "string" ? [expected] : expected
      if (!tags.includes(reply._tag))
        throw new InvalidRequest({ reason: `the sidecar answered ${request._tag} with ${reply._tag}` })
      return reply as Extract<ClientReply, { _tag: T }>
    })
  }

  private answer(frame: typeof ServerFrame.Type) {
    if ("spare" in frame) return this.keepSpare(frame.spare.slotBytes, frame.spare.offset)
    const answer = this.pending.get(frame.rid)
    if (answer === undefined) return
    this.pending.delete(frame.rid)
    clearTimeout(answer.timer)
    if ("error" in frame) answer.reject(frame.error)
    else answer.resolve(frame.reply)
  }

  private mapped(): Arena {
    if (this.arena === undefined) throw this.unavailable("not connected")
    return this.arena
  }

  private unavailable(reason: string) {
    return new SidecarUnavailable({ socketPath: this.socketPath, reason })
  }
}

const describePayload = (data: Payload): { meta: PayloadMeta; bytes: Uint8Array | undefined } => {
  if (typeof data === "string" || typeof data === "number")
    return { meta: { _tag: "Value", value: data }, bytes: undefined }
  if (data instanceof Tensor)
    return { meta: { _tag: "Tensor", dtype: data.dtype, shape: data.shape }, bytes: data.bytes }
  if (data instanceof Uint8Array) return { meta: { _tag: "Bytes", length: data.length }, bytes: data }
  throw new InvalidRequest({
    reason: `a sidecar sends tensors, bytes, strings and numbers, not ${Object.prototype.toString.call(data)}`
  })
}
