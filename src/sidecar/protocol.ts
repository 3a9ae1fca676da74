import { Packr } from "msgpackr"
import * as Schema from "effect/Schema"
import { InvalidRequest, SidecarError } from "./errors.js"
import { type DType, dtypes, tensorByteLength } from "./Tensor.js"

/**
 * The sidecar's wire messages: small typed records, msgpack-encoded, each in a frame
 * `[u32 LE body length][msgpack body]`. Executors talk to their sidecar with the Client* messages
 * over a Unix socket; sidecars talk to each other with the Peer* messages over TCP, where a Chunk
 * frame is followed by the chunk's raw bytes. Tensor bytes never travel in a msgpack body.
 */

const Count = Schema.Int.pipe(Schema.greaterThanOrEqualTo(0))
const Positive = Schema.Int.pipe(Schema.greaterThan(0))
const TransferId = Schema.String.pipe(Schema.minLength(1))
const NodeId = Schema.String.pipe(Schema.minLength(1))

// ---------------------------------------------------------------------------------------------
// What a chunk holds

const TensorMeta = Schema.TaggedStruct("Tensor", { dtype: Schema.Literal(...dtypes), shape: Schema.Array(Count) })
const BytesMeta = Schema.TaggedStruct("Bytes", { length: Count })
/** Strings and numbers travel inline: they are small, and a receiver wants them as JS values. */
const ValueMeta = Schema.TaggedStruct("Value", { value: Schema.Union(Schema.String, Schema.Number) })
export const PayloadMeta = Schema.Union(TensorMeta, BytesMeta, ValueMeta)
export type PayloadMeta = typeof PayloadMeta.Type

/** The bytes of a chunk that live in the arena (0 for inline values and empty tensors). */
export const payloadBytes = (meta: PayloadMeta): number => {
  switch (meta._tag) {
    case "Tensor":
      return tensorByteLength(meta.dtype, meta.shape)
    case "Bytes":
      return meta.length
    case "Value":
      return 0
  }
}

// ---------------------------------------------------------------------------------------------
// Executor ⇄ sidecar (Unix socket)

const Hello = Schema.TaggedStruct("Hello", { pid: Count })
/** Reserve a slot to write a chunk into; waits up to timeoutMs while the arena is full. */
const Allocate = Schema.TaggedStruct("Allocate", { bytes: Positive, timeoutMs: Count })
/** Give back a slot that was allocated and not sent. */
const Release = Schema.TaggedStruct("Release", { offset: Count })
/** A traceparent is 55 characters; room for a later version's. */
const maxTraceChars = 256

/** Receivers of one chunk on one node, at most: one entry of a send's `to` each. */
export const maxReaders = 64

export const Send = Schema.TaggedStruct("Send", {
  id: TransferId,
  chunk: Count,
  /** null: a stream whose length CloseStream gives later. */
  numChunks: Schema.NullOr(Positive),
  /**
   * The nodes of the chunk's receivers, a node once for each receiver there: it is freed on a node
   * once that many have marked it done there.
   */
  to: Schema.NonEmptyArray(NodeId).pipe(Schema.maxItems(maxReaders)),
  meta: PayloadMeta,
  /** How long a receiving node may wait for room in its arena. */
  timeoutMs: Count,
  /** The slot holding the chunk's bytes; null when it has none (inline values, empty tensors). */
  offset: Schema.NullOr(Count),
  /**
   * Whether the chunk's slot should go back to the sender once everyone is done with it, as a
   * spare to copy its next chunk of that size into without asking for a slot first (see SpareSlot).
   */
  spare: Schema.Boolean,
  /** The sender's span (W3C traceparent), when the send is part of a traced request. */
  trace: Schema.optional(Schema.String.pipe(Schema.maxLength(maxTraceChars)))
})
const Recv = Schema.TaggedStruct("Recv", { id: TransferId, chunk: Count, timeoutMs: Count })
/** chunk null: the whole transfer is done; its remaining chunks are freed and its id forgotten. */
const MarkDone = Schema.TaggedStruct("MarkDone", { id: TransferId, chunk: Schema.NullOr(Count) })
const CloseStream = Schema.TaggedStruct("CloseStream", {
  id: TransferId,
  numChunks: Count,
  to: Schema.NonEmptyArray(NodeId)
})
const GetStats = Schema.TaggedStruct("GetStats", {})
/** Replaces the peer sidecars: node id → host:port. */
const SetPeers = Schema.TaggedStruct("SetPeers", { peers: Schema.Record({ key: NodeId, value: Schema.String }) })

