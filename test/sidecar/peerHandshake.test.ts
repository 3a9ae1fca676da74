import { randomBytes } from "node:crypto"
import net from "node:net"
import { Packr } from "msgpackr"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { SidecarClient } from "../../src/sidecar/SidecarClient.js"
import type { RunningSidecar } from "../../src/sidecar/SidecarProcess.js"
import { FrameReader, handshakeBytes, unpackBody } from "../../src/sidecar/protocol.js"
import { Tensor } from "../../src/sidecar/Tensor.js"
import { eventually } from "../support/platform.js"
import { leftoverArenas, linkedPair, MiB, testSidecars, type TestSidecars } from "./support/sidecars.js"

/**
 * The peer port of real sidecar processes, as a stranger reaches it: it names itself another node
 * and asks for that node's chunks. Two honest sidecars (node-a sends, node-b receives) share the
 * internal secret; the stranger does not have it.
 */

let sidecars: TestSidecars
let nodeA: RunningSidecar
let nodeB: RunningSidecar
let onA: SidecarClient
let onB: SidecarClient

beforeAll(async () => {
  sidecars = await testSidecars()
  ;({ nodeA, nodeB, onA, onB } = await linkedPair(sidecars, { peerTimeoutSeconds: 2 }, { peerTimeoutSeconds: 2 }))
})

afterAll(async () => {
  await onA?.close()
  await onB?.close()
  await sidecars?.stopAll()
  expect(leftoverArenas()).toEqual([])
})

/** Any record, framed as sidecars frame theirs (a forger need not keep to the schemas). */
const packr = new Packr({ moreTypes: true, useRecords: false })
const rawFrame = (message: object): Buffer => {
  const body = packr.pack(message)
  const frame = Buffer.alloc(4 + body.length)
  frame.writeUInt32LE(body.length, 0)
  body.copy(frame, 4)
  return frame
}

/** A raw TCP connection to a peer port: what it sends, every message it got back, and its end. */
const stranger = async (port: number) => {
  const socket = net.connect({ host: "127.0.0.1", port })
  await new Promise<void>((resolve, reject) => {
    socket.once("connect", resolve)
    socket.once("error", reject)
  })
  const received: Array<{ readonly _tag: string; readonly [field: string]: unknown }> = []
  const reader = new FrameReader()
  // A chunk's raw bytes would follow its frame; none may come, so every body here is a record.
  socket.on("data", (data: Buffer) => {
    for (const body of reader.push(data)) received.push(unpackBody(body) as (typeof received)[number])
  })
  socket.on("error", () => undefined)
  const closed = new Promise<void>((resolve) => socket.once("close", () => resolve()))
  return { socket, received, closed, send: (message: object) => socket.write(rawFrame(message)) }
}

const pattern = (bytes: number, seed: number) => {
  const tensor = Tensor.zeros("uint8", [bytes])
  for (let i = 0; i < bytes; i += 511) tensor.data[i] = (i + seed) & 0xff
  return tensor
}

/** A send from node-a to node-b arrives intact over the honest link. */
const honestLinkCarries = async (id: string) => {
  const sent = pattern(MiB, id.length)
  await onA.send(id, sent, { to: ["node-b"] })
  const received = (await onB.recv(id)) as Tensor
  expect(Buffer.compare(received.bytes, sent.bytes)).toBe(0)
  await onB.markDone(id)
}

describe("a sidecar's peer port", () => {
  it("drops a hello without a challenge (the old tokenless hello), and the honest link carries on", async () => {
    const forger = await stranger(nodeA.peerPort)
    forger.send({ _tag: "PeerHello", nodeId: "node-b" })
    await forger.closed
    expect(forger.received).toEqual([])
    await eventually(async () =>
      nodeA.output().includes("dropping a peer connection from 127.0.0.1") ? true : undefined
    )
    expect((await onA.stats()).peersConnected).toBe(1)
    await honestLinkCarries("after-tokenless-hello")
  })

  it("sends nothing but its welcome to a peer whose proof is wrong, and drops it", async () => {
    const forger = await stranger(nodeA.peerPort)
    forger.send({ _tag: "PeerHello", nodeId: "node-b", nonce: randomBytes(handshakeBytes) })
    await eventually(async () => (forger.received.length > 0 ? true : undefined))
    expect(forger.received[0]).toMatchObject({ _tag: "PeerWelcome", nodeId: "node-a" })
    // node-b's data is on its way while the forger claims to be node-b.
    const secret = pattern(MiB, 42)
    const sending = onA.send("meant-for-node-b", secret, { to: ["node-b"] })
    forger.send({ _tag: "PeerProof", proof: randomBytes(handshakeBytes) })
    await forger.closed
    await sending
    expect(forger.received.map((message) => message._tag)).toEqual(["PeerWelcome"])
    expect(nodeA.output()).toMatch(
      /dropping a peer connection from 127\.0\.0\.1 \(it says it is node "node-b"\): its proof of the internal secret is wrong/
    )
    const received = (await onB.recv("meant-for-node-b")) as Tensor
    expect(Buffer.compare(received.bytes, secret.bytes)).toBe(0)
    await onB.markDone("meant-for-node-b")
    expect((await onA.stats()).peersConnected).toBe(1)
    await honestLinkCarries("after-wrong-proof")
  })

  it("refuses data sent before the handshake", async () => {
    const forger = await stranger(nodeA.peerPort)
    forger.send({ _tag: "PeerAck", seq: 0 })
    await forger.closed
    expect(forger.received).toEqual([])
    expect(nodeA.output()).toMatch(/dropping a peer connection from 127\.0\.0\.1: a PeerAck before the hello/)
  })

  it("a sidecar with another secret links with neither node, either way, and the honest link carries on", async () => {
    const impostor = await sidecars.start("node-c", { secret: "not the cluster's secret", peerTimeoutSeconds: 2 })
    const onImpostor = await SidecarClient.connect(impostor.socketPath)
    try {
      const receivedBefore = (await onB.stats()).chunksReceivedRemote
      // The impostor dials node-a (to receive its chunks); node-b dials the impostor (to receive from it).
      await onImpostor.setPeers({ "node-a": `127.0.0.1:${nodeA.peerPort}`, "node-b": `127.0.0.1:${nodeB.peerPort}` })
      await onB.setPeers({ "node-a": `127.0.0.1:${nodeA.peerPort}`, "node-c": `127.0.0.1:${impostor.peerPort}` })
      await eventually(async () =>
        impostor
          .output()
          .includes(`dropping the connection to node "node-a": its proof of the internal secret is wrong`)
          ? true
          : undefined
      )
      await eventually(async () =>
        nodeB.output().includes(`dropping the connection to node "node-c": its proof of the internal secret is wrong`)
          ? true
          : undefined
      )
      expect((await onImpostor.stats()).peersConnected).toBe(0)
      expect((await onA.stats()).peersConnected).toBe(1)
      // Its chunks for node-b wait for a link that never comes.
      await expect(onImpostor.send("from-impostor", pattern(MiB, 3), { to: ["node-b"] })).rejects.toMatchObject({
        _tag: "PeerUnavailable"
      })
      expect((await onB.stats()).chunksReceivedRemote).toBe(receivedBefore)
      await honestLinkCarries("beside-the-impostor")
    } finally {
      await onImpostor.close()
      await onB.setPeers({ "node-a": `127.0.0.1:${nodeA.peerPort}` })
    }
  })
})
