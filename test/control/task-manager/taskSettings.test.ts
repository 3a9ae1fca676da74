import { Either, Schema } from "effect"
import { describe, expect, it } from "vitest"
import { EncoderTask, LLMTask, TextEmbeddingTask } from "../../../src/app-runtime/index.js"
import type { AnyUnitTask } from "../../../src/app-runtime/tasks/Task.js"
import { defaultEngineSettings } from "../../../src/config/ServeConfig.js"
import { ExecutorSettings, sameSettings } from "../../../src/contracts/ExecutorSettings.js"
import { taskSettings } from "../../../src/control/task-manager/TaskSettings.js"

/** A unit task as the control plane holds it: its kind, id, name and config. */
const spec = (task: AnyUnitTask) => ({ id: task.id, kind: task.kind, name: task.name, config: task.config })

const model = "cornserve/tiny-color-vlm"

describe("a task's settings: its config's over serve's defaults", () => {
  it("an LLM task's own fields win, serve's fill the rest", () => {
    const defaults = {
      ...defaultEngineSettings,
      llmMaxBatchSize: 5,
      kvCacheBytes: 1 << 30,
      kvCacheMode: "copies" as const
    }
    expect(taskSettings(spec(new LLMTask({ model, maxBatchSize: 3, prefixCacheBytes: 0 })), defaults)).toEqual({
      maxBatchSize: 3,
      maxBatchDelayMs: 2,
      preprocessThreads: 2,
      kvCacheBytes: 1 << 30,
      prefixCacheBytes: 0,
      kvCacheMode: "copies"
    })
    expect(taskSettings(spec(new LLMTask({ model })), defaults).maxBatchSize).toBe(5)
  })

  it("the KV cache's fields are the LLM's alone; a text embedder batches what is queued without waiting", () => {
    const defaults = { ...defaultEngineSettings, kvCacheBytes: 1 << 30 }
    expect(taskSettings(spec(new EncoderTask({ model, modality: "image", maxBatchSize: 4 })), defaults)).toEqual({
      maxBatchSize: 4,
      maxBatchDelayMs: 2,
      preprocessThreads: 2
    })
    expect(taskSettings(spec(new TextEmbeddingTask({ model })), defaults)).toEqual({
      maxBatchSize: 32,
      maxBatchDelayMs: 0,
      preprocessThreads: 2
    })
    expect(
      taskSettings(spec(new TextEmbeddingTask({ model, maxBatchDelayMs: 5, preprocessThreads: 1 })), defaults)
    ).toMatchObject({ maxBatchDelayMs: 5, preprocessThreads: 1 })
  })
})

describe("the settings record an executor is sent", () => {
  const decode = Schema.decodeUnknownEither(ExecutorSettings, { onExcessProperty: "error" })
  const record = { threadsPerDevice: 2, maxBatchSize: 3, maxBatchDelayMs: 2, preprocessThreads: 2 }

  it("is checked on the executor's side: bounds, kinds and unknown fields", () => {
    expect(Either.isRight(decode({ ...record, kvCacheBytes: 1 << 20, kvCacheMode: "shared" }))).toBe(true)
    for (const bad of [
      { ...record, maxBatchSize: 0 },
      { ...record, kvCacheBytes: 1.5 },
      { ...record, kvCacheMode: "fast" },
      { ...record, args: ["--max-batch-size", "8"] }
    ])
      expect(Either.isLeft(decode(bad))).toBe(true)
  })

  it("two records ask for the same executor when their fields are equal, in whatever order", () => {
    expect(sameSettings({ ...record, kvCacheBytes: 1 }, { kvCacheBytes: 1, ...record })).toBe(true)
    expect(sameSettings(record, { ...record, kvCacheBytes: 1 })).toBe(false)
  })
})
