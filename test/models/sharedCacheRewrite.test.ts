import onnxProto from "onnx-proto"
import * as ort from "onnxruntime-node"
import { describe, expect, it } from "vitest"
import { KvStore } from "../../src/executors/llm/KvStore.js"
import { rewriteSharedCache, sharedCacheInputs } from "../../src/models/onnx/SharedCacheRewrite.js"
import { Random } from "../../src/models/Random.js"
import { randomLlamaFiles } from "../../src/models/recipes/RandomLlama.js"
import { smallLlamaConfig } from "./support/SmallLlama.js"

/**
 * The load-time rewrite of a decoder's attention onto a cache the runner owns: the graph it
 * gives, and its numbers against the export's on rows of different lengths. (That the Runner's
 * greedy tokens on it equal transformers.js's, for every layout and dtype, is in
 * communityDecoders.test.ts.)
 */

const { onnx } = onnxProto

const config = smallLlamaConfig
const geometry = { heads: config.heads, kvHeads: config.kvHeads, headDim: config.headDim }

const exported = (attention: "grouped" | "sdpa" = "grouped") =>
  randomLlamaFiles({ config, layout: "decoder-only", dtypes: ["fp32"], attention }).get("onnx/model.onnx")!

const opTypes = (bytes: Uint8Array) => onnx.ModelProto.decode(bytes).graph!.node!.map((node) => node.opType!)

const session = (bytes: Uint8Array) => ort.InferenceSession.create(bytes, { intraOpNumThreads: 1 })

const pastNames = (layer: number) => [`past_key_values.${layer}.key`, `past_key_values.${layer}.value`]
const presentNames = (layer: number) => [`present.${layer}.key`, `present.${layer}.value`]
const layerIndices = Array.from({ length: config.layers }, (_, layer) => layer)

