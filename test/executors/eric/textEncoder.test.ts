import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { AutoTokenizer } from "@huggingface/transformers"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { TextEncoder, type TextItemMeta } from "../../../src/executors/eric/TextEncoder.js"
import { cutDimensions, normalizeInPlace, paddedRuns, poolRow } from "../../../src/executors/eric/TextPooling.js"
import { loadModelDirectory } from "../../../src/models/ModelDirectory.js"
import type { Pooling } from "../../../src/models/TextEmbedding.js"
import { TextTokenizer } from "../../../src/models/TextTokenizer.js"
import {
  bertEmbedderFiles,
  largestDifference,
  qwen3EmbedderFiles,
  transformersEmbeddings,
  writeModelFiles
} from "../../models/support/EmbeddingFixtures.js"
import { offline } from "../../models/support/TransformersJs.js"

/**
 * Eric's text encoder on one device, in this process: the vectors of a BERT sentence encoder and
 * of a decoder exported for feature extraction equal transformers.js's `feature-extraction`
 * pipeline (pooled and normalized as the models' files say), for each text alone and for texts of
 * different lengths in one batch.
 */

const texts = [
  "The weather is warm today.",
  "Search the document for a vector.",
  "naïve café, Ελληνικά and 日本語",
  "a",
  "Every good boy does fine: a longer sentence, with several words the vocabulary has and some it does not."
]

let root: string

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "cornserve-text-encoder-"))
})

afterAll(async () => {
  await rm(root, { recursive: true, force: true })
})

/** Token ids back to back, and each input's rows among them, as the engine's batch buffer holds them. */
const stacked = (inputs: ReadonlyArray<ReadonlyArray<number>>, meta: TextItemMeta) => {
  const tokens = Int32Array.from(inputs.flat())
  let from = 0
  const items = inputs.map((ids) => {
    const rows = [from, from + ids.length] as const
    from += ids.length
    return { rows, meta }
  })
  return { tokens, items }
}

const ours = async (dir: string, pooling: Pooling, dtype?: "fp32" | "fp16") => {
  const model = await loadModelDirectory(dir)
  const tokenizer = new TextTokenizer(model)
  const encoder = await TextEncoder.open(model, "cpu:0", 1, dtype)
  try {
    const ids = texts.map((text) => tokenizer.encode(text))
    const meta: TextItemMeta = { modality: "text", pooling, normalize: true }
    const alone: Array<Float32Array> = []
    for (const input of ids) {
      const { tokens, items } = stacked([input], meta)
      alone.push(...(await encoder.embed(tokens, items)))
    }
    const { tokens, items } = stacked(ids, meta)
    return { alone, batched: await encoder.embed(tokens, items), file: encoder.file, ids }
  } finally {
    await encoder.release()
  }
}

const referenceIds = async (dir: string) => {
  const tokenizer = await AutoTokenizer.from_pretrained(offline(dir))
  return texts.map((text) => Array.from(tokenizer(text).input_ids.data as BigInt64Array, Number))
}

describe("a BERT sentence encoder (onnx/model.onnx: input_ids, attention_mask, token_type_ids → last_hidden_state)", () => {
  it.each([
    ["mean", "mean"],
    ["cls", "cls"]
  ] as const)("%s pooling, normalized: transformers.js's vectors, alone and batched", async (pooling, reference) => {
    const dir = await writeModelFiles(join(root, `bert-${pooling}`), bertEmbedderFiles({ pooling }))
    const expected = await transformersEmbeddings(dir, texts, { pooling: reference, normalize: true })
    const { alone, batched, ids, file } = await ours(dir, pooling)
    expect(file).toBe("onnx/model.onnx")
    expect(ids).toEqual(await referenceIds(dir))
    expect(ids[0]![0]).toBe(101)
    expect(ids[0]!.at(-1)).toBe(102)
    expect(largestDifference(alone, expected)).toBeLessThan(1e-5)
    expect(largestDifference(batched, expected)).toBeLessThan(1e-5)
    // Not a degenerate model: different texts, different vectors (by far more than the tolerance).
    expect(largestDifference([alone[0]!], [alone[1]!])).toBeGreaterThan(1e-3)
  })
})

describe("a decoder exported for feature extraction (Qwen3-Embedding's layout, last-token pooling)", () => {
  let dir: string

  beforeAll(async () => {
    dir = await writeModelFiles(join(root, "qwen3"), await qwen3EmbedderFiles(["fp32", "fp16"]))
  })

  it("fp32: transformers.js's vectors (which pad on the left), alone and batched (padded on the right here)", async () => {
    const expected = await transformersEmbeddings(dir, texts, { pooling: "last_token", normalize: true })
    const { alone, batched, ids, file } = await ours(dir, "last")
    expect(file).toBe("onnx/model.onnx")
    expect(ids).toEqual(await referenceIds(dir))
    expect(ids.every((input) => input.at(-1) === 151643)).toBe(true)
    expect(largestDifference(alone, expected)).toBeLessThan(1e-5)
    expect(largestDifference(batched, expected)).toBeLessThan(1e-5)
  })

  it("fp16 (model_fp16.onnx, float16 last_hidden_state): the fp32 export's vectors, to half precision", async () => {
    const full = await ours(dir, "last", "fp32")
    const half = await ours(dir, "last", "fp16")
    expect(half.file).toBe("onnx/model_fp16.onnx")
    expect(largestDifference(half.alone, full.alone)).toBeLessThan(1e-2)
    expect(largestDifference(half.batched, half.alone)).toBeLessThan(1e-3)
  })
})

describe("pooling and padded runs", () => {
  // Two rows of width 3, hidden size 2; the second row has 2 tokens and one padding.
  const hidden = [1, 2, 3, 4, 5, 6, 10, 20, 30, 40, 99, 99]

  it("pools a row's tokens only: their mean, the first, or the last", () => {
    expect(Array.from(poolRow(hidden, 3, 2, 1, 2, "mean"))).toEqual([20, 30])
    expect(Array.from(poolRow(hidden, 3, 2, 1, 2, "cls"))).toEqual([10, 20])
    expect(Array.from(poolRow(hidden, 3, 2, 1, 2, "last"))).toEqual([30, 40])
    expect(Array.from(poolRow(hidden, 3, 2, 0, 3, "mean"))).toEqual([3, 4])
  })

  it("normalizes to unit length, and cuts Matryoshka vectors before normalizing them again", () => {
    expect(Array.from(normalizeInPlace(Float32Array.of(3, 4)))).toEqual([Math.fround(0.6), Math.fround(0.8)])
    expect(Array.from(normalizeInPlace(Float32Array.of(0, 0)))).toEqual([0, 0])
    const [x, y] = cutDimensions(normalizeInPlace(Float32Array.of(3, 4, 12)), 2, true)
    expect(x).toBeCloseTo(0.6, 6)
    expect(y).toBeCloseTo(0.8, 6)
    expect(Array.from(cutDimensions(Float32Array.of(3, 4, 12), 2, false))).toEqual([3, 4])
  })

  it("groups inputs longest first, within the token budget, splitting where lengths halve", () => {
    expect(paddedRuns([10, 100, 90, 40, 12], 1000)).toEqual([[1, 2], [3], [4, 0]])
    expect(paddedRuns([100, 100, 100], 250)).toEqual([[0, 1], [2]])
    // One input longer than the budget still runs, alone.
    expect(paddedRuns([500, 5], 100)).toEqual([[0], [1]])
    // Short inputs share a run whatever their lengths.
    expect(paddedRuns([16, 2, 3], 1000)).toEqual([[0, 2, 1]])
  })
})