export const ClientRequest = Schema.Union(
  Hello,
  Allocate,
  Release,
  Send,
  Recv,
  MarkDone,
  CloseStream,
  GetStats,
  SetPeers
)
export type ClientRequest = typeof ClientRequest.Type

const ArenaInfo = Schema.TaggedStruct("ArenaInfo", {
  nodeId: NodeId,
  arenaPath: Schema.String,
  arenaBytes: Count,
  segmentBytes: Positive,
  /** The smallest slot: a request of fewer bytes takes one this large. */
  minSlotBytes: Positive
})
const Allocated = Schema.TaggedStruct("Allocated", { offset: Count })
const Received = Schema.TaggedStruct("Received", { meta: PayloadMeta, offset: Schema.NullOr(Count) })
/** The chunk asked for is past the end of the transfer. */
const StreamEnd = Schema.TaggedStruct("StreamEnd", {})
const Ok = Schema.TaggedStruct("Ok", {})

/** Upper bounds (seconds) of the buckets of the sidecar's transfer-time histogram. */
export const transferSecondsBuckets: ReadonlyArray<number> = [
  0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10
]

export const SidecarStats = Schema.TaggedStruct("SidecarStats", {
  nodeId: NodeId,
  arenaBytes: Count,
  /** Bytes of the arena that hold memory: it grows as slots are first handed out. */
  arenaCommittedBytes: Count,
  /** Bytes of the arena held by slots (whole size classes), spare slots not included. */
  bytesInUse: Count,
  slotsInUse: Count,
  /** Spare slots that senders hold to copy their next chunk into. */
  bytesReserved: Count,
  slotsReserved: Count,
  largestFreeBytes: Count,
  /** Transfers in progress: data stored, receivers waiting, or chunks not yet all read. */
  transfersActive: Count,
  /** Finished transfers whose record stays until the TTL, so that a duplicate chunk is refused. */
  transfersRemembered: Count,
  /**
   * Transfers that finished (every chunk marked done by its receivers), from their first chunk's
   * arrival to their last chunk's release: the count of each bucket of transferSecondsBuckets
   * (not cumulative), their sum and count, and their bytes.
   */
  transferSeconds: Schema.Struct({ buckets: Schema.Array(Count), sum: Schema.Number, count: Count }),
  bytesTransferred: Count,
  chunksStored: Count,
  /** Chunks stored here: from executors of this node and from peers. */
  chunksReceivedLocal: Count,
  chunksReceivedRemote: Count,
  chunksForwarded: Count,
  bytesForwarded: Count,
  /** Allocations that found the arena full and waited, and those that gave up. */
  allocationWaits: Count,
  allocationTimeouts: Count,
  /** Receives that waited for their chunk, and those that gave up. */
  recvWaits: Count,
  recvTimeouts: Count,
  /** Chunks nobody marked done, freed after the TTL. */
  chunksReclaimed: Count,
  /** Slots freed because the executor holding them disconnected. */
  slotsReleasedOnDisconnect: Count,
  clients: Count,
  peersConnected: Count
})
export type SidecarStats = typeof SidecarStats.Type

export const ClientReply = Schema.Union(ArenaInfo, Allocated, Received, StreamEnd, Ok, SidecarStats)
export type ClientReply = typeof ClientReply.Type

export const ClientFrame = Schema.Struct({ rid: Count, request: ClientRequest })
/**
 * The slot of a chunk sent with `spare`, now that everyone is done with it, back to its sender and
 * owned by it again; it answers no request. The sender gives it back with Release if it does not
 * use it.
 */
const SpareSlot = Schema.Struct({ offset: Count, slotBytes: Positive })

export const ServerFrame = Schema.Union(
  Schema.Struct({ rid: Count, reply: ClientReply }),
  Schema.Struct({ rid: Count, error: SidecarError }),
  Schema.Struct({ spare: SpareSlot })
)

// ---------------------------------------------------------------------------------------------
// Sidecar ⇄ sidecar (TCP). The node that receives dials the node that sends (see PeerTransport).
// Before any data, each side proves the internal secret over the other's challenge (see
// PeerHandshake): hello (the receiver's challenge), welcome (the sender's proof and challenge),
// proof (the receiver's).

/** A challenge, and an HMAC-SHA256 proof over one. */
export const handshakeBytes = 32
const HandshakeBytes = Schema.Uint8ArrayFromSelf.pipe(
  Schema.filter((bytes) => bytes.length === handshakeBytes || `${handshakeBytes} bytes, not ${bytes.length}`)
)
/** A node's name as a handshake carries it: a name is short (see SidecarOptions). */
const PeerName = NodeId.pipe(Schema.maxLength(256))

