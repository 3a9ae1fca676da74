import net from "node:net"
import * as Effect from "effect/Effect"
import type { Arena } from "./Arena.js"
import { ChunkReceiver, type PeerWelcome } from "./ChunkReceiver.js"
import { PeerUnavailable, type SidecarError, UnknownNode } from "./errors.js"
import {
  decodeBody,
  encodeError,
  encodeFrame,
  FrameReader,
  type PeerChunk,
  PeerReply,
  payloadBytes
} from "./protocol.js"
import { freshNonce, handshakeTimeoutMs, receiverProof, sameProof, senderProof } from "./PeerHandshake.js"
import type { SidecarLog } from "./SidecarLog.js"
import type { SlotPool } from "./SlotPool.js"
import type { TransferTable } from "./TransferTable.js"

/**
 * TCP between the sidecars of different nodes.
 *
 * Each sidecar dials every peer it knows, and a connection carries data from the dialled node to
 * the dialling one: the receiving side is the one that dials because only a socket it opens
 * itself can read into memory it names (Node's `onread`), which is how chunks land straight in
 * its arena (see ChunkReceiver). The sender writes a small header frame and then the chunk's
 * bytes directly from its arena, keeps writing the next chunks without waiting (pipelining), and
 * the receiver acknowledges each chunk once stored; the acknowledgement completes the executor's
 * send.
 *
 * Before any of that, both sides prove the internal secret (see PeerHandshake): a connection that
 * does not is dropped and logged, and the links already there go on untouched. Without the proof,
 * anyone who reaches the port could name itself another node and take the chunks meant for it.
 */

export interface PeerAddress {
  readonly host: string
  readonly port: number
}

/** "host:port" → address; throws a message a user can act on. */
export const parseAddress = (text: string): PeerAddress => {
  const match = /^(.+):(\d+)$/.exec(text.trim())
  const port = Number(match?.[2])
  if (match === null || !(port > 0 && port < 65536)) throw new Error(`"${text}" is not a host:port address`)
  return { host: match[1]!.replace(/^\[(.*)\]$/, "$1"), port }
}

/** "b=10.0.0.2:7100,c=10.0.0.3:7100" → node id → address. */
export const parsePeers = (text: string): ReadonlyMap<string, PeerAddress> => {
  const peers = new Map<string, PeerAddress>()
  for (const entry of text
    .split(",")
    .map((part) => part.trim())
    .filter((part) => part !== "")) {
    const separator = entry.indexOf("=")
    if (separator <= 0) throw new Error(`"${entry}" is not node-id=host:port`)
    peers.set(entry.slice(0, separator), parseAddress(entry.slice(separator + 1)))
  }
  return peers
}

type ChunkHeader = Omit<typeof PeerChunk.Type, "_tag" | "seq">

interface Pending {
  readonly resolve: () => void
  readonly reject: (error: SidecarError) => void
}

/** A peer that dialled us: what we send to that node goes over its socket. */
interface OutboundLink {
  readonly nodeId: string
  readonly socket: net.Socket
  readonly pending: Map<number, Pending>
}

const redialMs = 250
/** After a connection that did not get through the handshake: the peer is not what it should be. */
const refusedRedialMs = 2_000
/** A peer's replies are small records: acknowledgements, and the handshake's. */
const maxReplyBytes = 64 * 1024

export interface PeerTransportOptions {
  readonly nodeId: string
  readonly host: string
  readonly port: number
  readonly peers: ReadonlyMap<string, PeerAddress>
  /** How long a send waits for a peer to be connected. */
  readonly linkTimeoutMs: number
  readonly arena: Arena
  readonly slots: SlotPool
  readonly table: TransferTable
  readonly log: SidecarLog
  /** The internal secret both ends of a link prove (never send). */
  readonly secret: string
}

export class PeerTransport {
  private peers = new Map<string, PeerAddress>()
  private readonly dialers = new Map<string, Dialer>()
  private readonly links = new Map<string, OutboundLink>()
  private readonly linkWaiters = new Map<string, Set<(link: OutboundLink) => void>>()
  private readonly sockets = new Set<net.Socket>()
  private nextSeq = 0
  private chunksForwarded = 0
  private bytesForwarded = 0

