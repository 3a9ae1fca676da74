import type * as ort from "onnxruntime-node"
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import onnxProto from "onnx-proto"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { loadModelDirectory, onnxPath } from "../../../src/models/ModelDirectory.js"
import { Graph } from "../../../src/models/onnx/Graph.js"
import { Random } from "../../../src/models/Random.js"
import {
  decoder125m,
  type DecoderPreset,
  decoderRecipe,
  randomDecoderWeights
} from "../../../src/models/recipes/BenchDecoder125m.js"
import {
  randomVisionTransformerWeights,
  type VisionTransformerPreset,
  visionTransformerRecipe,
  vitB16
} from "../../../src/models/recipes/BenchVitB16.js"
import type { ModelRecipe } from "../../../src/models/recipes/Recipe.js"
import { visionTransformerForward } from "../../../src/models/reference/Transformer.js"
import { expectDecoderMatchesReference } from "../support/DecoderCheck.js"
import { expectClose, floatTensor, int64Tensor, numbers, relativeError, session } from "../support/Ort.js"

/**
 * The benchmark presets are built by the same recipes at a small size here: the real sizes
 * (hundreds of MB) are only built when named (`cornserve models build bench/vit-b16`).
 */

let root: string

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "cornserve-architectures-"))
})

afterAll(async () => {
  await rm(root, { recursive: true, force: true })
})

const writeRecipe = async (recipe: ModelRecipe) => {
  const dir = join(root, recipe.name)
  for (const [file, bytes] of recipe.build()) {
    await mkdir(dirname(join(dir, file)), { recursive: true })
    await writeFile(join(dir, file), bytes)
  }
  return loadModelDirectory(dir)
}

const smallVit: VisionTransformerPreset = {
  imageSize: 32,
  patchSize: 8,
  hidden: 32,
  layers: 2,
  heads: 4,
  intermediate: 64,
  seed: 3
}
const smallDecoder: DecoderPreset = {
  hidden: 32,
  layers: 3,
  heads: 4,
  intermediate: 64,
  vocabSize: 1000,
  maxPositions: 64,
  seed: 4
}

describe("the benchmark presets", () => {
  it("have the sizes they are named for", () => {
    expect(vitB16).toMatchObject({ imageSize: 224, patchSize: 16, hidden: 768, layers: 12, heads: 12 })
    expect((vitB16.imageSize / vitB16.patchSize) ** 2 + 1).toBe(197)
    expect(decoder125m).toMatchObject({ hidden: 768, layers: 12, heads: 12, intermediate: 3072 })
  })
})

describe("the ViT recipe", () => {
  it("matches its float64 reference on random images", async () => {
    const model = await writeRecipe(visionTransformerRecipe("test/vit-small", smallVit))
    expect(model.config.model_type).toBe("vit")
    const random = new Random(11)
    const pixels = Float32Array.from({ length: 2 * 3 * 32 * 32 }, () => 2 * random.uniform() - 1)
    const outputs = await (await session(onnxPath(model, "vision_encoder"))).run({
      pixel_values: floatTensor(pixels, [2, 3, 32, 32])
    })
    expect(outputs.image_features!.dims).toEqual([2, 17, 32])
    expectClose(
      outputs.image_features,
      visionTransformerForward(randomVisionTransformerWeights(smallVit), pixels, 2),
      "image_features"
    )
  })
})