const PeerHello = Schema.TaggedStruct("PeerHello", { nodeId: PeerName, nonce: HandshakeBytes })
export const PeerWelcome = Schema.TaggedStruct("PeerWelcome", {
  nodeId: PeerName,
  nonce: HandshakeBytes,
  proof: HandshakeBytes
})
const PeerProof = Schema.TaggedStruct("PeerProof", { proof: HandshakeBytes })
/** Followed on the wire by payloadBytes(meta) raw bytes. */
export const PeerChunk = Schema.TaggedStruct("PeerChunk", {
  seq: Count,
  id: TransferId,
  chunk: Count,
  numChunks: Schema.NullOr(Positive),
  meta: PayloadMeta,
  timeoutMs: Count,
  /** Receivers on that node that each read the chunk and mark it done (1 when left out). */
  readers: Schema.optional(Positive.pipe(Schema.lessThanOrEqualTo(maxReaders)))
})
const PeerClose = Schema.TaggedStruct("PeerClose", { seq: Count, id: TransferId, numChunks: Count })
const PeerAck = Schema.TaggedStruct("PeerAck", { seq: Count })
const PeerNack = Schema.TaggedStruct("PeerNack", { seq: Count, error: SidecarError })

/** What the sending side reads: the receiver's hello and proof, then acknowledgements. */
export const PeerReply = Schema.Union(PeerHello, PeerProof, PeerAck, PeerNack)
/** What the receiving side reads: the sender's welcome, then data. */
export const PeerData = Schema.Union(PeerWelcome, PeerChunk, PeerClose)

// ---------------------------------------------------------------------------------------------
// Framing

/** Larger bodies are refused: only inline values can make a body large, and they should not be. */
const maxBodyBytes = 16 * 1024 * 1024
export const frameLengthBytes = 4

const packr = new Packr({ moreTypes: true, useRecords: false })

/** Every message as it goes on the wire: the encoded side of its schema. */
export type WireMessage =
  | typeof ClientFrame.Encoded
  | typeof ServerFrame.Encoded
  | typeof PeerHello.Encoded
  | typeof PeerWelcome.Encoded
  | typeof PeerProof.Encoded
  | typeof PeerChunk.Encoded
  | typeof PeerClose.Encoded
  | typeof PeerAck.Encoded
  | typeof PeerNack.Encoded

/** An error class as a plain record; the receiving side's decode makes it the class again. */
export const encodeError = Schema.encodeSync(SidecarError)

/**
 * Frames a message. The message is already in its encoded form (only errors differ, see
 * encodeError), so nothing runs through a schema here: checking happens where messages are
 * decoded, and encoding a union through its schema costs more than the rest of a hand-off.
 */
export const encodeFrame = (message: WireMessage): Buffer => {
  const body = packr.pack(message)
  if (body.length > maxBodyBytes)
    throw new InvalidRequest({
      reason: `a message of ${body.length} bytes exceeds ${maxBodyBytes}; send large data as bytes`
    })
  const frame = Buffer.allocUnsafe(frameLengthBytes + body.length)
  frame.writeUInt32LE(body.length, 0)
  body.copy(frame, frameLengthBytes)
  return frame
}

/** The msgpack value of a frame body, not yet checked against a schema. */
export const unpackBody = (body: Uint8Array): unknown => {
  try {
    return packr.unpack(body)
  } catch (error) {
    throw new InvalidRequest({
      reason: `undecodable message: ${error instanceof Error ? error.message : String(error)}`
    })
  }
}

export const decodeMessage = <A, I>(schema: Schema.Schema<A, I>, raw: unknown): A => {
  const decoded = Schema.decodeUnknownEither(schema)(raw)
  if (decoded._tag === "Left") throw new InvalidRequest({ reason: decoded.left.message })
  return decoded.right
}

export const decodeBody = <A, I>(schema: Schema.Schema<A, I>, body: Uint8Array): A =>
  decodeMessage(schema, unpackBody(body))

// ---------------------------------------------------------------------------------------------
// The messages of every hand-off, checked by hand

/*
 * Each same-node hand-off decodes a Send in the sidecar and a Received and an Ok in the
 * executors, and there the schema's parser costs more than the rest of the hand-off. These
 * functions check the same rules as the schemas above and build the same values; whatever they do
 * not accept goes through the schema, which rejects it with its reason (or decodes a form left to
 * it). The protocol tests hold them to the schema's answers.
 */

type Fields = { readonly [key: string]: unknown }

const isFields = (value: unknown): value is Fields =>
  typeof value === "object" && value !== null && !Array.isArray(value)
