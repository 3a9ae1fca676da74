import { mkdtemp, open, readFile, rm, stat } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { setTimeout } from "node:timers/promises"
import { setFlagsFromString } from "node:v8"
import { runInNewContext } from "node:vm"
import onnxProto from "onnx-proto"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { SamplingParams } from "../../src/executors/llm/protocol.js"
import { Runner } from "../../src/executors/llm/Runner.js"
import { llamaGraphs } from "../../src/models/architectures/Llama.js"
import { loadModelDirectory } from "../../src/models/ModelDirectory.js"
import { Graph } from "../../src/models/onnx/Graph.js"
import { graphWithWeightsInPlace } from "../../src/models/onnx/WeightsInPlace.js"
import { randomLlamaBuild } from "../../src/models/recipes/RandomLlama.js"
import { writeModelBuild } from "../../src/models/recipes/Recipe.js"
import { drive } from "../support/driveRunner.js"
import { smallLlamaConfig } from "./support/SmallLlama.js"
import { transformersGreedy } from "./support/TransformersJs.js"

/**
 * A decoder whose weights are inline (a q4 export: MatMulNBits codes and scales in model_q4.onnx)
 * is loaded without its weights passing through JavaScript: its graph is read with the weights
 * left in the file, and ONNX Runtime reads them from there.
 */

// 40 layers (the bench's SmolLM2-sized model, today's largest fixture, has 30), ~100 MB of weights.
const config = {
  ...smallLlamaConfig,
  hiddenSize: 512,
  intermediateSize: 2048,
  layers: 40,
  heads: 8,
  kvHeads: 2,
  headDim: 64
}
const nodeCount = (layers: number) =>
  [
    ...llamaGraphs(
      { ...config, layers },
      { layout: "decoder-only", dtype: "q4", positionIds: true, pastPrefix: "past_key_values", seed: 1, std: 0.1 },
      (name) => new Graph(name)
    ).values()
  ][0]!.toFiles().model

let root: string
let file: string
let weightBytes: number

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "cornserve-in-place-"))
  await writeModelBuild(root, randomLlamaBuild({ config, layout: "decoder-only", dtypes: ["q4"], seed: 40 }))
  file = join(root, "onnx", "model_q4.onnx")
  weightBytes = (await stat(file)).size
}, 120_000)

afterAll(async () => {
  await rm(root, { recursive: true, force: true })
})

setFlagsFromString("--expose-gc")
/** A full collection, so that less garbage left before a measure is freed during it. */
const collect = runInNewContext("gc") as () => void

/**
 * The largest rise of this process's array buffers (Buffers, typed arrays) while `work` runs,
 * each sample against the lowest one before it (buffers freed during the work, which V8 sweeps
 * after a collection, do not hide what the work holds).
 */
const arrayBufferGrowth = async <A>(
  work: () => Promise<A>
): Promise<{ readonly result: A; readonly growth: number }> => {
  // Buffers an earlier test left are swept after a collection, not during it: let them go first,
  // so that their going does not hide what the work holds.
  collect()
  await setTimeout(50)
  collect()
  let low = process.memoryUsage().arrayBuffers
  let growth = 0
  const sample = () => {
    const now = process.memoryUsage().arrayBuffers
    low = Math.min(low, now)
    growth = Math.max(growth, now - low)
  }
  const timer = setInterval(sample, 1)
  try {
    const result = await work()
    sample()
    return { result, growth }
  } finally {
    clearInterval(timer)
  }
}

describe("an inline model's weights stay in its file", () => {
  it("reads the graph, and points each large tensor at its bytes in the file", async () => {
    const nodes = (bytes: Uint8Array) => onnxProto.onnx.ModelProto.decode(bytes).graph!.node!.length
    const inPlace = await graphWithWeightsInPlace(file)
    expect(nodes(inPlace.bytes)).toBeGreaterThan(nodes(nodeCount(30)))
    expect(inPlace.bytes.length).toBeLessThan(weightBytes / 50)
    expect(inPlace.weightBytes).toBeGreaterThan(weightBytes * 0.95)

    const whole = onnxProto.onnx.ModelProto.decode(await readFile(file)).graph!
    const original = new Map(whole.initializer!.map((tensor) => [tensor.name!, tensor]))
    const graph = onnxProto.onnx.ModelProto.decode(inPlace.bytes).graph!
    expect(graph.node!.map((node) => node.name)).toEqual(whole.node!.map((node) => node.name))
    const handle = await open(file, "r")
    try {
      let moved = 0
      for (const tensor of graph.initializer!) {
        const source = original.get(tensor.name!)!
        expect(tensor.dims!.map(Number)).toEqual(source.dims!.map(Number))
        expect(tensor.dataType).toBe(source.dataType)
        if ((tensor.externalData ?? []).length === 0) {
          expect(Buffer.from(tensor.rawData!).equals(Buffer.from(source.rawData!))).toBe(true)
          continue
        }
        moved++
        const entry = Object.fromEntries(tensor.externalData!.map(({ key, value }) => [key, value]))
        expect(entry.location).toBe("model_q4.onnx")
        expect(tensor.dataLocation).toBe(onnxProto.onnx.TensorProto.DataLocation.EXTERNAL)
        const bytes = Buffer.alloc(Number(entry.length))
        await handle.read(bytes, 0, bytes.length, Number(entry.offset))
        expect(bytes.equals(Buffer.from(source.rawData!))).toBe(true)
      }
      expect(moved).toBe(inPlace.tensors)
    } finally {
      await handle.close()
    }
  })

  it("opens the decoder without holding its weights in JavaScript memory, and answers as transformers.js", async () => {
    // The measure sees the file read whole and held while ONNX Runtime works (as a rewrite of
    // the whole file held it, before): here, held across a timer.
    const read = await arrayBufferGrowth(async () => {
      const bytes = await readFile(file)
      await setTimeout(20)
      return bytes.length
    })
    expect(read.growth).toBeGreaterThan(weightBytes * 0.9)

    const opened = await arrayBufferGrowth(async () =>
      Runner.open(await loadModelDirectory(root), "cpu:0", 1, "q4", {})
    )
    const runner = opened.result
    try {
      expect(opened.growth).toBeLessThan(weightBytes / 10)
      expect(runner.kvCache.mode).toBe("shared")
      const prompt = [5, 17, 3, 99, 42]
      const greedy: SamplingParams = { temperature: 0, topP: 1, seed: 0, maxNewTokens: 6, stopTokenIds: [] }
      const tokens = await drive(runner, [
        { id: "alone", prompt: { inputIds: Int32Array.from(prompt), media: [] }, sampling: greedy, joinAt: 0 }
      ])
      expect([tokens.get("alone")]).toEqual(await transformersGreedy(root, "q4", [prompt], 6))
    } finally {
      await runner.close()
    }
  })
})
