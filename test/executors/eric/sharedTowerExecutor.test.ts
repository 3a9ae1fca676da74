import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as ort from "onnxruntime-node"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { fixedSizePixelValues } from "../../../src/models/FixedSizeImage.js"
import { gemma3ProcessorConfig } from "../../../src/models/Gemma3Processor.js"
import { loadModelDirectory } from "../../../src/models/ModelDirectory.js"
import { randomGemma3 } from "../../../src/models/recipes/RandomGemma3.js"
import { writeModelFiles } from "../../models/support/SmolVlmFixture.js"
import { gradientPng } from "../../support/mllmApps.js"
import { executorHeaders, type RunningProcess, startExecutor } from "../../support/executors.js"

/**
 * An Eric executor started with adapters (its settings record's `adapters`), as the platform starts
 * one for MLLM tasks that share `encoderModels`: one request may mix its models' images, each
 * embedded by its own model's projector over the one tower; a model it does not embed for is a
 * 400; and a model whose tower differs keeps the executor from starting, saying why.
 */
describe("Eric with adapters", () => {
  let root: string
  let eric: (RunningProcess & { readonly url: string }) | undefined
  const small = randomGemma3({ seed: 5 })
  const wider = randomGemma3({ seed: 5, config: { ...small.config, text: { ...small.config.text, hiddenSize: 48 } } })
  const other = randomGemma3({ seed: 6 })
  const dirs = { small: "", wider: "", other: "" }
  const settings = (adapters: ReadonlyArray<string>) =>
    JSON.stringify({ threadsPerDevice: 1, maxBatchSize: 8, maxBatchDelayMs: 2, preprocessThreads: 1, adapters })
  const start = (adapters: ReadonlyArray<string>) =>
    startExecutor(["--kind", "eric", "--model", dirs.small, "--devices", "cpu:0", "--settings", settings(adapters)], {
      CORNSERVE_MODEL_ROOTS: root
    })

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-eric-adapters-"))
    for (const [name, fixture] of [
      ["small", small],
      ["wider", wider],
      ["other", other]
    ] as const) {
      dirs[name] = join(root, name)
      await writeModelFiles(dirs[name], fixture.files)
    }
    eric = await start([dirs.wider])
  }, 120_000)

  afterAll(async () => {
    await eric?.stop()
    if (root !== undefined) await rm(root, { recursive: true, force: true })
  })

  const embed = (items: ReadonlyArray<Record<string, unknown>>) =>
    fetch(`${eric!.url}/embeddings`, {
      method: "POST",
      headers: executorHeaders({ "content-type": "application/json" }),
      body: JSON.stringify({ items, return: "inline" })
    })

  it("embeds one request's images for both models, each as its own whole vision encoder does", async () => {
    const png = await gradientPng(90, 40)
    const url = `data:image/png;base64,${png.toString("base64")}`
    const response = await embed([
      { id: "a", modality: "image", url, model: dirs.wider },
      { id: "b", modality: "image", url, model: dirs.small },
      { id: "c", modality: "image", url }
    ])
    expect(response.status, await response.clone().text()).toBe(200)
    const { items } = (await response.json()) as {
      items: Array<{ shape: [number, number]; embedding: Array<number> }>
    }
    const pixels = await fixedSizePixelValues(
      new Uint8Array(png),
      gemma3ProcessorConfig(await loadModelDirectory(dirs.small))
    )
    const whole = async (dir: string) => {
      const session = await ort.InferenceSession.create(join(dir, "onnx", "vision_encoder.onnx"))
      const output = (await session.run({ pixel_values: new ort.Tensor("float32", pixels.data, [...pixels.shape]) }))
        .image_features!
      await session.release()
      return Array.from(output.data as Float32Array)
    }
    expect(items.map((item) => item.shape)).toEqual([
      [4, 48],
      [4, 64],
      [4, 64]
    ])
    const expected = { wider: await whole(dirs.wider), small: await whole(dirs.small) }
    for (const [index, model] of (["wider", "small", "small"] as const).entries()) {
      const got = items[index]!.embedding
      expect(got.length).toBe(expected[model].length)
      expect(Math.max(...got.map((value, i) => Math.abs(value - expected[model][i]!)))).toBeLessThan(1e-5)
    }
  })

  it("refuses an item for a model it does not embed for", async () => {
    const response = await embed([{ id: "a", modality: "image", url: "data:image/png;base64,AA==", model: dirs.other }])
    expect(response.status).toBe(400)
    expect(await response.text()).toContain(`asks for ${dirs.other}`)
  })

  it("does not start with an adapter whose tower differs, and says why", async () => {
    await expect(start([dirs.other])).rejects.toThrow(/vision tower differs/)
  })
})