const isCount = (value: unknown): value is number => Number.isSafeInteger(value) && (value as number) >= 0
const isCountOrNull = (value: unknown): value is number | null => value === null || isCount(value)
const isName = (value: unknown): value is string => typeof value === "string" && value.length > 0
const knownDtypes: ReadonlySet<unknown> = new Set(dtypes)

const payloadMetaOf = (raw: unknown): PayloadMeta | undefined => {
  if (!isFields(raw)) return undefined
  switch (raw._tag) {
    case "Tensor":
      if (!knownDtypes.has(raw.dtype) || !Array.isArray(raw.shape) || !raw.shape.every(isCount)) return undefined
      return { _tag: "Tensor", dtype: raw.dtype as DType, shape: [...raw.shape] }
    case "Bytes":
      return isCount(raw.length) ? { _tag: "Bytes", length: raw.length } : undefined
    case "Value":
      return typeof raw.value === "string" || typeof raw.value === "number"
        ? { _tag: "Value", value: raw.value }
        : undefined
  }
  return undefined
}

const sendOf = (raw: Fields): Extract<ClientRequest, { _tag: "Send" }> | undefined => {
  const { id, chunk, numChunks, to, timeoutMs, offset, spare, trace } = raw
  if (!isName(id) || !isCount(chunk) || !isCount(timeoutMs) || !isCountOrNull(offset)) return undefined
  if (!(numChunks === null || (isCount(numChunks) && numChunks > 0)) || typeof spare !== "boolean") return undefined
  if (trace !== undefined && !(typeof trace === "string" && trace.length <= maxTraceChars)) return undefined
  if (!Array.isArray(to) || to.length === 0 || to.length > maxReaders || !to.every(isName)) return undefined
  const meta = payloadMetaOf(raw.meta)
  if (meta === undefined) return undefined
  return {
    _tag: "Send",
    id,
    chunk,
    numChunks,
    to: [...to] as [string, ...Array<string>],
    meta,
    timeoutMs,
    offset,
    spare,
    ...(trace === undefined ? {} : { trace })
  }
}

const handOffReplyOf = (raw: Fields): ClientReply | undefined => {
  switch (raw._tag) {
    case "Received": {
      const meta = payloadMetaOf(raw.meta)
      return meta !== undefined && isCountOrNull(raw.offset)
        ? { _tag: "Received", meta, offset: raw.offset }
        : undefined
    }
    case "Ok":
      return { _tag: "Ok" }
  }
  return undefined
}

/** A frame from a client: a Send by hand, any other request through the schema. */
export const decodeClientFrame = (raw: unknown): typeof ClientFrame.Type => {
  if (isFields(raw) && isCount(raw.rid) && isFields(raw.request) && raw.request._tag === "Send") {
    const request = sendOf(raw.request)
    if (request !== undefined) return { rid: raw.rid, request }
  }
  return decodeMessage(ClientFrame, raw)
}

/** A frame from the sidecar: the answers of a hand-off by hand, any other through the schema. */
export const decodeServerFrame = (raw: unknown): typeof ServerFrame.Type => {
  if (isFields(raw) && isCount(raw.rid) && !("error" in raw) && isFields(raw.reply)) {
    const reply = handOffReplyOf(raw.reply)
    if (reply !== undefined) return { rid: raw.rid, reply }
  }
  return decodeMessage(ServerFrame, raw)
}

/**
 * Splits a byte stream into frame bodies. Bytes arrive in arbitrary pieces; a body is handed out
 * once all of it is there.
 */
export class FrameReader {
  private pending: Buffer = Buffer.alloc(0)

  /** `maxBytes`: the largest body taken (a peer's replies are small; a client's inline values less so). */
  constructor(private readonly maxBytes: number = maxBodyBytes) {}

  /** The complete bodies in the bytes received so far. Throws on a body over maxBytes. */
  push(bytes: Buffer): Array<Buffer> {
    this.pending = this.pending.length === 0 ? bytes : Buffer.concat([this.pending, bytes])
    const bodies: Array<Buffer> = []
    let start = 0
    while (this.pending.length - start >= frameLengthBytes) {
      const length = this.pending.readUInt32LE(start)
      if (length > this.maxBytes)
        throw new InvalidRequest({ reason: `a frame of ${length} bytes exceeds ${this.maxBytes}` })
      if (this.pending.length - start < frameLengthBytes + length) break
      bodies.push(this.pending.subarray(start + frameLengthBytes, start + frameLengthBytes + length))
      start += frameLengthBytes + length
    }
    this.pending = this.pending.subarray(start)
    return bodies
  }
}
