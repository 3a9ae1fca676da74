import { existsSync, unlinkSync } from "node:fs"
import net from "node:net"
import * as Effect from "effect/Effect"
import type { Arena } from "./Arena.js"
import { InvalidRequest, SidecarUnavailable, toSidecarError, UnknownNode } from "./errors.js"
import { parseAddress, type PeerTransport } from "./PeerTransport.js"
import {
  type ClientReply,
  type ClientRequest,
  decodeClientFrame,
  encodeError,
  encodeFrame,
  FrameReader,
  payloadBytes,
  type ServerFrame,
  type SidecarStats,
  unpackBody
} from "./protocol.js"
import type { SidecarLog } from "./SidecarLog.js"
import type { SlotPool } from "./SlotPool.js"
import type { Reader, StoredChunk, TransferTable } from "./TransferTable.js"
import { startSpan } from "../tracing/Tracing.js"

/**
 * The Unix socket that a node's executors talk to. Each connection is one executor process; the
 * slots it allocated and has not sent, and the chunks only it has read, are its references, and
 * they are released when its connection closes (the process exited or was killed).
 */

class ClientSession implements Reader {
  readonly received = new Set<StoredChunk>()
  /** Slots allocated and not sent yet. */
  readonly owned = new Set<number>()
  /** Slots of this client's chunks kept for it as spares, not used yet. */
  readonly spares = new Set<number>()
  readonly closed = new AbortController()
  pid: number | undefined

  constructor(readonly socket: net.Socket) {}
}

export interface SidecarServerOptions {
  readonly nodeId: string
  readonly socketPath: string
  readonly arena: Arena
  readonly slots: SlotPool
  readonly table: TransferTable
  readonly peers: PeerTransport
  readonly log: SidecarLog
}

export class SidecarServer {
  private readonly sessions = new Set<ClientSession>()
  private slotsReleasedOnDisconnect = 0

  private constructor(
    private readonly options: SidecarServerOptions,
    private readonly server: net.Server
  ) {}

  static listen(options: SidecarServerOptions) {
    return Effect.acquireRelease(
      Effect.tryPromise({
        try: async () => {
          await removeStaleSocket(options.socketPath)
          const server = net.createServer()
          const sidecar = new SidecarServer(options, server)
          server.on("connection", (socket) => sidecar.accept(socket))
          await new Promise<void>((resolve, reject) => {
            server.once("error", reject)
            server.listen(options.socketPath, () => resolve())
          })
          return sidecar
        },
        catch: (error) => new SidecarUnavailable({ socketPath: options.socketPath, reason: (error as Error).message })
      }),
      (sidecar) => Effect.promise(() => sidecar.close())
    )
  }

  get stats(): SidecarStats {
    const { slots, table, peers, nodeId, arena } = this.options
    const { chunksReleasedOnDisconnect, ...tableStats } = table.stats
    return {
      _tag: "SidecarStats",
      nodeId,
      ...slots.stats,
      arenaCommittedBytes: arena.committedBytes,
      ...tableStats,
      ...peers.stats,
      slotsReleasedOnDisconnect: this.slotsReleasedOnDisconnect + chunksReleasedOnDisconnect,
      clients: this.sessions.size
    }
  }

  private accept(socket: net.Socket) {
    const session = new ClientSession(socket)
    this.sessions.add(session)
    const reader = new FrameReader()
    socket.on("data", (data: Buffer) => {
      let bodies: Array<Buffer>
      try {
        bodies = reader.push(data)
      } catch (error) {
        this.options.log.warn(`dropping a client connection: ${(error as Error).message}`)
        return socket.destroy()
      }
      for (const body of bodies) this.dispatch(session, body)
    })
    socket.on("error", () => undefined)
    socket.once("close", () => this.release(session))
  }

