import { existsSync } from "node:fs"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type Payload, SidecarClient } from "../../src/sidecar/SidecarClient.js"
import type { RunningSidecar } from "../../src/sidecar/SidecarProcess.js"
import { type DType, dtypes, Tensor } from "../../src/sidecar/Tensor.js"
import { eventually } from "../support/platform.js"
import { leftoverArenas, MiB, startExecutor, testSidecars, type TestSidecars } from "./support/sidecars.js"

/** Same-node transfers through one real sidecar process, between clients as executors use them. */

let sidecars: TestSidecars
let sidecar: RunningSidecar
let sender: SidecarClient
let receiver: SidecarClient
let transferCount = 0
/** A fresh transfer id per use, so tests never see each other's chunks. */
const nextId = (label: string) => `${label}-${transferCount++}`

beforeAll(async () => {
  sidecars = await testSidecars()
  sidecar = await sidecars.start("node-a", { arenaBytes: 32 * MiB })
  sender = await SidecarClient.connect(sidecar.socketPath, { allocTimeoutMs: 20_000, recvTimeoutMs: 20_000 })
  receiver = await SidecarClient.connect(sidecar.socketPath, { allocTimeoutMs: 20_000, recvTimeoutMs: 20_000 })
})

afterAll(async () => {
  await sender?.close()
  await receiver?.close()
  await sidecars?.stopAll()
  expect(leftoverArenas()).toEqual([])
})

/** Deterministic contents of every dtype: varied bytes, so a misplaced byte shows. */
const sampleTensor = (dtype: DType, shape: ReadonlyArray<number>, seed: number): Tensor => {
  const tensor = Tensor.zeros(dtype, shape)
  const bytes = tensor.bytes
  for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 131 + seed * 17 + (i >> 8)) & 0xff
  if (dtype === "bool") for (let i = 0; i < bytes.length; i++) bytes[i] = bytes[i]! & 1
  return tensor
}

const expectSameTensor = (received: unknown, sent: Tensor) => {
  expect(received).toBeInstanceOf(Tensor)
  const tensor = received as Tensor
  expect(tensor.dtype).toBe(sent.dtype)
  expect(tensor.shape).toEqual(sent.shape)
  expect(Buffer.compare(tensor.bytes, sent.bytes)).toBe(0)
}

const bytesInUse = async () => (await sender.stats()).bytesInUse