  private constructor(
    private readonly options: PeerTransportOptions,
    private readonly server: net.Server
  ) {}

  /** Listens for peers and dials the known ones; everything is closed with the scope. */
  static start(options: PeerTransportOptions) {
    return Effect.acquireRelease(
      Effect.async<PeerTransport, Error>((resume) => {
        const server = net.createServer()
        const transport = new PeerTransport(options, server)
        server.on("connection", (socket) => transport.accept(socket))
        server.once("error", (error) => resume(Effect.fail(error)))
        server.listen(options.port, options.host, () => {
          transport.setPeers(options.peers)
          resume(Effect.succeed(transport))
        })
      }),
      (transport) => Effect.promise(() => transport.stop())
    )
  }

  get port(): number {
    return (this.server.address() as net.AddressInfo).port
  }

  knows(nodeId: string): boolean {
    return this.peers.has(nodeId)
  }

  get knownNodes(): ReadonlyArray<string> {
    return [...this.peers.keys()]
  }

  /**
   * Replaces the set of peers: new ones are dialled, removed ones no longer (nor sent to). A removed
   * peer's connection is closed, failing the sends waiting on it: a node that is gone (lost with
   * its link cut, say) may never answer, and its silence must not hold this node's senders.
   */
  setPeers(peers: ReadonlyMap<string, PeerAddress>): void {
    for (const [nodeId, link] of this.links) {
      if (peers.has(nodeId)) continue
      this.options.log.info(`node "${nodeId}" is no longer a peer: closing its connection`)
      link.socket.destroy()
      this.unregister(link, "it is no longer one of this node's peers")
    }
    for (const [nodeId, dialer] of this.dialers) {
      const address = peers.get(nodeId)
      if (address?.host === dialer.address.host && address.port === dialer.address.port) continue
      dialer.stop()
      this.dialers.delete(nodeId)
    }
    this.peers = new Map(peers)
    for (const [nodeId, address] of peers) {
      if (nodeId === this.options.nodeId || this.dialers.has(nodeId)) continue
      this.dialers.set(nodeId, new Dialer(nodeId, address, this.options, (socket) => this.track(socket)))
    }
  }

  /**
   * Streams a chunk to a peer; resolves once the peer has stored it. The slot (if any) is held
   * until its bytes are handed to the kernel.
   */
  async sendChunk(nodeId: string, header: ChunkHeader, offset: number | undefined): Promise<void> {
    const { slots, arena } = this.options
    if (offset !== undefined) slots.retain(offset)
    let held = offset !== undefined
    const releaseSlot = () => {
      if (held) slots.release(offset!)
      held = false
    }
    try {
      const link = await this.link(nodeId)
      const seq = this.nextSeq++
      const bytes = payloadBytes(header.meta)
      const stored = this.expectReply(link, seq)
      link.socket.cork()
      link.socket.write(encodeFrame({ _tag: "PeerChunk", seq, ...header }))
      if (offset !== undefined) link.socket.write(arena.view(offset, bytes), releaseSlot)
      link.socket.uncork()
      this.chunksForwarded++
      this.bytesForwarded += bytes
      await stored
    } finally {
      // After an acknowledgement the peer has every byte, so the slot is free even if the
      // write's own callback has not run yet.
      releaseSlot()
    }
  }

  /** Tells a peer the final chunk count of a stream. */
  async closeStream(nodeId: string, id: string, numChunks: number): Promise<void> {
    const link = await this.link(nodeId)
    const seq = this.nextSeq++
    const stored = this.expectReply(link, seq)
    link.socket.write(encodeFrame({ _tag: "PeerClose", seq, id, numChunks }))
    await stored
  }

  get stats() {
    return {
      chunksForwarded: this.chunksForwarded,
      bytesForwarded: this.bytesForwarded,
      peersConnected: this.links.size
    }
  }

  /** A socket to close on stop. */
  private track(socket: net.Socket) {
    this.sockets.add(socket)
    socket.once("close", () => this.sockets.delete(socket))
  }

  private expectReply(link: OutboundLink, seq: number): Promise<void> {
    return new Promise((resolve, reject) => link.pending.set(seq, { resolve, reject }))
  }

