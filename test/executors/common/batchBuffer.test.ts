import { readdirSync, statSync } from "node:fs"
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { BatchBuffer, batchBufferPrefix } from "../../../src/executors/common/BatchBuffer.js"
import { commitStepBytes } from "../../../src/sidecar/Arena.js"
import { shardItems } from "../../../src/executors/common/Engine.js"
import { decode, encode, type ToWorker, type WorkItem } from "../../../src/executors/common/wire.js"

const item = (rows: number, start: number, extra?: number): WorkItem => ({
  key: "k",
  inputs: {
    pixels: {
      dtype: "float32",
      shape: [rows, 2, 3],
      data: Float32Array.from({ length: rows * 6 }, (_, index) => start + index)
    },
    ...(extra === undefined
      ? {}
      : {
          ids: {
            dtype: "int64",
            shape: [rows],
            data: BigInt64Array.from({ length: rows }, (_, index) => BigInt(extra + index))
          }
        })
  },
  meta: { start }
})

const bufferPath = () => `/dev/shm/${batchBufferPrefix}test-${process.pid}-${Math.random().toString(36).slice(2)}`

describe("BatchBuffer", () => {
  it.scoped("stacks items along their first axis in shared memory, and a second mapping reads them in place", () =>
    Effect.gen(function* () {
      const path = bufferPath()
      const engine = yield* BatchBuffer.create(path, 2, 4096)
      const worker = BatchBuffer.open(path, 2, 4096)
      const slot = yield* Effect.promise(() => engine.acquire())
      const { inputs, rows } = engine.write(slot, [item(1, 0, 100), item(2, 1000, 200)])
      expect(rows).toEqual([
        [0, 1],
        [1, 3]
      ])
      expect(inputs.pixels!.shape).toEqual([3, 2, 3])
      expect(inputs.pixels!.inline).toBeUndefined()
      // What the worker gets goes through the wire codec, like the engine's message.
      const message = decode<ToWorker & { t: "batch" }>(
        encode({ t: "batch", batch: 0, inputs, items: [], shard: [0, 0] })
      )
      const second = worker.read(message.inputs.pixels!, 1, 3)
      expect(second.shape).toEqual([2, 2, 3])
      expect([...(second.data as Float32Array)]).toEqual(Array.from({ length: 12 }, (_, index) => 1000 + index))
      expect([...(worker.read(message.inputs.ids!, 0, 3).data as BigInt64Array)]).toEqual([100n, 200n, 201n])
    })
  )

  it.scoped("holds memory for what its batches wrote, not for its slots' size", () =>
    Effect.gen(function* () {
      const path = bufferPath()
      const engine = yield* BatchBuffer.create(path, 2, 64 * 1024 * 1024)
      const worker = BatchBuffer.open(path, 2, 64 * 1024 * 1024)
      expect(statSync(path).blocks).toBe(0)
      // 3 rows of 6 floats: one step of the slot.
      const { inputs } = engine.write(1, [item(1, 0), item(2, 6)])
      expect(inputs.pixels!.inline).toBeUndefined()
      expect(engine.committedBytes).toBe(commitStepBytes)
      expect(statSync(path).blocks * 512).toBe(commitStepBytes)
      // A batch of 20,000 rows grows the same slot to hold it; the worker, mapped before, reads it.
      const rows = 20_000
      const large = engine.write(1, [item(rows, 0)])
      expect(large.inputs.pixels!.inline).toBeUndefined()
      expect(engine.committedBytes).toBe(Math.ceil((rows * 6 * 4) / commitStepBytes) * commitStepBytes)
      const read = worker.read(large.inputs.pixels!, rows - 1, rows)
      expect([...(read.data as Float32Array)]).toEqual(Array.from({ length: 6 }, (_, index) => (rows - 1) * 6 + index))
    })
  )

  it.scoped("sends a batch larger than a slot inline, intact through the codec", () =>
    Effect.gen(function* () {
      const engine = yield* BatchBuffer.create(bufferPath(), 2, 64)
      const { inputs } = engine.write(0, [item(2, 0), item(2, 12)])
      expect(inputs.pixels!.inline).toBeDefined()
      const message = decode<ToWorker & { t: "batch" }>(
        encode({ t: "batch", batch: 0, inputs, items: [], shard: [0, 0] })
      )
      expect([...(engine.read(message.inputs.pixels!, 2, 4).data as Float32Array)]).toEqual(
        Array.from({ length: 12 }, (_, index) => 12 + index)
      )
    })
  )

  it.scoped("refuses items whose inputs do not stack", () =>
    Effect.gen(function* () {
      const engine = yield* BatchBuffer.create(bufferPath(), 1, 4096)
      const odd: WorkItem = {
        key: "k",
        inputs: { pixels: { dtype: "float32", shape: [1, 3, 3], data: new Float32Array(9) } },
        meta: {}
      }
      expect(() => engine.write(0, [item(1, 0), odd])).toThrow(/share dtype and trailing shape/)
    })
  )

  it.scoped("hands out each slot once until it is released", () =>
    Effect.gen(function* () {
      const engine = yield* BatchBuffer.create(bufferPath(), 2, 64)
      const first = yield* Effect.promise(() => engine.acquire())
      const second = yield* Effect.promise(() => engine.acquire())
      let third: number | undefined
      const waiting = engine.acquire().then((slot) => (third = slot))
      yield* Effect.promise(() => Promise.resolve())
      expect(third).toBeUndefined()
      engine.release(first)
      yield* Effect.promise(() => waiting)
      expect([first, second, third]).toEqual([0, 1, 0])
    })
  )

  it("leaves no buffer file behind", () => {
    expect(
      readdirSync("/dev/shm").filter((name) => name.startsWith(`${batchBufferPrefix}test-${process.pid}`))
    ).toEqual([])
  })
})

describe("shardItems", () => {
  it("gives a lone item to the least busy worker", () => {
    expect([...shardItems(1, [3, 0])]).toEqual([[1, [0, 1]]])
  })
  it("splits a batch into contiguous shards, the larger ones to the least busy workers", () => {
    expect([...shardItems(5, [2, 0])]).toEqual([
      [1, [0, 3]],
      [0, [3, 5]]
    ])
    expect([...shardItems(4, [0, 0])]).toEqual([
      [0, [0, 2]],
      [1, [2, 4]]
    ])
  })
})
