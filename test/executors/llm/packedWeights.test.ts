import { existsSync, readdirSync } from "node:fs"
import { mkdir, mkdtemp, rm, utimes, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { SamplingParams } from "../../../src/executors/llm/protocol.js"
import { Runner } from "../../../src/executors/llm/Runner.js"
import type { Dtype } from "../../../src/models/Dtype.js"
import { loadModelDirectory } from "../../../src/models/ModelDirectory.js"
import { Random } from "../../../src/models/Random.js"
import { randomLlamaFiles } from "../../../src/models/recipes/RandomLlama.js"
import { aloneAndBatched } from "../../support/driveRunner.js"
import { smallLlamaConfig } from "../../models/support/SmallLlama.js"

/**
 * A packed-weights folder (`serve --packed-weights-dir`): a decoder's first load writes ONNX
 * Runtime's optimized copy with its packed weights, later loads open that copy, and the tokens are
 * the same as without the folder, alone and batched. A copy that does not fit the files is replaced;
 * one that cannot be opened is written again; a folder that cannot be written leaves the load as
 * it is.
 */

const greedy: SamplingParams = { temperature: 0, topP: 1, seed: 0, maxNewTokens: 8, stopTokenIds: [] }
const random = new Random(5)
const prompts = [6, 11, 3].map((length) => Array.from({ length }, () => random.below(smallLlamaConfig.vocabSize)))

let root: string
let model: string

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "cornserve-packed-"))
  model = join(root, "small-llama")
  for (const [file, bytes] of randomLlamaFiles({
    config: smallLlamaConfig,
    layout: "decoder-only",
    dtypes: ["fp32", "q8", "q4"],
    externalDataMinBytes: 4096,
    externalDataDtypes: ["fp32"]
  })) {
    await mkdir(dirname(join(model, file)), { recursive: true })
    await writeFile(join(model, file), bytes)
  }
})

afterAll(async () => {
  await rm(root, { recursive: true, force: true })
})

const run = async (dtype: Dtype, packedWeightsDir?: string) => {
  const runner = await Runner.open(
    await loadModelDirectory(model),
    "cpu:0",
    1,
    dtype,
    packedWeightsDir === undefined ? {} : { packedWeightsDir }
  )
  try {
    return { ...(await aloneAndBatched(runner, prompts, greedy)), packedWeights: runner.packedWeights }
  } finally {
    await runner.close()
  }
}

describe("packed weights kept on disk", () => {
  it.each(["fp32", "q8", "q4"] as const)(
    "%s: written on the first load, mapped on the next, the same tokens as without",
    async (dtype) => {
      const dir = join(root, `packed-${dtype}`)
      const without = await run(dtype)
      expect(without.packedWeights).toBeUndefined()
      expect(without.batched).toEqual(without.alone)

      const first = await run(dtype, dir)
      expect(first.packedWeights?.use).toBe("saved")
      const copies = readdirSync(dir)
      expect(copies).toHaveLength(1)
      expect(readdirSync(join(dir, copies[0]!)).sort()).toEqual(["decoder.onnx", "decoder.onnx_data"])
      expect(first.alone).toEqual(without.alone)
      expect(first.batched).toEqual(without.alone)

      const second = await run(dtype, dir)
      expect(second.packedWeights?.use).toBe("mapped")
      expect(second.packedWeights?.copy).toBe(first.packedWeights?.copy)
      expect(second.alone).toEqual(without.alone)
      expect(second.batched).toEqual(without.alone)
    }
  )

  it("replaces the copy when the weights' files change, and writes again one that cannot be opened", async () => {
    const dir = join(root, "packed-changes")
    const first = await run("fp32", dir)
    expect(first.packedWeights?.use).toBe("saved")
    // The same files, newer: another copy, and the older one goes.
    const later = new Date(Date.now() + 60_000)
    await utimes(join(model, "onnx", "model.onnx_data"), later, later)
    const changed = await run("fp32", dir)
    expect(changed.packedWeights?.use).toBe("saved")
    expect(changed.packedWeights?.copy).not.toBe(first.packedWeights?.copy)
    expect(readdirSync(dir)).toHaveLength(1)
    // A copy cut short is removed and written again.
    const [copy] = readdirSync(dir)
    await writeFile(join(dir, copy!, "decoder.onnx"), "not a model")
    const rewritten = await run("fp32", dir)
    expect(rewritten.packedWeights?.use).toBe("saved")
    expect((await run("fp32", dir)).packedWeights?.use).toBe("mapped")
    expect(rewritten.alone).toEqual(first.alone)
  })

  it("removes a copy whose writer died while writing it", async () => {
    const dir = join(root, "packed-abandoned")
    // No process has the kernel's pid limit as its pid.
    const abandoned = join(dir, `small-llama-model-decoder-0123.partial-${4_194_304}`)
    await mkdir(abandoned, { recursive: true })
    await writeFile(join(abandoned, "decoder.onnx"), "half")
    expect((await run("q4", dir)).packedWeights?.use).toBe("saved")
    // Removed in the background while the copy was written.
    await new Promise((resolve) => setTimeout(resolve, 100))
    expect(existsSync(abandoned)).toBe(false)
  })

  it("loads as it would without the folder when the folder cannot be made", async () => {
    const blocked = join(root, "not-a-folder")
    await writeFile(blocked, "a file where the folder would be")
    const without = await run("q4")
    const ran = await run("q4", blocked)
    expect(ran.packedWeights?.use).toBe("packed")
    expect(ran.alone).toEqual(without.alone)
  })
})
