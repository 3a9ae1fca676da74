import { mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { randomLlamaFiles } from "../../src/models/recipes/RandomLlama.js"
import { writeModelFiles } from "../models/support/EmbeddingFixtures.js"
import { smallLlamaConfig } from "../models/support/SmallLlama.js"
import { disaggregatedAppSource, streamedText } from "../support/disaggregatedApps.js"
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
 * from one to the other through the sidecar (the decode executor's prefix cache takes it).
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
      args: ["--devices", "cpu:0,cpu:1,cpu:2"],
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

  afterAll(async () => {
    await platform?.stop()
    if (platform !== undefined) await removeStateDir(platform.stateDir)
    await rm(root, { recursive: true, force: true })
  })

  it("streams the greedy answers of the same model's LLMTask, from two deployments of its own", async () => {
    const prompts = [
      "the red fox and the blue bird went to the green hill where the yellow sun shone on the white snow",
      "a short one",
      "the black cat slept by the grey stone while the brown dog ran over the wide field to the old barn"
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
    // The decode executor prefilled the long prompts from their caches: two blocks each at least.
    const decodeTask = tasks.find((task) => task.config?.phase === "decode")!.id
    const metrics = await (await fetch(`${platform.url}/metrics`, { headers: adminHeaders() })).text()
    const hitTokens = metrics
      .split("\n")
      .filter((line) => line.startsWith("cornserve_llm_prefix_cache_hit_tokens_total") && line.includes(decodeTask))
      .reduce((sum, line) => sum + Number(line.split(" ").at(-1)), 0)
    expect(hitTokens).toBeGreaterThanOrEqual(2 * 32)
  })
})