describe("same-node transfers", () => {
  it("round-trip every dtype, 0-d and empty tensors, bytes, strings and numbers", async () => {
    for (const [index, dtype] of dtypes.entries()) {
      for (const shape of [[3, 5], [], [0, 4], [2, 0, 3]]) {
        const id = nextId(`dtype-${dtype}`)
        const sent = sampleTensor(dtype, shape, index)
        await sender.send(id, sent, { to: [sidecar.nodeId] })
        const received = await receiver.recv(id)
        expectSameTensor(received, sent)
        if (sent.byteLength > 0) {
          // A view of the arena, not a copy: its memory is the whole mapped segment.
          expect((received as Tensor).data.buffer.byteLength).toBe(sidecar.arenaBytes)
        }
        await receiver.markDone(id)
      }
    }
    const values: ReadonlyArray<Payload> = [
      "a string ✓",
      "",
      42,
      -0.5,
      Number.MAX_SAFE_INTEGER,
      new Uint8Array([0, 1, 254, 255]),
      new Uint8Array(0)
    ]
    for (const value of values) {
      const id = nextId("value")
      await sender.send(id, value, { to: [sidecar.nodeId] })
      expect(await receiver.recv(id)).toEqual(value)
      await receiver.markDone(id)
    }
    expect(await bytesInUse()).toBe(0)
  })

  it("count a transfer as active only until its chunks are read and marked done, and still refuse a duplicate", async () => {
    const before = await sender.stats()
    const id = nextId("finished")
    const grid = new Tensor("int32", [2], Int32Array.of(1, 2))
    await sender.send(id, grid, { to: [sidecar.nodeId], chunk: 0, numChunks: 2 })
    await sender.send(id, sampleTensor("float32", [4], 1), { to: [sidecar.nodeId], chunk: 1, numChunks: 2 })
    expect((await sender.stats()).transfersActive).toBe(before.transfersActive + 1)
    await receiver.recv(id, 0)
    await receiver.markDone(id, 0)
    // Half read: still in progress.
    expect((await sender.stats()).transfersActive).toBe(before.transfersActive + 1)
    await receiver.recv(id, 1)
    await receiver.markDone(id, 1)
    const after = await sender.stats()
    expect(after.transfersActive).toBe(before.transfersActive)
    expect(after.transfersRemembered).toBe(before.transfersRemembered + 1)
    // Its time and bytes (8 bytes of int32 and 16 of float32) count once it is finished, in one bucket.
    expect(after.transferSeconds.count).toBe(before.transferSeconds.count + 1)
    expect(after.bytesTransferred - before.bytesTransferred).toBe(24)
    expect(after.transferSeconds.buckets.reduce((sum, n) => sum + n, 0)).toBe(after.transferSeconds.count)
    expect(after.transferSeconds.sum).toBeGreaterThan(before.transferSeconds.sum)
    await expect(sender.send(id, grid, { to: [sidecar.nodeId], chunk: 0, numChunks: 2 })).rejects.toThrow(
      /already sent/
    )
  })

  it("carry 1000 concurrent transfers of mixed sizes intact, through an arena smaller than their total", async () => {
    const count = 1000
    const shapes: Array<{ id: string; tensor: Tensor }> = []
    let total = 0
    for (let i = 0; i < count; i++) {
      const dtype = dtypes[i % dtypes.length]!
      // Mostly small, some up to 1 MiB elements' worth: about 100 MiB in all through 32 MiB.
      const elements = i % 10 === 0 ? 64 * 1024 + ((i * 7919) % (192 * 1024)) : (i * 104729) % 16384
      const tensor = sampleTensor(dtype, [elements], i)
      total += tensor.byteLength
      shapes.push({ id: nextId("many"), tensor })
    }
    expect(total).toBeGreaterThan(32 * MiB)
    const waitsBefore = (await sender.stats()).allocationWaits
    const received = shapes.map(async ({ id, tensor }) => {
      const got = await receiver.recv(id)
      expectSameTensor(got, tensor)
      await receiver.markDone(id)
    })
    await Promise.all([
      ...shapes.map(({ id, tensor }) => sender.send(id, tensor, { to: [sidecar.nodeId] })),
      ...received
    ])
    const stats = await sender.stats()
    expect(stats.allocationWaits).toBeGreaterThan(waitsBefore)
    expect(stats.bytesInUse).toBe(0)
    expect(stats.slotsInUse).toBe(0)
  })

  it("deliver chunks sent out of order, and the end of the transfer after the last one", async () => {
    const id = nextId("chunks")
    const chunks = [0, 1, 2, 3].map((chunk) => sampleTensor("float32", [100, chunk + 1], chunk))
    for (const chunk of [3, 1, 0, 2])
      await sender.send(id, chunks[chunk]!, { to: [sidecar.nodeId], chunk, numChunks: 4 })
    for (const [chunk, tensor] of chunks.entries()) expectSameTensor(await receiver.recv(id, chunk), tensor)
    expect(await receiver.recv(id, 4)).toBeUndefined()
    await receiver.markDone(id)
    expect(await bytesInUse()).toBe(0)
  })

  it("let a receiver wait for a transfer before anyone sends it, and time out with a clear error", async () => {
    const id = nextId("early")
    const waiting = receiver.recv(id, 1)
    const tensor = sampleTensor("int32", [7, 7], 3)
    await sender.send(id, "first", { to: [sidecar.nodeId], chunk: 0, numChunks: 2 })
    await sender.send(id, tensor, { to: [sidecar.nodeId], chunk: 1, numChunks: 2 })
    expectSameTensor(await waiting, tensor)
    await receiver.markDone(id)

    const active = (await sender.stats()).transfersActive
    await expect(receiver.recv(nextId("never-sent"), 0, { timeoutMs: 200 })).rejects.toMatchObject({
      _tag: "RecvTimeout",
      message: expect.stringMatching(/chunk 0 of transfer "never-sent-\d+" did not arrive within 200 ms/)
    })
    // The wait leaves no record of the transfer that never came.
    expect((await sender.stats()).transfersActive).toBe(active)
  })

  it("give the same view on every receive until the chunk is marked done, which frees its slot", async () => {
    const id = nextId("repeat")
    const sent = sampleTensor("float64", [1024, 3], 9)
    await sender.send(id, sent, { to: [sidecar.nodeId], numChunks: 2, chunk: 0 })
    await sender.send(id, "tail", { to: [sidecar.nodeId], numChunks: 2, chunk: 1 })
    const first = (await receiver.recv(id)) as Tensor
    const second = (await receiver.recv(id)) as Tensor
    const fromAnotherClient = (await sender.recv(id)) as Tensor
    for (const view of [first, second, fromAnotherClient]) expectSameTensor(view, sent)
    expect(second.data.byteOffset).toBe(first.data.byteOffset)
    expect(await bytesInUse()).toBe(32 * 1024)

    await receiver.markDone(id, 0)
    expect(await bytesInUse()).toBe(0)
    await expect(receiver.recv(id, 0)).rejects.toMatchObject({
      _tag: "InvalidRequest",
      message: expect.stringMatching(/already marked done/)
    })
    expect(await receiver.recv(id, 1)).toBe("tail")
    await receiver.markDone(id)
    await expect(receiver.recv(id, 1, { timeoutMs: 100 })).rejects.toMatchObject({ _tag: "RecvTimeout" })
  })

  it("keep a chunk sent to a node once for each of its receivers there until each has marked it done", async () => {
    const id = nextId("two-readers")
    const sent = sampleTensor("float32", [256, 4], 3)
    // Two consumers of one datum on this node: the node is named twice.
    await sender.send(id, sent, { to: [sidecar.nodeId, sidecar.nodeId], chunk: 0, numChunks: 1 })
    expectSameTensor(await receiver.recv(id, 0), sent)
    await receiver.markDone(id, 0)
    // The first consumer is done; the second still reads it.
    expect(await bytesInUse()).toBe(4096)
    expectSameTensor(await sender.recv(id, 0), sent)
    await sender.markDone(id, 0)
    expect(await bytesInUse()).toBe(0)
    await expect(receiver.recv(id, 0)).rejects.toMatchObject({ message: expect.stringMatching(/already marked done/) })
    // A send may name at most 64 receivers.
    await expect(
      sender.send(nextId("crowd"), "x", { to: new Array<string>(65).fill(sidecar.nodeId) as [string, ...string[]] })
    ).rejects.toMatchObject({ _tag: "InvalidRequest" })
  })

  it("end a stream of unknown length with closeStream, also for a receiver already waiting past its end", async () => {
    const id = nextId("stream")
    const pastTheEnd = receiver.recv(id, 3)
    const parts = [0, 1, 2].map((chunk) => sampleTensor("uint8", [1000 + chunk], chunk))
    for (const [chunk, part] of parts.entries())
      await sender.send(id, part, { to: [sidecar.nodeId], chunk, stream: true })
    await sender.closeStream(id)
    expect(await pastTheEnd).toBeUndefined()
    const received: Array<unknown> = []
    for (let chunk = 0; ; chunk++) {
      const part = await receiver.recv(id, chunk)
      if (part === undefined) break
      received.push(part)
      await receiver.markDone(id, chunk)
    }
    expect(received).toHaveLength(3)
    for (const [chunk, part] of parts.entries())
      expect(Buffer.compare((received[chunk] as Tensor).bytes, part.bytes)).toBe(0)
    expect(await bytesInUse()).toBe(0)
  })

  it("make senders wait while the arena is full, then recover once receivers mark data done", async () => {
    const ids = [nextId("full"), nextId("full"), nextId("full")]
    const tensors = ids.map((_, i) => sampleTensor("float32", [4 * MiB], i))
    await sender.send(ids[0]!, tensors[0]!, { to: [sidecar.nodeId] })
    await sender.send(ids[1]!, tensors[1]!, { to: [sidecar.nodeId] })
    expect((await sender.stats()).largestFreeBytes).toBe(0)

    const waitsBefore = (await sender.stats()).allocationWaits
    let thirdDone = false
    const third = sender.send(ids[2]!, tensors[2]!, { to: [sidecar.nodeId] }).then(() => (thirdDone = true))
    await eventually(async () => ((await sender.stats()).allocationWaits > waitsBefore ? true : undefined))
    expect(thirdDone).toBe(false)

    expectSameTensor(await receiver.recv(ids[0]!), tensors[0]!)
    await receiver.markDone(ids[0]!)
    await third
    for (const i of [1, 2]) {
      expectSameTensor(await receiver.recv(ids[i]!), tensors[i]!)
      await receiver.markDone(ids[i]!)
    }
    expect(await bytesInUse()).toBe(0)
  })

  it("fail a send that waits too long for room, or that can never fit, with a clear error", async () => {
    const holder = nextId("holder")
    await sender.send(holder, sampleTensor("uint8", [32 * MiB], 1), { to: [sidecar.nodeId] })
    await expect(
      sender.send(nextId("late"), new Uint8Array(1024), { to: [sidecar.nodeId], timeoutMs: 200 })
    ).rejects.toMatchObject({
      _tag: "AllocationTimeout",
      message: expect.stringMatching(/no room for 1.00 KiB in the arena of node node-a within 200 ms .*markDone/)
    })
    await receiver.markDone(holder)
    await expect(
      sender.send(nextId("huge"), new Uint8Array(32 * MiB + 1), { to: [sidecar.nodeId] })
    ).rejects.toMatchObject({
      _tag: "TensorTooLarge"
    })
    await expect(sender.send(nextId("nowhere"), "x", { to: ["node-z"] })).rejects.toMatchObject({
      _tag: "UnknownNode",
      message: expect.stringMatching(/no sidecar is known for node "node-z"/)
    })
    expect(await bytesInUse()).toBe(0)
  })

  it("move no bytes for a tensor the producer wrote into the arena itself", async () => {
    const id = nextId("in-place")
    const tensor = await sender.allocate("int16", [512, 512])
    tensor.data.forEach((_, i) => (tensor.data[i] = (i % 30_000) - 15_000))
    expect(await bytesInUse()).toBe(512 * 1024)
    await sender.send(id, tensor, { to: [sidecar.nodeId] })
    const received = (await receiver.recv(id)) as Tensor
    expect(received.data.byteOffset).toBe(tensor.data.byteOffset)
    expect(received.data[12_345]).toBe(12_345 - 15_000)
    expect(await bytesInUse()).toBe(512 * 1024)
    await receiver.markDone(id)

    const unused = await sender.allocate("uint8", [100])
    await sender.discard(unused)
    expect(await bytesInUse()).toBe(0)
  })
})