describe("rewriteSharedCache", () => {
  it.each(["grouped", "sdpa"] as const)(
    "%s attention: one GroupQueryAttention per layer, no Concat of the past, no mask",
    (attention) => {
      const original = exported(attention)
      const rewritten = rewriteSharedCache(original, geometry)
      if (rewritten.bytes === undefined) throw new Error(`not rewritten: ${"reason" in rewritten && rewritten.reason}`)
      expect(rewritten.layers).toBe(config.layers)
      const before = opTypes(original)
      const after = opTypes(rewritten.bytes)
      expect(before.filter((op) => op === "Concat").length).toBeGreaterThanOrEqual(2 * config.layers)
      expect(after.filter((op) => op === "GroupQueryAttention")).toHaveLength(config.layers)
      expect(after).not.toContain("Softmax")
      // The causal mask's nodes (Range, LessOrEqual) go with the attention that read them.
      expect(after).not.toContain("LessOrEqual")
      const graph = onnx.ModelProto.decode(rewritten.bytes).graph!
      expect(graph.input!.map((value) => value.name)).toEqual(
        expect.arrayContaining([sharedCacheInputs.seqlens, sharedCacheInputs.total])
      )
    }
  )

  it("leaves a graph that reads the past elsewhere as it is, saying why", () => {
    const model = onnx.ModelProto.decode(exported())
    const graph = model.graph!
    graph.node!.push({ opType: "Shape", name: "probe", input: ["past_key_values.0.key"], output: ["past_shape"] })
    graph.output!.push({
      name: "past_shape",
      type: { tensorType: { elemType: onnx.TensorProto.DataType.INT64, shape: { dim: [{ dimValue: 4 }] } } }
    })
    const result = rewriteSharedCache(onnx.ModelProto.encode(model).finish(), geometry)
    expect(result.bytes).toBeUndefined()
    expect("reason" in result && result.reason).toMatch(/past_key_values\.0\.key is still read by a Shape/)
  })

  it("leaves a graph whose scores go through an op it does not know as it is", () => {
    const model = onnx.ModelProto.decode(exported())
    const graph = model.graph!
    const softmax = graph.node!.find((node) => node.opType === "Softmax")!
    // A tanh soft cap (as Gemma 2 writes) between the scores and the softmax.
    const input = softmax.input![0]!
    graph.node!.splice(graph.node!.indexOf(softmax), 0, {
      opType: "Tanh",
      name: "capped",
      input: [input],
      output: ["capped_scores"]
    })
    softmax.input = ["capped_scores"]
    const result = rewriteSharedCache(onnx.ModelProto.encode(model).finish(), geometry)
    expect(result.bytes).toBeUndefined()
    expect("reason" in result && result.reason).toMatch(/scores go through Tanh/)
  })

  it("gives the export's logits for rows of different lengths, handing out only each run's new positions", async () => {
    const original = await session(exported("sdpa"))
    const rewritten = rewriteSharedCache(exported("sdpa"), geometry)
    const shared = await session(rewritten.bytes!)
    const random = new Random(5)
    const prompts = [5, 11].map((length) => Array.from({ length }, () => random.below(config.vocabSize)))
    const { kvHeads, headDim } = config
    const int64 = (values: ReadonlyArray<number>, dims: ReadonlyArray<number>) =>
      new ort.Tensor("int64", BigInt64Array.from(values, BigInt), dims)
    const store = new KvStore(2 * config.layers, kvHeads, headDim, false, 8)
    const presents: Array<Record<string, ort.Tensor>> = []
    const expectClose = (actual: Float32Array, expected: Float32Array) => {
      expect(actual.length).toBe(expected.length)
      let largest = 0
      for (let i = 0; i < actual.length; i++) largest = Math.max(largest, Math.abs(actual[i]! - expected[i]!))
      expect(largest).toBeLessThan(1e-4)
    }

    // Each prompt alone, as exported and rewritten.
    for (const [row, prompt] of prompts.entries()) {
      const length = prompt.length
      const common = {
        input_ids: int64(prompt, [1, length]),
        attention_mask: int64(new Array(length).fill(1), [1, length]),
        position_ids: int64(
          prompt.map((_, p) => p),
          [1, length]
        )
      }
      const empty = new ort.Tensor("float32", new Float32Array(0), [1, kvHeads, 0, headDim])
      const feeds: Record<string, ort.Tensor> = { ...common }
      for (const layer of layerIndices) for (const name of pastNames(layer)) feeds[name] = empty
      const expected = await original.run(feeds)
      presents.push(expected)
      store.acquire(`r${row}`)
      store.ensureWidth(length)
      const sharedFeeds: Record<string, ort.Tensor> = {
        ...common,
        [sharedCacheInputs.seqlens]: new ort.Tensor("int32", Int32Array.of(length - 1), [1]),
        [sharedCacheInputs.total]: new ort.Tensor("int32", Int32Array.of(length), [])
      }
      layerIndices.forEach((layer) =>
        pastNames(layer).forEach((name, kind) => {
          sharedFeeds[name] = new ort.Tensor("float32", store.view(2 * layer + kind, row, 1), [
            1,
            kvHeads,
            store.width,
            headDim
          ])
        })
      )
      const actual = await shared.run(sharedFeeds)
      expectClose(actual.logits!.data as Float32Array, expected.logits!.data as Float32Array)
      layerIndices.forEach((layer) =>
        presentNames(layer).forEach((name, kind) => {
          expect(actual[name]!.dims).toEqual([1, kvHeads, length, headDim])
          // The new positions are the export's present (a layer's input is the attention before it,
          // whose sums run in another order: close, not equal).
          expectClose(actual[name]!.data as Float32Array, expected[name]!.data as Float32Array)
          store.write(2 * layer + kind, row, 0, actual[name]!.data as Float32Array, 0, length)
        })
      )
    }

    // One decode step for both: as exported, the rows right-aligned under a mask; rewritten, as they lie.
    const lengths = prompts.map((prompt) => prompt.length)
    const width = Math.max(...lengths)
    const next = [7, 9]
    const mask = lengths.flatMap((length) => [...new Array(width - length).fill(0), ...new Array(length + 1).fill(1)])
    const feeds: Record<string, ort.Tensor> = {
      input_ids: int64(next, [2, 1]),
      attention_mask: int64(mask, [2, width + 1]),
      position_ids: int64(lengths, [2, 1])
    }
    layerIndices.forEach((layer) =>
      pastNames(layer).forEach((name, kind) => {
        const padded = new Float32Array(2 * kvHeads * width * headDim)
        lengths.forEach((length, row) => {
          const data = presents[row]![presentNames(layer)[kind]!]!.data as Float32Array
          for (let h = 0; h < kvHeads; h++)
            padded.set(
              data.subarray(h * length * headDim, (h + 1) * length * headDim),
              ((row * kvHeads + h) * width + width - length) * headDim
            )
        })
        feeds[name] = new ort.Tensor("float32", padded, [2, kvHeads, width, headDim])
      })
    )
    const expected = await original.run(feeds)
    store.ensureWidth(width + 1)
    const sharedFeeds: Record<string, ort.Tensor> = {
      input_ids: feeds.input_ids!,
      attention_mask: feeds.attention_mask!,
      position_ids: feeds.position_ids!,
      [sharedCacheInputs.seqlens]: new ort.Tensor("int32", Int32Array.from(lengths), [2]),
      [sharedCacheInputs.total]: new ort.Tensor("int32", Int32Array.of(width + 1), [])
    }
    layerIndices.forEach((layer) =>
      pastNames(layer).forEach((name, kind) => {
        sharedFeeds[name] = new ort.Tensor("float32", store.view(2 * layer + kind, 0, 2), [
          2,
          kvHeads,
          store.width,
          headDim
        ])
      })
    )
    const actual = await shared.run(sharedFeeds)
    expectClose(actual.logits!.data as Float32Array, expected.logits!.data as Float32Array)
    for (const name of presentNames(0)) expect(actual[name]!.dims).toEqual([2, kvHeads, 1, headDim])
    await Promise.all([original.release(), shared.release()])
  })
})