  private dispatch(session: ClientSession, body: Buffer) {
    let rid: number | undefined
    const reply = (frame: typeof ServerFrame.Encoded) => {
      if (!session.socket.destroyed) session.socket.write(encodeFrame(frame))
    }
    const fail = (error: unknown) => {
      if (session.closed.signal.aborted) return
      const sidecarError = toSidecarError(error)
      if (sidecarError._tag === "SidecarInternalError") this.options.log.warn(sidecarError.reason)
      if (rid === undefined) {
        this.options.log.warn(`dropping a client connection: ${sidecarError.message}`)
        session.socket.destroy()
      } else {
        reply({ rid, error: encodeError(sidecarError) })
      }
    }
    try {
      const raw = unpackBody(body)
      // Known before the message is checked, so that a malformed request still gets its answer.
      const candidate = (raw as { rid?: unknown } | undefined)?.rid
      if (typeof candidate === "number") rid = candidate
      const { request } = decodeClientFrame(raw)
      this.handle(session, request)
        .then((answer) => reply({ rid: rid!, reply: answer }))
        .catch(fail)
    } catch (error) {
      fail(error)
    }
  }

  private async handle(session: ClientSession, request: ClientRequest): Promise<ClientReply> {
    const { slots, table, peers, arena, nodeId } = this.options
    switch (request._tag) {
      case "Hello":
        session.pid = request.pid
        return {
          _tag: "ArenaInfo",
          nodeId,
          arenaPath: arena.path,
          arenaBytes: arena.byteLength,
          segmentBytes: arena.segmentBytes,
          minSlotBytes: slots.minSlotBytes
        }
      case "Allocate": {
        const offset = await slots.allocate(request.bytes, request.timeoutMs, session.closed.signal)
        session.owned.add(offset)
        return { _tag: "Allocated", offset }
      }
      case "Release":
        this.takeOwned(session, request.offset)
        slots.release(request.offset)
        return { _tag: "Ok" }
      case "Send": {
        const span = startSpan("sidecar send", {
          parent: request.trace,
          kind: "producer",
          attributes: {
            "cornserve.transfer.id": request.id,
            "cornserve.transfer.chunk": request.chunk,
            "cornserve.transfer.bytes": payloadBytes(request.meta),
            "cornserve.transfer.from": nodeId,
            "cornserve.transfer.to": request.to.join(",")
          }
        })
        try {
          await this.send(session, request)
        } catch (error) {
          span.end(error)
          throw error
        }
        span.end()
        return { _tag: "Ok" }
      }
      case "Recv": {
        const result = await table.recv(request.id, request.chunk, request.timeoutMs, session, session.closed.signal)
        return result === "end"
          ? { _tag: "StreamEnd" }
          : { _tag: "Received", meta: result.meta, offset: result.offset ?? null }
      }
      case "MarkDone":
        table.markDone(request.id, request.chunk ?? undefined)
        return { _tag: "Ok" }
      case "CloseStream": {
        const { local, remotes } = this.destinations(request.to)
        if (local) table.close(request.id, request.numChunks)
        await Promise.all(remotes.map((remote) => peers.closeStream(remote, request.id, request.numChunks)))
        return { _tag: "Ok" }
      }
      case "GetStats":
        return this.stats
      case "SetPeers": {
        const addresses = new Map(
          Object.entries(request.peers).map(([peer, address]) => {
            try {
              return [peer, parseAddress(address)] as const
            } catch (error) {
              throw new InvalidRequest({ reason: (error as Error).message })
            }
          })
        )
        peers.setPeers(addresses)
        return { _tag: "Ok" }
      }
    }
  }