describe("spare slots", () => {
  it("give a sender its slot back for its next chunk of that size once the receiver is done, until it goes unused", async () => {
    const node = await sidecars.start("node-spare", { arenaBytes: 4 * MiB })
    const producer = await SidecarClient.connect(node.socketPath, { spareIdleMs: 500 })
    const consumer = await SidecarClient.connect(node.socketPath)
    const first = sampleTensor("float32", [64 * 1024], 1)
    await producer.send("spare-1", first, { to: [node.nodeId] })
    const firstView = (await consumer.recv("spare-1")) as Tensor
    expectSameTensor(firstView, first)
    await consumer.markDone("spare-1")
    // Kept for the producer, and not counted as holding data.
    expect(await producer.stats()).toMatchObject({ slotsReserved: 1, bytesReserved: 256 * 1024, bytesInUse: 0 })

    const second = sampleTensor("float32", [50_000], 2)
    await producer.send("spare-2", second, { to: [node.nodeId] })
    const secondView = (await consumer.recv("spare-2")) as Tensor
    expectSameTensor(secondView, second)
    expect(secondView.data.byteOffset).toBe(firstView.data.byteOffset)
    expect(await producer.stats()).toMatchObject({ slotsReserved: 0, slotsInUse: 1 })
    await consumer.markDone("spare-2")
    expect((await producer.stats()).slotsReserved).toBe(1)

    // Unused for spareIdleMs, it goes back to the arena.
    await eventually(async () => ((await producer.stats()).slotsReserved === 0 ? true : undefined))
    expect((await producer.stats()).bytesInUse).toBe(0)
    await producer.close()
    await consumer.close()
  })

  it("are not kept from a crowded arena, nor for a sender that has gone", async () => {
    const node = await sidecars.start("node-crowded", { arenaBytes: 4 * MiB })
    const producer = await SidecarClient.connect(node.socketPath)
    const consumer = await SidecarClient.connect(node.socketPath)
    // Three quarters of the arena in use when the first chunk is done with: no room to spare.
    await producer.send("crowded-1", new Uint8Array(2 * MiB), { to: [node.nodeId] })
    await producer.send("crowded-2", new Uint8Array(MiB), { to: [node.nodeId] })
    await consumer.markDone("crowded-1")
    expect(await producer.stats()).toMatchObject({ slotsReserved: 0, bytesInUse: MiB })
    await producer.close()
    await consumer.markDone("crowded-2")
    await eventually(async () => {
      const { slotsReserved, slotsInUse } = await consumer.stats()
      return slotsReserved === 0 && slotsInUse === 0 ? true : undefined
    })
    await consumer.close()
  })
})