  private link(nodeId: string): Promise<OutboundLink> {
    const link = this.links.get(nodeId)
    if (link !== undefined) return Promise.resolve(link)
    if (!this.peers.has(nodeId))
      return Promise.reject(new UnknownNode({ nodeId, known: [this.options.nodeId, ...this.peers.keys()] }))
    const timeoutMs = this.options.linkTimeoutMs
    return new Promise((resolve, reject) => {
      const waiters = this.linkWaiters.get(nodeId) ?? new Set()
      this.linkWaiters.set(nodeId, waiters)
      const onLink = (link: OutboundLink) => {
        clearTimeout(timer)
        resolve(link)
      }
      const timeout = () => {
        waiters.delete(onLink)
        const reason = `it has not connected within ${timeoutMs} ms (is its sidecar running, and does it list node "${this.options.nodeId}" at port ${this.port} among its peers?)`
        reject(new PeerUnavailable({ nodeId, reason }))
      }
      // Unref'd: a wait alone never keeps a stopping sidecar alive.
      const timer = setTimeout(timeout, timeoutMs).unref()
      waiters.add(onLink)
    })
  }

  /**
   * A peer dialled in: it says who it is and sends its challenge, which this node answers with its
   * own proof and challenge; once the peer's proof is right, chunks for that node go over this
   * connection, and the peer acknowledges them.
   */
  private accept(socket: net.Socket) {
    this.track(socket)
    socket.setNoDelay(true)
    socket.on("error", () => undefined)
    const { nodeId: self, secret, log } = this.options
    const reader = new FrameReader(maxReplyBytes)
    let hello: { readonly nodeId: string; readonly nonce: Buffer } | undefined
    let link: OutboundLink | undefined
    const drop = (reason: string) => {
      const claim = hello === undefined ? "" : ` (it says it is node ${JSON.stringify(hello.nodeId.slice(0, 64))})`
      log.warn(`dropping a peer connection from ${socket.remoteAddress}${claim}: ${reason}`)
      socket.destroy()
    }
    const deadline = setTimeout(
      () => drop(`it did not prove the internal secret within ${handshakeTimeoutMs} ms`),
      handshakeTimeoutMs
    ).unref()
    socket.on("data", (data: Buffer) => {
      try {
        for (const body of reader.push(data)) {
          const message = decodeBody(PeerReply, body)
          if (link !== undefined) {
            if (message._tag !== "PeerAck" && message._tag !== "PeerNack")
              throw new Error(`a ${message._tag} after the handshake`)
            const pending = link.pending.get(message.seq)
            link.pending.delete(message.seq)
            if (message._tag === "PeerAck") pending?.resolve()
            else pending?.reject(message.error)
            continue
          }
          if (hello === undefined) {
            if (message._tag !== "PeerHello") throw new Error(`a ${message._tag} before the hello`)
            hello = { nodeId: message.nodeId, nonce: freshNonce() }
            const proof = senderProof(secret, message.nonce, self, message.nodeId)
            socket.write(encodeFrame({ _tag: "PeerWelcome", nodeId: self, nonce: hello.nonce, proof }))
            continue
          }
          if (message._tag !== "PeerProof") throw new Error(`a ${message._tag} before its proof`)
          if (!sameProof(message.proof, receiverProof(secret, hello.nonce, hello.nodeId, self)))
            return drop("its proof of the internal secret is wrong")
          clearTimeout(deadline)
          link = { nodeId: hello.nodeId, socket, pending: new Map() }
          this.register(link)
        }
      } catch (error) {
        drop((error as Error).message)
      }
    })
    socket.once("close", () => {
      clearTimeout(deadline)
      if (link !== undefined) this.unregister(link)
    })
  }

  private register(link: OutboundLink) {
    const previous = this.links.get(link.nodeId)
    this.links.set(link.nodeId, link)
    previous?.socket.destroy()
    this.options.log.info(`node "${link.nodeId}" connected: chunks for it can go`)
    const waiters = this.linkWaiters.get(link.nodeId)
    this.linkWaiters.delete(link.nodeId)
    for (const waiter of waiters ?? []) waiter(link)
  }