describe("KvStore", () => {
  const heads = 2
  const headDim = 3
  /** A row's positions of tensor 0, [heads × length × headDim]. */
  const rowData = (store: KvStore, row: number, length: number) => {
    const view = store.view(0, row, 1)
    return Array.from({ length: heads }, (_, h) =>
      Array.from(view.subarray(h * store.width * headDim, (h * store.width + length) * headDim))
    ).flat()
  }
  const positions = (value: number, length: number) =>
    Float32Array.from({ length: heads * length * headDim }, (_, i) => value + i)

  it("keeps each row's positions through growth, a release and a new order", () => {
    const store = new KvStore(1, heads, headDim, false, 4)
    for (const id of ["a", "b", "c", "d", "e"]) store.acquire(id)
    store.ensureWidth(3)
    expect(store.width).toBe(4)
    for (const id of ["a", "b", "c", "d", "e"])
      store.write(0, store.row(id), 0, positions(100 * store.row(id), 3), 0, 3)
    // Wider: every row keeps its positions.
    store.ensureWidth(9)
    expect(store.width).toBe(12)
    ;["a", "b", "c", "d", "e"].forEach((id, row) => {
      expect(store.row(id)).toBe(row)
      expect(rowData(store, row, 3)).toEqual(Array.from(positions(100 * row, 3)))
    })
    // b leaves: the last row (e) moves into its place.
    store.release("b")
    expect(store.rows).toBe(4)
    expect(store.row("e")).toBe(1)
    expect(rowData(store, 1, 3)).toEqual(Array.from(positions(400, 3)))
    // A decode of d, a: they take rows 0 and 1, in that order, with their own positions.
    store.arrange(["d", "a"])
    expect([store.row("d"), store.row("a")]).toEqual([0, 1])
    expect(rowData(store, 0, 3)).toEqual(Array.from(positions(300, 3)))
    expect(rowData(store, 1, 3)).toEqual(Array.from(positions(0, 3)))
    expect(rowData(store, store.row("e"), 3)).toEqual(Array.from(positions(400, 3)))
    expect(rowData(store, store.row("c"), 3)).toEqual(Array.from(positions(200, 3)))
    // The longest leaves: the width the others need is kept, and what they hold.
    store.ensureWidth(40)
    expect(store.width).toBe(40)
    store.release("d")
    store.fit(3)
    expect(store.width).toBe(4)
    expect(rowData(store, store.row("a"), 3)).toEqual(Array.from(positions(0, 3)))
    expect(rowData(store, store.row("e"), 3)).toEqual(Array.from(positions(400, 3)))
    for (const id of ["a", "c", "e"]) store.release(id)
    expect(store.bytes).toBe(0)
  })

  it("holds nothing once empty", () => {
    const store = new KvStore(1, heads, headDim, false, 4)
    for (const id of ["a", "c", "d", "e"]) store.acquire(id)
    store.ensureWidth(5)
    expect(store.bytes).toBeGreaterThan(0)
    // Empty, it holds nothing.
    for (const id of ["a", "c", "d", "e"]) store.release(id)
    expect(store.bytes).toBe(0)
  })
})