describe("executors that die", () => {
  it("free the slot of a send cut short when the sending executor is killed", async () => {
    const id = nextId("killed-sender")
    const executor = await startExecutor(["send", sidecar.socketPath, id])
    await executor.line("holding")
    expect(await bytesInUse()).toBe(4 * MiB + 8 * MiB)
    executor.process.kill("SIGKILL")
    await executor.exited
    // The chunk it finished sending stays for its receiver; the slot it was filling is freed.
    await eventually(async () => ((await bytesInUse()) === 4 * MiB ? true : undefined))
    expect((await sender.stats()).slotsReleasedOnDisconnect).toBeGreaterThanOrEqual(1)
    const first = (await receiver.recv(id, 0)) as Uint8Array
    expect(first.length).toBe(4 * MiB)
    expect(first[1000]).toBe(1000 % 251)
    await expect(receiver.recv(id, 1, { timeoutMs: 100 })).rejects.toMatchObject({ _tag: "RecvTimeout" })
    await receiver.markDone(id)
    expect(await bytesInUse()).toBe(0)
  })

  it("free what a killed receiving executor had read and not marked done", async () => {
    const id = nextId("killed-receiver")
    const tensor = sampleTensor("uint16", [MiB], 5)
    await sender.send(id, tensor, { to: [sidecar.nodeId] })
    const executor = await startExecutor(["recv", sidecar.socketPath, id])
    const line = await executor.line("received")
    expect(line).toBe(`received ${2 * MiB} ${tensor.bytes.reduce((sum, byte) => sum + byte, 0)}`)
    expect(await bytesInUse()).toBe(2 * MiB)
    executor.process.kill("SIGKILL")
    await executor.exited
    await eventually(async () => ((await bytesInUse()) === 0 ? true : undefined))
  })
})

