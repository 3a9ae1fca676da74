import { describe, expect, it } from "vitest"
import { messagesOf, orderedSender } from "../../../src/executors/common/wire.js"

/** A socket whose sends complete when the test says so, as a ZeroMQ socket's do when its peer is slow. */
const slowSocket = () => {
  const frames: Array<Buffer> = []
  const finishers: Array<() => void> = []
  return {
    frames,
    finishNext: () => finishers.shift()?.(),
    send(frame: Buffer): Promise<void> {
      frames.push(frame)
      return new Promise((resolve) => finishers.push(resolve))
    }
  }
}

const read = async (frames: ReadonlyArray<Buffer>) => {
  async function* socket() {
    for (const frame of frames) yield [frame]
  }
  const messages: Array<unknown> = []
  for await (const message of messagesOf(socket())) messages.push(message)
  return messages
}

describe("orderedSender", () => {
  it("sends the messages of one tick as one frame, and those sent while it goes out as the next", async () => {
    const socket = slowSocket()
    const send = orderedSender<{ readonly token: number }>(socket)
    const first = [send({ token: 1 }), send({ token: 2 }), send({ token: 3 })]
    await new Promise((resolve) => setImmediate(resolve))
    expect(socket.frames).toHaveLength(1)

    const second = [send({ token: 4 }), send({ token: 5 })]
    await new Promise((resolve) => setImmediate(resolve))
    // The first frame has not gone out yet: nothing more is sent, and the new messages wait together.
    expect(socket.frames).toHaveLength(1)
    socket.finishNext()
    await Promise.all(first)
    await new Promise((resolve) => setImmediate(resolve))
    expect(socket.frames).toHaveLength(2)
    socket.finishNext()
    await Promise.all(second)

    expect(await read(socket.frames)).toEqual([1, 2, 3, 4, 5].map((token) => ({ token })))
  })

  it("keeps typed arrays intact inside a frame", async () => {
    const socket = slowSocket()
    const send = orderedSender<{ readonly data: Float32Array }>(socket)
    const sent = send({ data: Float32Array.of(1.5, -2) })
    await new Promise((resolve) => setImmediate(resolve))
    socket.finishNext()
    await sent
    const [message] = (await read(socket.frames)) as Array<{ readonly data: Float32Array }>
    expect(message!.data).toBeInstanceOf(Float32Array)
    expect(Array.from(message!.data)).toEqual([1.5, -2])
  })
})