describe("the decoder recipe", () => {
  const { hidden, heads, layers } = smallDecoder
  const headDim = hidden / heads
  const weights = randomDecoderWeights(smallDecoder)
  let decoder: ort.InferenceSession

  beforeAll(async () => {
    const model = await writeRecipe(decoderRecipe("test/decoder-small", smallDecoder))
    expect(model.decoder).toEqual({
      hiddenSize: hidden,
      layers,
      heads,
      keyValueHeads: heads,
      headDim,
      vocabSize: 1000,
      maxPositions: 64,
      slidingWindow: undefined,
      firstPosition: 0
    })
    decoder = await session(onnxPath(model, "decoder_model_merged"))
  })

  const emptyPast = (batch: number) =>
    Object.fromEntries(
      Array.from({ length: layers }, (_, i) => [
        [`past_key_values.${i}.key`, floatTensor(new Float32Array(0), [batch, heads, 0, headDim])],
        [`past_key_values.${i}.value`, floatTensor(new Float32Array(0), [batch, heads, 0, headDim])]
      ]).flat()
    )

  it("matches its float64 reference, with a cache and padding", async () => {
    await expectDecoderMatchesReference(decoder, weights, new Random(12))
  })

  it("gives the same logits decoding step by step with its cache as over the whole sequence", async () => {
    const random = new Random(13)
    const length = 6
    const embeds = Float32Array.from({ length: length * hidden }, () => random.normal())
    const run = (from: number, to: number, past: Record<string, ort.Tensor>) =>
      decoder.run({
        inputs_embeds: floatTensor(embeds.slice(from * hidden, to * hidden), [1, to - from, hidden]),
        attention_mask: int64Tensor(new Array<number>(to).fill(1), [1, to]),
        position_ids: int64Tensor(
          Array.from({ length: to - from }, (_, i) => from + i),
          [1, to - from]
        ),
        ...past
      })
    const whole = numbers((await run(0, length, emptyPast(1))).logits)

    let outputs = await run(0, 3, emptyPast(1))
    const stepped = [...numbers(outputs.logits)]
    for (let position = 3; position < length; position++) {
      const past = Object.fromEntries(
        Array.from({ length: layers }, (_, i) => [
          [`past_key_values.${i}.key`, outputs[`present.${i}.key`]!],
          [`past_key_values.${i}.value`, outputs[`present.${i}.value`]!]
        ]).flat()
      )
      outputs = await run(position, position + 1, past)
      stepped.push(...numbers(outputs.logits))
    }
    expect(relativeError(stepped, whole)).toBeLessThanOrEqual(1e-5)
  })
})

describe("Graph", () => {
  it("refuses a name used twice, a fractional integer attribute and a mistyped initializer", () => {
    const g = new Graph("test")
    const x = g.input("x", "float32", ["n"])
    expect(() => g.input("x", "float32", ["n"])).toThrow(/used twice/)
    expect(() => g.op("Softmax", [x], { axis: 0.5 })).toThrow(/not an integer/)
    expect(() => g.weight("w", "int64", [2], Float32Array.of(1, 2))).toThrow(/needs a BigInt64Array/)
    expect(() => g.weight("w", "float32", [3], Float32Array.of(1, 2))).toThrow(/2 values for dims \[3\]/)
  })

  it("serializes the same calls to the same bytes", () => {
    const build = () => {
      const g = new Graph("same")
      const x = g.input("x", "float32", ["batch", 2])
      const y = g.scope("layer", () =>
        g.op("MatMul", [x, g.weight("w", "float32", [2, 2], Float32Array.of(1, 2, 3, 4))])
      )
      g.output(y, "y", "float32", ["batch", 2])
      return Buffer.from(g.toBytes())
    }
    expect(build().equals(build())).toBe(true)
  })

  it("names a computed output after the graph's output, as exporters do; an input or a second name goes through Identity", async () => {
    const g = new Graph("outputs")
    const x = g.input("x", "float32", [2])
    const doubled = g.op("Add", [x, x])
    const tripled = g.op("Add", [doubled, x])
    g.output(doubled, "present", "float32", [2])
    g.output(doubled, "again", "float32", [2])
    g.output(tripled, "out", "float32", [2])
    g.output(x, "echo", "float32", [2])
    const path = join(root, "outputs.onnx")
    await writeFile(path, g.toBytes())
    const model = onnxProto.onnx.ModelProto.decode(g.toBytes())
    const nodes = model.graph!.node!.map(
      (node) => `${node.opType}(${node.input!.join(",")})->${node.output!.join(",")}`
    )
    expect(nodes).toEqual(["Add(x,x)->present", "Add(present,x)->out", "Identity(present)->again", "Identity(x)->echo"])
    const outputs = await (await session(path)).run({ x: floatTensor(Float32Array.of(1, 2), [2]) })
    expect([...numbers(outputs.present!)]).toEqual([2, 4])
    expect([...numbers(outputs.again!)]).toEqual([2, 4])
    expect([...numbers(outputs.out!)]).toEqual([3, 6])
    expect([...numbers(outputs.echo!)]).toEqual([1, 2])
  })
})