describe("the sidecar process", () => {
  it("reclaims data nobody marks done after its TTL, with a warning", async () => {
    const shortLived = await sidecars.start("node-ttl", { arenaBytes: 4 * MiB, ttlSeconds: 0.3 })
    const client = await SidecarClient.connect(shortLived.socketPath)
    await client.send("forgotten", new Uint8Array(MiB).fill(7), { to: [shortLived.nodeId] })
    expect((await client.stats()).bytesInUse).toBe(MiB)
    await eventually(async () => ((await client.stats()).chunksReclaimed === 1 ? true : undefined))
    expect((await client.stats()).bytesInUse).toBe(0)
    expect(shortLived.output()).toMatch(
      /reclaimed chunk 0 of transfer "forgotten" \(1048576 bytes\): not marked done within the 0.3 s TTL/
    )
    await client.close()
  })

  it("removes its arena file and socket when it stops", async () => {
    const stopping = await sidecars.start("node-stop", { arenaBytes: 4 * MiB })
    expect(existsSync(stopping.arenaPath)).toBe(true)
    const client = await SidecarClient.connect(stopping.socketPath)
    const waiting = client.recv("never", 0).catch((error: unknown) => error)
    expect(await stopping.stop()).toBe(0)
    expect(existsSync(stopping.arenaPath)).toBe(false)
    expect(existsSync(stopping.socketPath)).toBe(false)
    expect(await waiting).toMatchObject({ _tag: "SidecarUnavailable" })
  })
})
