import * as ort from "onnxruntime-node"
import { describe, expect, it } from "vitest"
import { CopiedKvLayout } from "../../../src/executors/llm/CopiedKvLayout.js"
import type { KvGeometry, KvLayout, KvRun, RunPast } from "../../../src/executors/llm/KvLayout.js"
import { SharedKvLayout } from "../../../src/executors/llm/SharedKvLayout.js"

const geometry: KvGeometry = { tensors: 2, heads: 2, headDim: 3, half: false }
const { tensors, heads, headDim } = geometry
const requests = ["a", "b", "c"]

/** The key or value a request's position holds in one tensor, head and dimension: distinct everywhere. */
const value = (id: string, position: number, t: number, h: number, d: number) =>
  (((requests.indexOf(id) * 100 + position) * tensors + t) * heads + h) * headDim + d + 1

/** Each row's new positions of a run: `rows[i]` is [id, first position, count]. */
const newPositions = (rows: ReadonlyArray<readonly [string, number, number]>, count: number, t: number) => {
  const data = new Float32Array(rows.length * heads * count * headDim)
  rows.forEach(([id, from, n], row) => {
    for (let h = 0; h < heads; h++)
      for (let p = 0; p < n; p++)
        for (let d = 0; d < headDim; d++)
          data[((row * heads + h) * count + count - n + p) * headDim + d] = value(id, from + p, t, h, d)
  })
  return data
}

/** The rows a run computes new positions for. */
const runRows = (run: KvRun): Array<readonly [string, number, number]> =>
  run.kind === "piece"
    ? [[run.id, run.from, run.to - run.from]]
    : run.kind === "decode"
      ? run.ids.map((id, row) => [id, run.lengths[row]!, 1] as const)
      : run.kind === "prompts"
        ? run.ids.map((id, row) => [id, 0, run.lengths[row]!] as const)
        : []

/** A decoder as exported: its presents are its past with the run's positions after it. */
const exported = (run: KvRun, { past }: RunPast): Array<ort.Tensor> => {
  const rows = runRows(run)
  const count = run.kind === "prompts" ? run.width : run.kind === "piece" ? run.to - run.from : 1
  return past.map((tensor, t) => {
    const [batch, , width] = tensor.dims as [number, number, number, number]
    const fresh = newPositions(rows, count, t)
    const data = new Float32Array(batch * heads * (width + count) * headDim)
    for (let row = 0; row < batch; row++)
      for (let h = 0; h < heads; h++) {
        const at = (row * heads + h) * (width + count) * headDim
        const from = (row * heads + h) * width * headDim
        data.set((tensor.data as Float32Array).subarray(from, from + width * headDim), at)
        const start = (row * heads + h) * count * headDim
        data.set(fresh.subarray(start, start + count * headDim), at + width * headDim)
      }
    return new ort.Tensor("float32", data, [batch, heads, width + count, headDim])
  })
}

/** A decoder on the shared cache: its presents are the run's new positions alone. */
const onShared = (run: KvRun): Array<ort.Tensor> => {
  const rows = runRows(run)
  const count = run.kind === "piece" ? run.to - run.from : 1
  return Array.from(
    { length: tensors },
    (_, t) => new ort.Tensor("float32", newPositions(rows, count, t), [rows.length, heads, count, headDim])
  )
}

/** A decoder: a run's presents, from the run and the past its layout gave. */
type Decoder = (run: KvRun, past: RunPast) => Array<ort.Tensor>

/** A run through a layout and its decoder. */
const run = (layout: KvLayout, decoder: Decoder, step: KvRun): RunPast => {
  const past = layout.past(step)
  layout.write(step, decoder(step, past))
  return past
}

/** The positions a layout holds for a request, as the prefix cache would copy them. */
const held = (layout: KvLayout, id: string, length: number): Array<number> => {
  const { past, row, start } = layout.row(id, length)
  const offset = start ?? past.width - length
  const out: Array<number> = []
  for (let t = 0; t < tensors; t++)
    for (let h = 0; h < heads; h++)
      for (let p = 0; p < length; p++)
        for (let d = 0; d < headDim; d++)
          out.push(past.tensors[t]![((row * heads + h) * past.width + offset + p) * headDim + d]!)
  return out
}

const expected = (id: string, length: number): Array<number> => {
  const out: Array<number> = []
  for (let t = 0; t < tensors; t++)
    for (let h = 0; h < heads; h++)
      for (let p = 0; p < length; p++) for (let d = 0; d < headDim; d++) out.push(value(id, p, t, h, d))
  return out
}

/** The prefix cache's blocks of a request's first `width` positions: one row. */
const cachedBlocks = (id: string, width: number) => ({
  tensors: Array.from({ length: tensors }, (_, t) => newPositions([[id, 0, width]], width, t)),
  width
})

