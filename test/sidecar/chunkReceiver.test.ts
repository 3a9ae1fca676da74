import { describe, expect, it } from "vitest"
import { ChunkReceiver, type PeerWelcome } from "../../src/sidecar/ChunkReceiver.js"
import type { SidecarError } from "../../src/sidecar/errors.js"
import { encodeFrame, handshakeBytes, type PayloadMeta, payloadBytes } from "../../src/sidecar/protocol.js"
import { SizeClassAllocator } from "../../src/sidecar/SizeClassAllocator.js"
import { SlotPool } from "../../src/sidecar/SlotPool.js"
import { TransferTable } from "../../src/sidecar/TransferTable.js"

/**
 * The TCP receiving side without a socket: a peer's byte stream is fed to the receiver in reads
 * of chosen sizes, into the buffers it asks for, as Node's `onread` does (including handing out
 * the next buffer right after a read, before a pause ends).
 */

const KiB = 1024

/** The sending node's welcome, which opens every stream (the proof itself is PeerTransport's to check). */
const welcomeFrame = encodeFrame({
  _tag: "PeerWelcome",
  nodeId: "node-a",
  nonce: Buffer.alloc(handshakeBytes, 1),
  proof: Buffer.alloc(handshakeBytes, 2)
})

const makeNode = (arenaBytes: number, welcome: (message: PeerWelcome) => void = () => undefined) => {
  const memory = Buffer.alloc(arenaBytes)
  const slots = new SlotPool("node-b", new SizeClassAllocator(arenaBytes))
  const table = new TransferTable(slots, 60_000, () => undefined)
  const replies: Array<{ seq: number; error: SidecarError | undefined }> = []
  let resume = () => {}
  const receiver = new ChunkReceiver({
    arena: { view: (offset, length) => memory.subarray(offset, offset + length) },
    slots,
    table,
    reply: (seq, error) => replies.push({ seq, error }),
    resume: () => resume(),
    fail: (error) => {
      throw error
    },
    welcome
  })
  /** Feeds the stream (after the welcome, unless told) in reads of the given sizes (cycled); resolves when all of it was read. */
  const feed = (data: Buffer, readSizes: ReadonlyArray<number>, { welcomed = true } = {}) =>
    new Promise<void>((done) => {
      const stream = welcomed ? Buffer.concat([welcomeFrame, data]) : data
      let position = 0
      let reads = 0
      let target = receiver.nextBuffer()
      const pump = () => {
        while (position < stream.length) {
          const count = Math.min(target.length, readSizes[reads++ % readSizes.length]!, stream.length - position)
          target.set(stream.subarray(position, position + count))
          position += count
          const keepReading = receiver.onRead(count, target)
          target = receiver.nextBuffer()
          if (!keepReading) return
        }
        done()
      }
      resume = pump
      pump()
    })
  /** The stored bytes of a chunk, read the way a local executor would. */
  const stored = async (id: string, chunk: number) => {
    const result = await table.recv(id, chunk, 1000, { received: new Set() }, new AbortController().signal)
    if (result === "end") return "end"
    return result.offset === undefined
      ? result.meta
      : Buffer.from(memory.subarray(result.offset, result.offset + payloadBytes(result.meta)))
  }
  return { receiver, slots, table, replies, feed, stored }
}

const bytesMeta = (length: number): PayloadMeta => ({ _tag: "Bytes", length })

const chunkFrame = (seq: number, id: string, chunk: number, meta: PayloadMeta, payload?: Buffer) =>
  Buffer.concat([
    encodeFrame({ _tag: "PeerChunk", seq, id, chunk, numChunks: null, meta, timeoutMs: 5000 }),
    payload ?? Buffer.alloc(0)
  ])

/** Compared as bytes: a deep equality of large buffers is slow. */
const sameBytes = (stored: unknown, expected: Buffer) => Buffer.isBuffer(stored) && stored.equals(expected)

const payload = (length: number, seed: number) => Buffer.from(Array.from({ length }, (_, i) => (i * 7 + seed) & 0xff))