  private unregister(link: OutboundLink, reason = "the connection closed before it stored the chunk") {
    if (this.links.get(link.nodeId) === link) {
      this.links.delete(link.nodeId)
      this.options.log.info(`node "${link.nodeId}" disconnected`)
    }
    const error = new PeerUnavailable({ nodeId: link.nodeId, reason })
    for (const pending of link.pending.values()) pending.reject(error)
    link.pending.clear()
  }

  private async stop() {
    for (const dialer of this.dialers.values()) dialer.stop()
    for (const socket of this.sockets) socket.destroy()
    await new Promise<void>((resolve) => this.server.close(() => resolve()))
  }
}

/** Keeps a connection open to one peer, redialling while the peer is configured. */
class Dialer {
  private socket: net.Socket | undefined
  private timer: NodeJS.Timeout | undefined
  private stopped = false
  /** Whether the current connection got through the handshake. */
  private linked = false
  /** Whether the last connection failed its handshake; said once until one gets through. */
  private refused = false

  constructor(
    readonly nodeId: string,
    readonly address: PeerAddress,
    private readonly options: PeerTransportOptions,
    private readonly track: (socket: net.Socket) => void
  ) {
    this.connect()
  }

  stop() {
    this.stopped = true
    clearTimeout(this.timer)
    this.socket?.destroy()
  }

  private connect() {
    const { arena, slots, table, log, nodeId, secret } = this.options
    const drop = (error: Error) => {
      log.warn(`dropping the connection to node "${this.nodeId}": ${error.message}`)
      socket.destroy()
    }
    const nonce = freshNonce()
    let connected = false
    let deadline: NodeJS.Timeout | undefined
    /** The sending node proves the secret over this connection's challenge, then gets this node's proof. */
    const welcome = (message: PeerWelcome) => {
      if (message.nodeId !== this.nodeId)
        throw new Error(`it says it is node ${JSON.stringify(message.nodeId.slice(0, 64))}`)
      if (!sameProof(message.proof, senderProof(secret, nonce, this.nodeId, nodeId)))
        throw new Error("its proof of the internal secret is wrong")
      clearTimeout(deadline)
      socket.write(encodeFrame({ _tag: "PeerProof", proof: receiverProof(secret, message.nonce, nodeId, this.nodeId) }))
      this.linked = true
      this.refused = false
    }
    const receiver: ChunkReceiver = new ChunkReceiver({
      arena,
      slots,
      table,
      reply: (seq, error) => {
        socket.write(
          encodeFrame(
            error === undefined ? { _tag: "PeerAck", seq } : { _tag: "PeerNack", seq, error: encodeError(error) }
          )
        )
      },
      resume: () => socket.resume(),
      fail: drop,
      welcome
    })
    const socket = net.connect({
      host: this.address.host,
      port: this.address.port,
      onread: {
        buffer: () => receiver.nextBuffer(),
        callback: (bytes, buffer) => {
          try {
            return receiver.onRead(bytes, buffer)
          } catch (error) {
            drop(error as Error)
            return false
          }
        }
      }
    })
    this.socket = socket
    this.track(socket)
    socket.setNoDelay(true)
    socket.once("connect", () => {
      connected = true
      socket.write(encodeFrame({ _tag: "PeerHello", nodeId, nonce }))
      deadline = setTimeout(
        () => drop(new Error(`it did not prove the internal secret within ${handshakeTimeoutMs} ms`)),
        handshakeTimeoutMs
      ).unref()
    })
    socket.on("error", () => undefined)
    socket.once("close", () => {
      clearTimeout(deadline)
      receiver.close()
      const { linked } = this
      this.linked = false
      if (this.stopped) return
      const at = `node "${this.nodeId}" at ${this.address.host}:${this.address.port}`
      if (linked) log.warn(`lost the connection to ${at}; redialling`)
      // Connected, then closed before a proof: the other side refused this node's (or this node refused its).
      const refusedNow = connected && !linked
      if (refusedNow && !this.refused)
        log.warn(`the connection to ${at} did not get through the handshake; redialling every ${refusedRedialMs} ms`)
      this.refused = refusedNow
      this.timer = setTimeout(() => this.connect(), refusedNow ? refusedRedialMs : redialMs)
    })
  }
}
