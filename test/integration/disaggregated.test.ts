import { mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { randomLlamaFiles } from "../../src/models/recipes/RandomLlama.js"
import { writeModelFiles } from "../models/support/EmbeddingFixtures.js"
import { smallLlamaConfig } from "../models/support/SmallLlama.js"
import sharp from "sharp"
import { disaggregatedAppSource, disaggregatedMllmAppSource, streamedText } from "../support/disaggregatedApps.js"
import {
  adminHeaders,
  invoke,
  type RunningPlatform,
  removeStateDir,
  runCli,
  startPlatform
} from "../support/platform.js"

/**
 * An LLM's prefill and decode apart (DisaggregatedLLMTask), through the real binary: an app uses
 * it as it would an LLMTask and streams the same greedy answers; prefill and decode are two
 * deployments of their own beside the plain LLM task on the model, and the prompt's KV cache goes
 * from one to the other through the sidecar (the decode executor's requests start from it).
 */

describe("an LLM's prefill and decode on executors apart", () => {
  let root: string
  let model: string
  let platform: RunningPlatform

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-disaggregated-"))
    model = join(root, "models", "small-llama")
    await writeModelFiles(
      model,
      randomLlamaFiles({ config: smallLlamaConfig, layout: "decoder-only", dtypes: ["fp32"], seed: 10 })
    )
    platform = await startPlatform({
      // The text LLM three ways (whole, prefill, decode), then the VLM's four (its encoder, shared).
      args: ["--devices", "cpu:0,cpu:1,cpu:2,cpu:3,cpu:4,cpu:5,cpu:6"],
      env: { CORNSERVE_MODEL_DIR: join(root, "models") }
    })
    for (const [name, task] of [
      ["together", "LLMTask"],
      ["apart", "DisaggregatedLLMTask"]
    ] as const) {
      const file = join(root, `${name}.ts`)
      await writeFile(file, disaggregatedAppSource(model, task))
      const registered = await runCli(["app", "register", file], { CORNSERVE_GATEWAY_URL: platform.url })
      expect(registered.code, registered.stderr).toBe(0)
    }
  }, 240_000)

  /** A counter of a task's executors, summed, from the platform's /metrics. */
  const metricOf = async (metric: string, task: string) =>
    (await (await fetch(`${platform.url}/metrics`, { headers: adminHeaders() })).text())
      .split("\n")
      .filter((line) => line.startsWith(`${metric}{`) && line.includes(task))
      .reduce((sum, line) => sum + Number(line.split(" ").at(-1)), 0)
  /** The prompt positions a task's executors took from caches sent to them. */
  const importedTokens = (task: string) => metricOf("cornserve_llm_kv_imported_tokens_total", task)

  afterAll(async () => {
    await platform?.stop()
    if (platform !== undefined) await removeStateDir(platform.stateDir)
    await rm(root, { recursive: true, force: true })
  })

  it("streams the greedy answers of the same model's LLMTask, from two deployments of its own", async () => {
    const fox = "the red fox and the blue bird went to the green hill where the yellow sun shone on the white snow"
    // The fox again last: the prefill executor's prefix cache holds its blocks by then.
    const prompts = [
      fox,
      "a short one",
      "the black cat slept by the grey stone while the brown dog ran over the wide field to the old barn",
      fox
    ]
    for (const content of prompts) {
      const request = JSON.stringify({ messages: [{ role: "user", content }], max_tokens: 12, temperature: 0 })
      const [together, apart] = await Promise.all([
        invoke(platform.url, "together", request).then(streamedText),
        invoke(platform.url, "apart", request).then(streamedText)
      ])
      expect(apart, content).toBe(together)
      expect(apart.length).toBeGreaterThan(0)
    }
    const { tasks } = (await (await fetch(`${platform.url}/tasks/list`, { headers: adminHeaders() })).json()) as {
      tasks: Array<{ id: string; config?: { phase?: string } }>
    }
    expect(tasks).toHaveLength(3)
    expect(tasks.map((task) => task.config?.phase ?? "whole").sort()).toEqual(["decode", "prefill", "whole"])
    // The decode executor ran the prompts from their caches: all of each but its last token.
    const decodeTask = tasks.find((task) => task.config?.phase === "decode")!.id
    expect(await importedTokens(decodeTask)).toBeGreaterThanOrEqual(2 * 32)
    // The prefill executor ran the fox's second time only after the blocks it had kept.
    const prefillTask = tasks.find((task) => task.config?.phase === "prefill")!.id
    expect(await metricOf("cornserve_llm_prefix_cache_hit_tokens_total", prefillTask)).toBeGreaterThanOrEqual(16)
  })

  it("streams an image chat's answer as the MLLMTask does: the prefill task sends the image's embeddings on to the decode task", async () => {
    const vlm = "cornserve/tiny-color-vlm"
    for (const [name, task] of [
      ["vlm-together", "MLLMTask"],
      ["vlm-apart", "DisaggregatedMLLMTask"]
    ] as const) {
      const file = join(root, `${name}.ts`)
      await writeFile(file, disaggregatedMllmAppSource(vlm, task))
      const registered = await runCli(["app", "register", file], { CORNSERVE_GATEWAY_URL: platform.url })
      expect(registered.code, registered.stderr).toBe(0)
    }
    // Red again last: the prefill executor's prefix cache holds the blocks of its image and text by then.
    const colours = [
      [255, 0, 0],
      [0, 0, 255],
      [255, 0, 0]
    ] as const
    for (const [r, g, b] of colours) {
      const png = await sharp({ create: { width: 8, height: 8, channels: 3, background: { r, g, b } } })
        .png()
        .toBuffer()
      // Long enough that the cache holds whole blocks after the image, which only the decode executor's tail lacks.
      const text =
        "Look at the picture below and say which colour fills it, in one word, as plainly as you can, please."
      const request = JSON.stringify({
        messages: [
          {
            role: "user",
            content: [
              { type: "image_url", image_url: { url: `data:image/png;base64,${png.toString("base64")}` } },
              { type: "text", text }
            ]
          }
        ],
        max_tokens: 8,
        temperature: 0
      })
      const together = await invoke(platform.url, "vlm-together", request).then(streamedText)
      const apart = await invoke(platform.url, "vlm-apart", request).then(streamedText)
      expect(apart, `rgb(${r}, ${g}, ${b})`).toBe(together)
      expect(apart.length).toBeGreaterThan(0)
    }
    const { tasks } = (await (await fetch(`${platform.url}/tasks/list`, { headers: adminHeaders() })).json()) as {
      tasks: Array<{ id: string; name: string; config?: { phase?: string; model?: string } }>
    }
    const vlmTasks = tasks.filter((task) => task.config?.model === vlm)
    // One encoder, shared by both apps; the whole LLM; its prefill and its decode.
    expect(vlmTasks.map((task) => task.config?.phase ?? task.name.split("-")[0]).sort()).toEqual([
      "decode",
      "encoder",
      "llm",
      "prefill"
    ])
    const decodeTask = vlmTasks.find((task) => task.config?.phase === "decode")!.id
    expect(await importedTokens(decodeTask)).toBeGreaterThanOrEqual(2 * 16)
    const prefillTask = vlmTasks.find((task) => task.config?.phase === "prefill")!.id
    expect(await metricOf("cornserve_llm_prefix_cache_hit_tokens_total", prefillTask)).toBeGreaterThanOrEqual(16)
  })
})
