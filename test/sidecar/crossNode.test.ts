import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { SidecarClient } from "../../src/sidecar/SidecarClient.js"
import type { RunningSidecar } from "../../src/sidecar/SidecarProcess.js"
import { Tensor } from "../../src/sidecar/Tensor.js"
import { eventually } from "../support/platform.js"
import { leftoverArenas, linkedPair, MiB, testSidecars, type TestSidecars } from "./support/sidecars.js"

/** Two sidecars on this machine, with their own ports and arena files, standing for two nodes. */

let sidecars: TestSidecars
let nodeB: RunningSidecar
let onA: SidecarClient
let onB: SidecarClient

beforeAll(async () => {
  sidecars = await testSidecars()
  ;({ nodeB, onA, onB } = await linkedPair(
    sidecars,
    { arenaBytes: 128 * MiB, peerTimeoutSeconds: 1 },
    { arenaBytes: 64 * MiB }
  ))
})

afterAll(async () => {
  await onA?.close()
  await onB?.close()
  await sidecars?.stopAll()
  expect(leftoverArenas()).toEqual([])
})

const pattern = (bytes: number, seed: number) => {
  const tensor = Tensor.zeros("uint8", [bytes])
  for (let i = 0; i < bytes; i += 4093) tensor.data[i] = (i + seed) & 0xff
  return tensor
}

const sameBytes = (received: unknown, sent: Tensor) => {
  expect(received).toBeInstanceOf(Tensor)
  expect((received as Tensor).shape).toEqual(sent.shape)
  expect(Buffer.compare((received as Tensor).bytes, sent.bytes)).toBe(0)
}