  /**
   * Hands a chunk to its destinations: a chunk for this node is stored in place (its slot changes
   * owner, no byte moves); a chunk for another node streams from the same slot to that node's
   * sidecar. The send consumes its slot, whether it succeeds or not.
   */
  private async send(session: ClientSession, request: Extract<ClientRequest, { _tag: "Send" }>) {
    const { slots, table, peers } = this.options
    const offset = request.offset ?? undefined
    if (offset !== undefined) this.takeOwned(session, offset)
    if (offset !== undefined && request.spare) slots.offerAsSpare(offset, () => this.keepAsSpare(session, offset))
    let held = offset !== undefined
    try {
      const bytes = payloadBytes(request.meta)
      if (bytes > 0 !== (offset !== undefined)) {
        throw new InvalidRequest({ reason: `a chunk of ${bytes} bytes ${bytes > 0 ? "needs" : "takes no"} slot` })
      }
      if (offset !== undefined && slots.slotBytes(offset)! < bytes) {
        throw new InvalidRequest({
          reason: `a chunk of ${bytes} bytes does not fit its ${slots.slotBytes(offset)}-byte slot`
        })
      }
      const { local, remotes, readers } = this.destinations(request.to)
      const numChunks = request.numChunks ?? undefined
      if (local) {
        held = false
        table.store(request.id, request.chunk, numChunks, request.meta, offset, "local", readers(this.options.nodeId))
      }
      // Each forward holds the slot itself, so it outlives a local receiver marking the chunk done.
      const header = {
        id: request.id,
        chunk: request.chunk,
        numChunks: request.numChunks,
        meta: request.meta,
        timeoutMs: request.timeoutMs
      }
      const forwards = remotes.map((remote) => {
        const count = readers(remote)
        return peers.sendChunk(remote, count === 1 ? header : { ...header, readers: count }, offset)
      })
      if (held) slots.release(offset!)
      held = false
      await Promise.all(forwards)
    } finally {
      if (held) slots.release(offset!)
    }
  }

  /**
   * Keeps a slot that everyone is done with for the client that sent from it, as its spare, unless
   * it is gone or holds a spare of that size already; tells it so.
   */
  private keepAsSpare(session: ClientSession, offset: number): boolean {
    const { slots } = this.options
    if (session.closed.signal.aborted || session.socket.destroyed) return false
    const slotBytes = slots.slotBytes(offset)!
    for (const spare of session.spares) if (slots.slotBytes(spare) === slotBytes) return false
    session.spares.add(offset)
    session.socket.write(encodeFrame({ spare: { offset, slotBytes } }))
    return true
  }

  private destinations(to: ReadonlyArray<string>) {
    const { nodeId, peers } = this.options
    for (const node of to) {
      if (node !== nodeId && !peers.knows(node))
        throw new UnknownNode({ nodeId: node, known: [nodeId, ...peers.knownNodes] })
    }
    return {
      local: to.includes(nodeId),
      remotes: [...new Set(to.filter((node) => node !== nodeId))],
      /** Receivers on `node`: it is named once for each. */
      readers: (node: string) => to.filter((named) => named === node).length
    }
  }

  /** The client gives up a slot it owns: one it allocated, or a spare, which then holds data. */
  private takeOwned(session: ClientSession, offset: number) {
    if (session.spares.delete(offset)) return this.options.slots.useSpare(offset)
    if (!session.owned.delete(offset))
      throw new InvalidRequest({ reason: `no slot at offset ${offset} was allocated to this client` })
  }

  private release(session: ClientSession) {
    this.sessions.delete(session)
    session.closed.abort(
      new SidecarUnavailable({ socketPath: this.options.socketPath, reason: "the client disconnected" })
    )
    const slots = session.owned.size
    const chunks = session.received.size
    for (const offset of session.owned) this.options.slots.release(offset)
    session.owned.clear()
    // Spares held no data: freeing them is no loss worth a warning.
    for (const offset of session.spares) this.options.slots.release(offset)
    session.spares.clear()
    this.slotsReleasedOnDisconnect += slots
    this.options.table.releaseReader(session)
    if (slots > 0) {
      this.options.log.warn(
        `executor (pid ${session.pid ?? "?"}) disconnected in the middle of ${slots} send(s); their slots are freed`
      )
    } else if (chunks > 0) {
      this.options.log.info(
        `executor (pid ${session.pid ?? "?"}) disconnected without marking ${chunks} received chunk(s) done`
      )
    }
  }

  private async close() {
    for (const session of this.sessions) session.socket.destroy()
    await new Promise<void>((resolve) => this.server.close(() => resolve()))
  }
}

/** A socket file left by a sidecar that was killed is removed; one that answers is in use. */
const removeStaleSocket = async (socketPath: string) => {
  if (!existsSync(socketPath)) return
  const inUse = await new Promise<boolean>((resolve) => {
    const probe = net.connect(socketPath)
    probe.once("connect", () => {
      probe.destroy()
      resolve(true)
    })
    probe.once("error", () => resolve(false))
  })
  if (inUse) throw new Error("another sidecar listens there")
  unlinkSync(socketPath)
}
