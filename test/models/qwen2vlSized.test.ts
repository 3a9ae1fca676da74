import { AutoModelForImageTextToText, AutoProcessor, RawImage, type Tensor } from "@huggingface/transformers"
import { existsSync } from "node:fs"
import { mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as ort from "onnxruntime-node"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { Qwen2VLTextWeights } from "../../src/models/architectures/Qwen2VL.js"
import { mropePositions } from "../../src/models/MRope.js"
import { Graph } from "../../src/models/onnx/Graph.js"
import { linearQ4, q4BlockSize, quantizeQ4 } from "../../src/models/onnx/Layers.js"
import type { GridThw } from "../../src/models/Qwen2VLProcessor.js"
import { Random } from "../../src/models/Random.js"
import { qwen2VLSizedBuild, qwen2VLSizedWeights } from "../../src/models/recipes/BenchQwen2VL2b.js"
import { tinyQwen2VLConfig } from "../../src/models/recipes/RandomQwen2VL.js"
import { writeModelBuild } from "../../src/models/recipes/Recipe.js"
import { type LinearWeights, type Matrix, matrix } from "../../src/models/Weights.js"
import { gradientPng } from "../support/mllmApps.js"
import { numbers, relativeError } from "./support/Ort.js"
import { referenceQwen2VLGreedy, referenceVisionFeatures } from "./support/Qwen2VLModelReference.js"
import { offline } from "./support/TransformersJs.js"

/**
 * The Qwen2-VL of a real size's build (bench/qwen2-vl-2b), at a tiny geometry: its 4-bit linear
 * layers as ONNX Runtime's MatMulNBits reads them, and the files transformers.js loads with the
 * decoder at q4, answering as the float64 reference does on the weights the 4-bit codes stand for.
 */

/** W as its 4-bit codes and scales give it back, read from the packed bytes as MatMulNBits reads them. */
const dequantized = (m: Matrix): Matrix => {
  const { codes, scales } = quantizeQ4(m)
  const blocks = Math.ceil(m.rows / q4BlockSize)
  const out = new Float32Array(m.rows * m.cols)
  for (let column = 0; column < m.cols; column++) {
    for (let row = 0; row < m.rows; row++) {
      const block = Math.floor(row / q4BlockSize)
      const inBlock = row % q4BlockSize
      const byte = codes[(column * blocks + block) * (q4BlockSize / 2) + (inBlock >> 1)]!
      const code = (byte >> ((inBlock & 1) * 4)) & 0xf
      out[row * m.cols + column] = (code - 8) * scales[column * blocks + block]!
    }
  }
  return matrix(m.rows, m.cols, out)
}

const dequantizedLinear = (w: LinearWeights): LinearWeights =>
  w.bias === undefined ? { weight: dequantized(w.weight) } : { weight: dequantized(w.weight), bias: w.bias }

describe("4-bit linear layers (MatMulNBits, blocks of 32)", () => {
  it("give back each weight within half a step of its block's scale (a step where clamped), its block's largest magnitude exactly", () => {
    const random = new Random(7)
    // 80 inputs: two whole blocks and half of one.
    const weight = matrix(80, 24, random.normals(80 * 24, 0.5))
    const back = dequantized(weight)
    const { scales } = quantizeQ4(weight)
    const blocks = Math.ceil(80 / q4BlockSize)
    for (let column = 0; column < 24; column++) {
      for (let block = 0; block < blocks; block++) {
        const scale = Math.abs(scales[column * blocks + block]!)
        let largest = -1
        for (let row = block * q4BlockSize; row < Math.min(80, (block + 1) * q4BlockSize); row++) {
          const at = row * 24 + column
          // Codes run −8..7 steps: the extreme's side reaches 8, the other side stops at 7 (clamped, within a step).
          const clamped = Math.abs(weight.data[at]!) > 7.5 * scale
          expect(Math.abs(back.data[at]! - weight.data[at]!)).toBeLessThanOrEqual((clamped ? scale : scale / 2) + 1e-6)
          if (largest < 0 || Math.abs(weight.data[at]!) > Math.abs(weight.data[largest]!)) largest = at
        }
        expect(back.data[largest]).toBeCloseTo(weight.data[largest]!, 6)
      }
    }
  })

  it("compute in ONNX Runtime x · W' + b, W' the weights the codes stand for", async () => {
    const random = new Random(8)
    const w: LinearWeights = { weight: matrix(80, 24, random.normals(80 * 24, 0.5)), bias: random.normals(24, 0.1) }
    const g = new Graph("q4_linear")
    const x = g.input("x", "float32", [3, 80])
    g.output(linearQ4(g, x, w, "proj"), "y", "float32", [3, 24])
    const root = await mkdtemp(join(tmpdir(), "cornserve-q4-linear-"))
    try {
      const path = join(root, "linear.onnx")
      await writeFile(path, g.toBytes())
      const session = await ort.InferenceSession.create(path)
      const input = random.normals(3 * 80, 1)
      const { y } = await session.run({ x: new ort.Tensor("float32", input, [3, 80]) })
      await session.release()
      const back = dequantized(w.weight)
      const expected = new Float64Array(3 * 24)
      for (let r = 0; r < 3; r++)
        for (let c = 0; c < 24; c++) {
          let sum = w.bias![c]!
          for (let k = 0; k < 80; k++) sum += input[r * 80 + k]! * back.data[k * 24 + c]!
          expected[r * 24 + c] = sum
        }
      expect(relativeError(numbers(y), expected)).toBeLessThanOrEqual(1e-5)
    } finally {
      await rm(root, { recursive: true, force: true })
    }
  })
})

/** Qwen2-VL-2B's build at a geometry small enough for a test, with Qwen's vocabulary. */
const tinyConfig = tinyQwen2VLConfig(151936)

describe("a Qwen2-VL built as bench/qwen2-vl-2b is, at a tiny geometry", () => {
  const seed = 3
  let root: string
  let model: string

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-qwen2vl-sized-"))
    model = join(root, "qwen2-vl-sized")
    await writeModelBuild(model, qwen2VLSizedBuild(tinyConfig, { seed, maxPixels: 28 * 28 * 64, extraConfig: {} }))
  })

  afterAll(async () => {
    if (root !== undefined) await rm(root, { recursive: true, force: true })
  })

  it("writes the vision encoder's weights as external data and the language model at q4 only", () => {
    for (const file of [
      "vision_encoder.onnx",
      "vision_encoder.onnx_data",
      "embed_tokens_q4.onnx",
      "decoder_model_merged_q4.onnx"
    ])
      expect(existsSync(join(model, "onnx", file)), file).toBe(true)
    for (const file of ["embed_tokens.onnx", "decoder_model_merged.onnx"])
      expect(existsSync(join(model, "onnx", file)), file).toBe(false)
  })

  it("transformers.js answers an image at q4 as the float64 reference on the weights the codes stand for", async () => {
    const name = offline(model)
    const processor = await AutoProcessor.from_pretrained(name)
    const vlm = await AutoModelForImageTextToText.from_pretrained(name, {
      dtype: { vision_encoder: "fp32", embed_tokens: "q4", decoder_model_merged: "q4" }
    })
    const steps = 6
    try {
      const prompt = processor.apply_chat_template(
        [{ role: "user", content: [{ type: "image" }, { type: "text", text: "What is in this image?" }] }],
        { add_generation_prompt: true }
      ) as string
      const png = await gradientPng(84, 56)
      const inputs = await processor(prompt, await RawImage.fromBlob(new Blob([new Uint8Array(png)])))
      const ids = Array.from((inputs.input_ids as Tensor).data as BigInt64Array, Number)
      const output = (await vlm.generate({
        ...inputs,
        max_new_tokens: steps,
        min_new_tokens: steps,
        do_sample: false
      })) as Tensor
      const generated = Array.from(output.data as BigInt64Array, Number).slice(ids.length)

      const weights = qwen2VLSizedWeights(tinyConfig, seed)
      const grid = Array.from((inputs.image_grid_thw as Tensor).data as BigInt64Array, Number) as unknown as GridThw
      const features = referenceVisionFeatures(
        { ...weights.vision, blocks: Array.from(weights.vision.blocks) },
        (inputs.pixel_values as Tensor).data as Float32Array,
        [grid]
      )
      const text: Qwen2VLTextWeights = {
        ...weights.text,
        layers: Array.from(weights.text.layers, (layer) => ({
          ...layer,
          q: dequantizedLinear(layer.q),
          k: dequantizedLinear(layer.k),
          v: dequantizedLinear(layer.v),
          o: dequantizedLinear(layer.o),
          gate: dequantizedLinear(layer.gate),
          up: dequantizedLinear(layer.up),
          down: dequantizedLinear(layer.down)
        })),
        lmHead: dequantized(weights.text.lmHead)
      }
      // Qwen's vocabulary: <|vision_start|>, <|image_pad|> and <|video_pad|> at Qwen2-VL's ids.
      expect(ids).toContain(151652)
      const pads = { imagePad: 151655, videoPad: 151656 }
      const { positions, delta } = mropePositions(ids, pads, { images: [grid], videos: [] }, 2)
      expect(generated).toEqual(
        referenceQwen2VLGreedy(text, ids, new Set([pads.imagePad]), features, positions, delta, steps)
      )
      expect(new Set(generated).size).toBeGreaterThan(1)
    } finally {
      await vlm.dispose()
    }
  })
})
