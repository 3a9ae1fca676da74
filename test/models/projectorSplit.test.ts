import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import * as ort from "onnxruntime-node"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { createSession } from "../../src/executors/common/Sessions.js"
import { splitAtProjector, type ProjectorSplit } from "../../src/models/onnx/ProjectorSplit.js"
import { graphWithWeightsInPlace, initializerBytes } from "../../src/models/onnx/WeightsInPlace.js"
import { Random } from "../../src/models/Random.js"
import { type RandomGemma3, randomGemma3 } from "../../src/models/recipes/RandomGemma3.js"
import { writeModelFiles } from "./support/SmolVlmFixture.js"

/**
 * Gemma 3's vision encoder cut at its projector's input: the tower and the projector run one after
 * the other give what the whole encoder gives, the tower's digest is the same for two model sizes
 * drawn with one tower (their projectors differ in width) and differs for another tower, and the
 * parts keep their weights in the model's file.
 */

const split = async (dir: string, stem = "vision_encoder"): Promise<ProjectorSplit | { readonly reason: string }> => {
  const path = join(dir, "onnx", `${stem}.onnx`)
  const read = await graphWithWeightsInPlace(path, { minBytes: 64 })
  return splitAtProjector(read.bytes, initializerBytes(dirname(path)))
}

const asSplit = (result: ProjectorSplit | { readonly reason: string }): ProjectorSplit => {
  if (!("towerDigest" in result)) throw new Error(result.reason)
  return result
}

describe("a vision encoder split at its projector", () => {
  let root: string
  const small = randomGemma3({ seed: 5 })
  /** Another size: the same tower (drawn first from the same seed), a language model 48 wide. */
  const wider: RandomGemma3 = randomGemma3({
    seed: 5,
    config: { ...small.config, text: { ...small.config.text, hiddenSize: 48 } }
  })
  const otherTower = randomGemma3({ seed: 6 })
  const dirs = { small: "", wider: "", other: "" }

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-projector-split-"))
    for (const [name, fixture] of [
      ["small", small],
      ["wider", wider],
      ["other", otherTower]
    ] as const) {
      dirs[name] = join(root, name)
      await writeModelFiles(dirs[name], fixture.files)
    }
  })
  afterAll(() => rm(root, { recursive: true, force: true }))

  it("runs as the whole encoder, tower then projector", async () => {
    const side = small.config.vision.imageSize
    const pixels = new ort.Tensor("float32", new Random(3).normals(2 * 3 * side * side, 1), [2, 3, side, side])
    for (const dir of [dirs.small, dirs.wider]) {
      const parts = asSplit(await split(dir))
      const folder = join(dir, "onnx")
      const whole = await createSession(join(folder, "vision_encoder.onnx"), "cpu:0", 1)
      const tower = await createSession(parts.tower, "cpu:0", 1, { externalDataFolder: folder })
      const projector = await createSession(parts.projector, "cpu:0", 1, { externalDataFolder: folder })
      expect(tower.outputNames).toEqual([parts.cut])
      expect(projector.inputNames).toEqual([parts.cut])
      const expected = (await whole.run({ pixel_values: pixels })).image_features!
      const states = (await tower.run({ pixel_values: pixels }))[parts.cut]!
      const got = (await projector.run({ [parts.cut]: states })).image_features!
      expect(got.dims).toEqual(expected.dims)
      expect(Array.from(got.data as Float32Array)).toEqual(Array.from(expected.data as Float32Array))
      for (const session of [whole, tower, projector]) await session.release()
      // The weights stay in the file: the parts are graphs.
      expect(parts.tower.byteLength).toBeLessThan(parts.towerWeightBytes)
      expect(parts.projectorWeightBytes).toBeGreaterThan(0)
    }
  })

  it("names a tower by its computation and weights", async () => {
    const [a, b, c] = [
      asSplit(await split(dirs.small)),
      asSplit(await split(dirs.wider)),
      asSplit(await split(dirs.other))
    ]
    expect(a.towerDigest).toBe(b.towerDigest)
    expect(a.towerDigest).not.toBe(c.towerDigest)
    // 32 wide to 64 and to 48: the projectors differ by their widths.
    expect(a.projectorWeightBytes - b.projectorWeightBytes).toBe(32 * (64 - 48) * 4)
  })

  it("refuses a graph without a tower's last norm", async () => {
    const result = await split(dirs.small, "embed_tokens")
    expect("reason" in result && result.reason).toMatch(/LayerNormalization/)
  })
})
