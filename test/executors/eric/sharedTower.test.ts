import { mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as ort from "onnxruntime-node"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { checkSharedProcessing, SharedTower } from "../../../src/executors/eric/SharedTower.js"
import { createSession } from "../../../src/executors/common/Sessions.js"
import { Random } from "../../../src/models/Random.js"
import { gemma3PreprocessorConfig, randomGemma3 } from "../../../src/models/recipes/RandomGemma3.js"
import { randomQwen2VLFiles } from "../../../src/models/recipes/RandomQwen2VL.js"
import { writeModelFiles } from "../../models/support/SmolVlmFixture.js"

/**
 * Eric's shared tower: one tower session and a projector per model give each model what its whole
 * vision encoder gives; a model whose tower differs, which reads images otherwise, or which is not
 * a Gemma 3, is refused with what differs.
 */
describe("a vision tower shared by models", () => {
  let root: string
  const small = randomGemma3({ seed: 5 })
  const wider = randomGemma3({ seed: 5, config: { ...small.config, text: { ...small.config.text, hiddenSize: 48 } } })
  const other = randomGemma3({ seed: 6 })
  const dir = (name: string) => join(root, name)

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-shared-tower-"))
    await writeModelFiles(dir("small"), small.files)
    await writeModelFiles(dir("wider"), wider.files)
    await writeModelFiles(dir("other"), other.files)
    // The same model reading images at another size.
    await writeModelFiles(dir("resized"), wider.files)
    await writeFile(
      join(dir("resized"), "preprocessor_config.json"),
      JSON.stringify(gemma3PreprocessorConfig(112, small.config.mmTokensPerImage))
    )
    await writeModelFiles(dir("qwen"), randomQwen2VLFiles({ seed: 1 }).files)
  })
  afterAll(() => rm(root, { recursive: true, force: true }))

  it("gives each model its own encoder's output", async () => {
    const tower = await SharedTower.open(
      { id: "small", dir: dir("small") },
      [{ id: "wider", dir: dir("wider") }],
      "cpu:0",
      1
    )
    const side = small.config.vision.imageSize
    const pixels = new ort.Tensor("float32", new Random(4).normals(3 * 3 * side * side, 1), [3, 3, side, side])
    try {
      expect(tower.sizes.projectorWeightBytes.wider).toBeLessThan(tower.sizes.projectorWeightBytes.small!)
      for (const name of ["small", "wider"]) {
        const whole = await createSession(join(dir(name), "onnx", "vision_encoder.onnx"), "cpu:0", 1)
        const expected = (await whole.run({ pixel_values: pixels })).image_features!
        await whole.release()
        const got = await tower.run(name, { pixel_values: pixels })
        expect(got.dims).toEqual(expected.dims)
        expect(Array.from(got.data as Float32Array)).toEqual(Array.from(expected.data as Float32Array))
      }
      await expect(tower.run("other", { pixel_values: pixels })).rejects.toThrow(/embeds for small, wider, not other/)
      // A batch of both models' images: one tower run, each image through its own model's projector.
      const mixed = await tower.embed({ pixel_values: pixels }, [
        { model: "wider", rows: [0, 1] },
        { model: "small", rows: [1, 3] }
      ])
      for (const [name, output, from, to] of [
        ["wider", mixed[0]!, 0, 1],
        ["small", mixed[1]!, 1, 3]
      ] as const) {
        const alone = await tower.run(name, {
          pixel_values: new ort.Tensor(
            "float32",
            (pixels.data as Float32Array).slice(from * 3 * side * side, to * 3 * side * side),
            [to - from, 3, side, side]
          )
        })
        expect(output.dims).toEqual(alone.dims)
        expect(Array.from(output.data as Float32Array)).toEqual(Array.from(alone.data as Float32Array))
      }
    } finally {
      await tower.release()
    }
  })

  it("refuses a model whose tower differs", async () => {
    await expect(
      SharedTower.open({ id: "small", dir: dir("small") }, [{ id: "other", dir: dir("other") }], "cpu:0", 1)
    ).rejects.toThrow(/other's vision tower differs from small's/)
  })

  it("refuses models that read images otherwise, and models other than Gemma 3", async () => {
    await expect(
      checkSharedProcessing({ id: "small", dir: dir("small") }, [{ id: "wider", dir: dir("wider") }])
    ).resolves.toBeUndefined()
    await expect(
      checkSharedProcessing({ id: "small", dir: dir("small") }, [{ id: "resized", dir: dir("resized") }])
    ).rejects.toThrow(/resized reads images otherwise than small/)
    await expect(checkSharedProcessing({ id: "qwen", dir: dir("qwen") }, [])).rejects.toThrow(/only Gemma 3 models/)
  })
})