describe.each([
  ["the shared cache", () => new SharedKvLayout(geometry), onShared],
  ["the copies", () => new CopiedKvLayout(geometry), exported]
] as const)("KvLayout: %s", (_, open, decoder) => {
  it("holds each request's positions through pieces, cached blocks, batched and lone decode steps and releases", () => {
    const layout = open()
    layout.join("a", 5, undefined)
    layout.join("b", 4, cachedBlocks("b", 2))
    run(layout, decoder, { kind: "piece", id: "a", from: 0, to: 5 })
    run(layout, decoder, { kind: "piece", id: "b", from: 2, to: 4 })
    expect(held(layout, "a", 5)).toEqual(expected("a", 5))
    expect(held(layout, "b", 4)).toEqual(expected("b", 4))
    const lengths = { a: 5, b: 4, c: 0 }
    const decode = (ids: Array<"a" | "b" | "c">) => {
      const past = run(layout, decoder, { kind: "decode", ids, lengths: ids.map((id) => lengths[id]) })
      for (const id of ids) lengths[id]++
      return past
    }
    const first = decode(["a", "b"])
    // Row i sees its own positions and the new one, and no padding.
    expect(Array.from(first.mask.subarray(0, first.mask.length / 2)).filter((x) => x === 1n)).toHaveLength(6)
    expect(Array.from(first.mask.subarray(first.mask.length / 2)).filter((x) => x === 1n)).toHaveLength(5)
    decode(["a", "b"])
    decode(["b", "a"])
    layout.join("c", 3, undefined)
    run(layout, decoder, { kind: "piece", id: "c", from: 0, to: 3 })
    lengths.c = 3
    decode(["a", "c", "b"])
    for (const id of ["a", "b", "c"] as const) expect(held(layout, id, lengths[id])).toEqual(expected(id, lengths[id]))
    layout.release("a", Math.max(lengths.b, lengths.c) + 1)
    decode(["c"])
    decode(["b", "c"])
    expect(held(layout, "b", lengths.b)).toEqual(expected("b", lengths.b))
    expect(held(layout, "c", lengths.c)).toEqual(expected("c", lengths.c))
    layout.close()
  })
})

describe("KvLayout: the copies", () => {
  it("prefill prompts with nothing cached as one left-padded batch, each row's positions right-aligned", () => {
    const layout = new CopiedKvLayout(geometry)
    expect(layout.batchesPrompts).toBe(true)
    layout.join("a", 2, undefined)
    layout.join("b", 4, undefined)
    const step: KvRun = { kind: "prompts", ids: ["a", "b"], lengths: [2, 4], width: 4 }
    const { mask } = run(layout, exported, step)
    expect(Array.from(mask, Number)).toEqual([0, 0, 1, 1, 1, 1, 1, 1])
    expect(held(layout, "a", 2)).toEqual(expected("a", 2))
    expect(held(layout, "b", 4)).toEqual(expected("b", 4))
    run(layout, exported, { kind: "decode", ids: ["a", "b"], lengths: [2, 4] })
    expect(held(layout, "a", 3)).toEqual(expected("a", 3))
    expect(held(layout, "b", 5)).toEqual(expected("b", 5))
  })

  it("take a batch's presents as they are while the batch is unchanged", () => {
    const layout = new CopiedKvLayout(geometry)
    for (const id of ["a", "b"]) {
      layout.join(id, 2, undefined)
      run(layout, exported, { kind: "piece", id, from: 0, to: 2 })
    }
    const presents = exported(
      { kind: "decode", ids: ["a", "b"], lengths: [2, 2] },
      layout.past({ kind: "decode", ids: ["a", "b"], lengths: [2, 2] })
    )
    layout.write({ kind: "decode", ids: ["a", "b"], lengths: [2, 2] }, presents)
    expect(layout.past({ kind: "decode", ids: ["a", "b"], lengths: [3, 3] }).past).toBe(presents)
    expect(layout.past({ kind: "decode", ids: ["b", "a"], lengths: [3, 3] }).past).not.toBe(presents)
  })
})

describe("KvLayout: the shared cache", () => {
  it("does not batch prompts, and gives each run its rows' lengths", () => {
    const layout = new SharedKvLayout(geometry)
    expect(layout.batchesPrompts).toBe(false)
    layout.join("a", 6, undefined)
    const { lengths } = layout.past({ kind: "piece", id: "a", from: 0, to: 6 })
    expect(lengths).toEqual({ seqlens: Int32Array.of(5), total: 6 })
    expect(layout.bytes).toBeGreaterThan(0)
    layout.release("a", 0)
    expect(layout.bytes).toBe(0)
  })
})