describe("ChunkReceiver", () => {
  it("stores every chunk of a stream intact however the reads cut it", async () => {
    const payloads = [payload(10, 1), payload(300 * KiB, 2), payload(1, 3), payload(70 * KiB, 4)]
    const stream = Buffer.concat([
      ...payloads.map((bytes, chunk) => chunkFrame(chunk, "s", chunk, bytesMeta(bytes.length), bytes)),
      chunkFrame(4, "s", 4, { _tag: "Value", value: "done" }),
      chunkFrame(5, "s", 5, { _tag: "Tensor", dtype: "float32", shape: [0] }),
      encodeFrame({ _tag: "PeerClose", seq: 6, id: "s", numChunks: 6 })
    ])
    for (const readSizes of [[1], [3, 5, 11], [4096], [100_000, 7], [stream.length]]) {
      const node = makeNode(2 * 1024 * KiB)
      await node.feed(stream, readSizes)
      expect(node.replies).toEqual([0, 1, 2, 3, 4, 5, 6].map((seq) => ({ seq, error: undefined })))
      for (const [chunk, bytes] of payloads.entries())
        expect(sameBytes(await node.stored("s", chunk), bytes)).toBe(true)
      expect(await node.stored("s", 4)).toEqual({ _tag: "Value", value: "done" })
      expect(await node.stored("s", 6)).toBe("end")
    }
  })

  it.each([[[64 * KiB]], [[1024 * KiB, 3]]])(
    "pauses while the arena is full and goes on once a chunk is marked done (reads of %j bytes)",
    async (readSizes) => {
      const node = makeNode(512 * KiB)
      const first = payload(512 * KiB, 1)
      const second = payload(300 * KiB, 2)
      const fed = node.feed(
        Buffer.concat([
          chunkFrame(0, "a", 0, bytesMeta(first.length), first),
          chunkFrame(1, "b", 0, bytesMeta(second.length), second)
        ]),
        readSizes
      )
      // Fed synchronously up to the pause: the second chunk waits for room.
      expect(node.replies.map((reply) => reply.seq)).toEqual([0])
      expect(node.slots.stats.allocationWaits).toBe(1)
      expect(sameBytes(await node.stored("a", 0), first)).toBe(true)
      node.table.markDone("a", undefined)
      await fed
      expect(node.replies.map((reply) => reply.seq)).toEqual([0, 1])
      expect(sameBytes(await node.stored("b", 0), second)).toBe(true)
    }
  )

  it("takes nothing before the sender's welcome", async () => {
    const node = makeNode(64 * KiB)
    const bytes = payload(10, 1)
    await expect(
      node.feed(chunkFrame(0, "early", 0, bytesMeta(10), bytes), [4096], { welcomed: false })
    ).rejects.toThrow("a PeerChunk before the handshake")
    expect(node.replies).toEqual([])
    expect(node.slots.stats.bytesInUse).toBe(0)
  })

  it("stores nothing after a welcome its check refuses", async () => {
    const welcomes: Array<string> = []
    const node = makeNode(64 * KiB, (message) => {
      welcomes.push(message.nodeId)
      throw new Error("its proof of the internal secret is wrong")
    })
    await expect(node.feed(chunkFrame(0, "x", 0, bytesMeta(10), payload(10, 1)), [4096])).rejects.toThrow(
      "its proof of the internal secret is wrong"
    )
    expect(welcomes).toEqual(["node-a"])
    expect(node.replies).toEqual([])
    expect(node.slots.stats.bytesInUse).toBe(0)
  })

  it("refuses a second welcome on one connection", async () => {
    const node = makeNode(64 * KiB)
    await expect(node.feed(welcomeFrame, [4096])).rejects.toThrow("a second welcome on one connection")
  })

  it("skips a chunk it refuses, says why, and reads on", async () => {
    const node = makeNode(64 * KiB)
    const tooLarge = payload(100 * KiB, 1)
    const next = payload(10, 2)
    await node.feed(
      Buffer.concat([
        chunkFrame(0, "x", 0, bytesMeta(tooLarge.length), tooLarge),
        chunkFrame(1, "y", 0, bytesMeta(next.length), next)
      ]),
      [8 * KiB]
    )
    expect(node.replies[0]).toMatchObject({ seq: 0, error: { _tag: "TensorTooLarge", nodeId: "node-b" } })
    expect(node.replies[1]).toEqual({ seq: 1, error: undefined })
    expect(sameBytes(await node.stored("y", 0), next)).toBe(true)
    expect(node.slots.stats.bytesInUse).toBe(4 * KiB)
  })
})