describe("between two nodes", () => {
  it("a 64 MiB tensor crosses intact, into the receiving node's arena", async () => {
    const sent = Tensor.zeros("float32", [16 * MiB])
    for (let i = 0; i < sent.data.length; i++) sent.data[i] = i * 0.25 - 1e6
    await onA.send("big", sent, { to: ["node-b"] })
    expect((await onA.stats()).bytesInUse).toBe(0)
    const received = (await onB.recv("big")) as Tensor
    expect(received.dtype).toBe("float32")
    expect(received.data.buffer.byteLength).toBe(nodeB.arenaBytes)
    expect(Buffer.compare(received.bytes, sent.bytes)).toBe(0)
    const stats = await onB.stats()
    expect(stats.chunksReceivedRemote).toBe(1)
    expect(stats.bytesInUse).toBe(64 * MiB)
    await onB.markDone("big")
    expect((await onB.stats()).bytesInUse).toBe(0)
    expect((await onA.stats()).bytesForwarded).toBe(64 * MiB)
  })

  it("a stream sent out of order ends where closeStream says, on the other node", async () => {
    const parts = [0, 1, 2].map((chunk) => pattern(100_000 + chunk, chunk))
    for (const chunk of [2, 0, 1])
      await onA.send("remote-stream", parts[chunk]!, { to: ["node-b"], chunk, stream: true })
    await onA.send("remote-stream", "a value", { to: ["node-b"], chunk: 3, stream: true })
    await onA.closeStream("remote-stream")
    for (const [chunk, part] of parts.entries()) sameBytes(await onB.recv("remote-stream", chunk), part)
    expect(await onB.recv("remote-stream", 3)).toBe("a value")
    expect(await onB.recv("remote-stream", 4)).toBeUndefined()
    await onB.markDone("remote-stream")
  })

  it("one send reaches executors on its own node and on another", async () => {
    const sent = pattern(3 * MiB, 7)
    const onBFirst = onB.recv("both")
    await onA.send("both", sent, { to: ["node-a", "node-b"] })
    sameBytes(await onBFirst, sent)
    sameBytes(await onA.recv("both"), sent)
    await onA.markDone("both")
    await onB.markDone("both")
    expect((await onA.stats()).bytesInUse).toBe(0)
    expect((await onB.stats()).bytesInUse).toBe(0)
  })

  it("a chunk for two receivers on another node is freed there once both have marked it done", async () => {
    const sent = pattern(1 * MiB, 9)
    await onA.send("pair", sent, { to: ["node-b", "node-b"], chunk: 0, numChunks: 1 })
    sameBytes(await onB.recv("pair", 0), sent)
    await onB.markDone("pair", 0)
    expect((await onB.stats()).bytesInUse).toBeGreaterThan(0)
    sameBytes(await onB.recv("pair", 0), sent)
    await onB.markDone("pair", 0)
    expect((await onB.stats()).bytesInUse).toBe(0)
    expect((await onA.stats()).bytesInUse).toBe(0)
  })

  it("a full arena on the receiving node holds senders back until its executors mark data done", async () => {
    const parts = [0, 1, 2].map((i) => pattern(32 * MiB, i))
    await onA.send("remote-full-0", parts[0]!, { to: ["node-b"] })
    await onA.send("remote-full-1", parts[1]!, { to: ["node-b"] })
    // node-b has room for two; the third waits there, and what is sent after it queues behind it.
    const third = onA.send("remote-full-2", parts[2]!, { to: ["node-b"] })
    const after = onA.send("after-the-full-arena", 17, { to: ["node-b"] })
    await eventually(async () => ((await onB.stats()).allocationWaits > 0 ? true : undefined))
    sameBytes(await onB.recv("remote-full-0"), parts[0]!)
    await onB.markDone("remote-full-0")
    await third
    await after
    for (const i of [1, 2]) {
      sameBytes(await onB.recv(`remote-full-${i}`), parts[i]!)
      await onB.markDone(`remote-full-${i}`)
    }
    expect(await onB.recv("after-the-full-arena")).toBe(17)
    await onB.markDone("after-the-full-arena")

    await onA.send("remote-holder", pattern(64 * MiB, 3), { to: ["node-b"] })
    await expect(onA.send("too-late", pattern(MiB, 4), { to: ["node-b"], timeoutMs: 200 })).rejects.toMatchObject({
      _tag: "AllocationTimeout",
      nodeId: "node-b"
    })
    await onB.markDone("remote-holder")
    // The connection survives a refused chunk.
    await onA.send("after-refusal", pattern(MiB, 5), { to: ["node-b"] })
    sameBytes(await onB.recv("after-refusal"), pattern(MiB, 5))
    await onB.markDone("after-refusal")
    expect((await onA.stats()).bytesInUse).toBe(0)
    expect((await onB.stats()).bytesInUse).toBe(0)
  })

  it("a send waiting on a node that stops being a peer fails at once instead of waiting on it", async () => {
    const waitsBefore = (await onB.stats()).allocationWaits
    await onA.send("peer-holder", pattern(64 * MiB, 6), { to: ["node-b"] })
    // node-b's arena is full: this chunk waits there, unacknowledged, as it would on a node cut off.
    const stuck = onA.send("peer-stuck", pattern(MiB, 7), { to: ["node-b"] })
    await eventually(async () => ((await onB.stats()).allocationWaits > waitsBefore ? true : undefined))
    await onA.setPeers({})
    await expect(stuck).rejects.toMatchObject({
      _tag: "PeerUnavailable",
      message: expect.stringMatching(/node "node-b" is unavailable: it is no longer one of this node's peers/)
    })
    expect((await onA.stats()).bytesInUse).toBe(0)
    await onB.markDone("peer-holder")
    await onA.setPeers({ "node-b": `127.0.0.1:${nodeB.peerPort}` })
    await eventually(async () => ((await onA.stats()).peersConnected === 1 ? true : undefined))
    await onA.send("peer-again", pattern(MiB, 8), { to: ["node-b"] })
    sameBytes(await onB.recv("peer-again"), pattern(MiB, 8))
    await onB.markDone("peer-again")
    // node-b stored the chunk it was waiting to place once there was room (its bytes had arrived);
    // nobody takes it here, so it is taken now rather than left to the TTL.
    sameBytes(await onB.recv("peer-stuck"), pattern(MiB, 7))
    await onB.markDone("peer-stuck")
    await eventually(async () => ((await onB.stats()).bytesInUse === 0 ? true : undefined))
  })

  it("a send to a node whose sidecar is not there fails with a clear error and frees its slot", async () => {
    await onA.setPeers({ "node-b": `127.0.0.1:${nodeB.peerPort}`, "node-c": "127.0.0.1:9" })
    await expect(onA.send("to-c", pattern(MiB, 1), { to: ["node-c"] })).rejects.toMatchObject({
      _tag: "PeerUnavailable",
      message: expect.stringMatching(/node "node-c" is unavailable: it has not connected within 1000 ms/)
    })
    await nodeB.stop()
    await expect(onA.send("to-stopped-b", pattern(MiB, 2), { to: ["node-b"] })).rejects.toMatchObject({
      _tag: "PeerUnavailable"
    })
    expect((await onA.stats()).bytesInUse).toBe(0)
  })
})
