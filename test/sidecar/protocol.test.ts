import { describe, expect, it } from "vitest"
import { AllocationTimeout, RecvTimeout } from "../../src/sidecar/errors.js"
import {
  ClientFrame,
  decodeBody,
  decodeClientFrame,
  decodeMessage,
  decodeServerFrame,
  encodeError,
  encodeFrame,
  FrameReader,
  frameLengthBytes,
  payloadBytes,
  ServerFrame
} from "../../src/sidecar/protocol.js"
import { Tensor } from "../../src/sidecar/Tensor.js"

const body = (frame: Buffer) => frame.subarray(frameLengthBytes)

describe("wire protocol", () => {
  it("round-trips requests and replies, errors included as their own classes", () => {
    const send = {
      rid: 7,
      request: {
        _tag: "Send" as const,
        id: "t-1",
        chunk: 2,
        numChunks: null,
        to: ["node-b", "node-a"] as [string, ...Array<string>],
        meta: { _tag: "Tensor" as const, dtype: "bfloat16" as const, shape: [2, 0, 3] },
        timeoutMs: 1000,
        offset: 65536,
        spare: true
      }
    }
    expect(decodeBody(ClientFrame, body(encodeFrame(send)))).toEqual(send)

    const error = new AllocationTimeout({
      nodeId: "node-b",
      bytes: 1024,
      waitedMs: 5,
      usedBytes: 10,
      capacityBytes: 20
    })
    const decoded = decodeBody(ServerFrame, body(encodeFrame({ rid: 3, error: encodeError(error) })))
    expect("error" in decoded && decoded.error).toBeInstanceOf(AllocationTimeout)
    expect("error" in decoded && decoded.error.message).toBe(error.message)
  })

  it("refuses malformed messages with InvalidRequest", () => {
    const bad = { rid: 1, request: { _tag: "Recv", id: "", chunk: -1, timeoutMs: 5 } }
    expect(() => decodeBody(ClientFrame, body(encodeFrame(bad as never)))).toThrow(
      expect.objectContaining({ _tag: "InvalidRequest" })
    )
    expect(() => decodeBody(ClientFrame, Buffer.from([0xc1]))).toThrow(
      expect.objectContaining({ _tag: "InvalidRequest" })
    )
  })

  it("splits a byte stream into frames however it is cut", () => {
    const frames = [0, 1, 2, 3].map((rid) =>
      encodeFrame({ rid, error: encodeError(new RecvTimeout({ id: `x${rid}`, chunk: rid, waitedMs: 1 })) })
    )
    const stream = Buffer.concat(frames)
    for (const cut of [1, 2, 3, 5, 17, stream.length]) {
      const reader = new FrameReader()
      const bodies: Array<Buffer> = []
      for (let start = 0; start < stream.length; start += cut)
        bodies.push(...reader.push(stream.subarray(start, start + cut)))
      expect(bodies.map((frameBody) => decodeBody(ServerFrame, frameBody))).toMatchObject(
        [0, 1, 2, 3].map((rid) => ({ rid }))
      )
    }
  })

  it("decodes the messages of a hand-off by hand exactly as their schemas do, and refuses what they refuse", () => {
    const send = {
      _tag: "Send",
      id: "t",
      chunk: 0,
      numChunks: 1,
      to: ["node-a"],
      meta: { _tag: "Tensor", dtype: "float32", shape: [2, 3] },
      timeoutMs: 100,
      offset: 4096,
      spare: true
    }
    const sends: ReadonlyArray<Record<string, unknown>> = [
      send,
      { ...send, numChunks: null, offset: null, spare: false, to: ["node-a", "node-b"] },
      { ...send, meta: { _tag: "Tensor", dtype: "bool", shape: [] } },
      { ...send, meta: { _tag: "Bytes", length: 10 } },
      { ...send, meta: { _tag: "Value", value: "inline" } },
      { ...send, meta: { _tag: "Value", value: -0.5 } },
      { ...send, extra: 1, meta: { _tag: "Bytes", length: 3, extra: 2 } },
      { ...send, trace: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" },
      { ...send, trace: 7 },
      { ...send, trace: "x".repeat(257) },
      { ...send, id: "" },
      { ...send, chunk: -1 },
      { ...send, chunk: 1.5 },
      { ...send, chunk: "1" },
      { ...send, numChunks: 0 },
      { ...send, to: [] },
      { ...send, to: [""] },
      { ...send, to: "node-a" },
      { ...send, timeoutMs: Number.POSITIVE_INFINITY },
      { ...send, offset: -4096 },
      { ...send, spare: "yes" },
      { ...send, meta: { _tag: "Tensor", dtype: "float8", shape: [1] } },
      { ...send, meta: { _tag: "Tensor", dtype: "float32", shape: [-1] } },
      { ...send, meta: { _tag: "Tensor", dtype: "float32" } },
      { ...send, meta: { _tag: "Value", value: true } },
      { ...send, meta: null },
      { _tag: "Recv", id: "t", chunk: 0, timeoutMs: 5 }
    ]
    const received = { _tag: "Received", meta: { _tag: "Tensor", dtype: "int64", shape: [4] }, offset: 8192 }
    const replies: ReadonlyArray<unknown> = [
      received,
      { ...received, meta: { _tag: "Bytes", length: 0 }, offset: null },
      { ...received, offset: -1 },
      { ...received, meta: { _tag: "Tensor", dtype: "int64", shape: [0.5] } },
      { _tag: "Ok" },
      { _tag: "Ok", extra: true },
      { _tag: "Allocated", offset: 4096 }
    ]
    const outcome = (decode: () => unknown) => {
      try {
        return { value: decode() }
      } catch (error) {
        return { error: (error as { _tag?: string })._tag }
      }
    }
    const frames = [
      ...sends.map((request) => ({ rid: 3, request })),
      { rid: -1, request: send },
      { rid: 3, request: [] }
    ]
    for (const frame of frames) {
      const bySchema = outcome(() => decodeMessage(ClientFrame, frame))
      expect(outcome(() => decodeClientFrame(frame))).toEqual(bySchema)
    }
    const serverFrames = [
      ...replies.map((reply) => ({ rid: 4, reply })),
      { rid: 4, reply: { _tag: "Ok" }, error: 1 },
      { spare: { offset: 4096, slotBytes: 4096 } },
      { spare: { offset: 4096, slotBytes: 0 } }
    ]
    for (const frame of serverFrames) {
      const bySchema = outcome(() => decodeMessage(ServerFrame, frame))
      expect(outcome(() => decodeServerFrame(frame))).toEqual(bySchema)
    }
    // Both kinds of answer occur above: the comparison is not between two refusals only.
    expect(frames.filter((frame) => "value" in outcome(() => decodeMessage(ClientFrame, frame))).length).toBe(9)
  })

  it("counts the arena bytes of each kind of payload", () => {
    expect(payloadBytes({ _tag: "Tensor", dtype: "int64", shape: [3, 4] })).toBe(96)
    expect(payloadBytes({ _tag: "Tensor", dtype: "bool", shape: [] })).toBe(1)
    expect(payloadBytes({ _tag: "Tensor", dtype: "float16", shape: [5, 0] })).toBe(0)
    expect(payloadBytes({ _tag: "Bytes", length: 10 })).toBe(10)
    expect(payloadBytes({ _tag: "Value", value: "inline" })).toBe(0)
  })
})

describe("Tensor", () => {
  it("checks that shape, dtype and data agree", () => {
    expect(new Tensor("int8", [2, 2], new Int8Array(4)).byteLength).toBe(4)
    expect(() => new Tensor("float32", [2, 2], new Float32Array(3))).toThrow(/4 elements, the data 3/)
    expect(() => new Tensor("float32", [2], new Float64Array(2) as never)).toThrow(/Float32Array, got Float64Array/)
    expect(() => new Tensor("uint8", [-1], new Uint8Array(0))).toThrow(/whole numbers/)
    expect(Tensor.zeros("int64", []).data).toEqual(new BigInt64Array(1))
  })
})
