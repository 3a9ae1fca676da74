import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { buildModel } from "../../../src/models/ModelStore.js"
import { startExecutor } from "../../support/executors.js"
import { authorized, secretEnv } from "../executorSecret.js"

/**
 * The sampling fields and the model's own files as the LLM executor honours them:
 * cornserve/tiny-color-vlm with a generation_config.json that samples among the top token only,
 * and a chat_template.jinja (taking precedence over tokenizer_config.json's template) that
 * refuses developer messages.
 */

const model = "cornserve/tiny-color-vlm"

let root: string
let executor: Awaited<ReturnType<typeof startExecutor>>

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "cornserve-llm-sampling-"))
  const dir = await buildModel(model, root)
  const { chat_template } = JSON.parse(await readFile(join(dir, "tokenizer_config.json"), "utf8")) as {
    chat_template: string
  }
  await writeFile(
    join(dir, "chat_template.jinja"),
    `{% if messages[0]['role'] == 'developer' %}{{ raise_exception('developer messages are not for this model') }}{% endif %}${chat_template}`
  )
  await writeFile(join(dir, "generation_config.json"), JSON.stringify({ do_sample: true, top_k: 1 }))
  executor = await startExecutor(["--kind", "llm", "--model", model, "--devices", "cpu:0", "--max-batch-size", "8"], {
    CORNSERVE_MODEL_DIR: root,
    ...secretEnv
  })
})

afterAll(async () => {
  await executor?.stop()
  await rm(root, { recursive: true, force: true })
})

/** A chat completion, or an error answer. */
interface Answer {
  readonly choices?: ReadonlyArray<{ readonly message: { readonly content: string } }>
  readonly error?: { readonly code: string; readonly message: string }
}

const chat = async (body: Record<string, unknown>) => {
  const response = await fetch(`${executor.url}/v1/chat/completions`, {
    method: "POST",
    headers: { ...authorized, "content-type": "application/json" },
    body: JSON.stringify({
      model,
      messages: [{ role: "user", content: "Tell me about a zebra in Zürich 🦓" }],
      ignore_eos: true,
      max_tokens: 16,
      ...body
    })
  })
  return { status: response.status, body: (await response.json()) as Answer }
}

const answer = async (body: Record<string, unknown>): Promise<string> => {
  const { status, body: json } = await chat(body)
  expect(status, JSON.stringify(json)).toBe(200)
  return json.choices![0]!.message.content
}

describe("the LLM executor's sampling", () => {
  it("takes top_k from generation_config.json when the request leaves it out", async () => {
    const greedy = await answer({ temperature: 0 })
    const sampled = await Promise.all([1, 2, 3, 4].map((seed) => answer({ temperature: 1.5, seed })))
    expect(sampled).toEqual([greedy, greedy, greedy, greedy])
  })

  it("takes the request's top_k over the model's (0 and -1: every token)", async () => {
    for (const topK of [0, -1]) {
      const sampled = await Promise.all([1, 2, 3, 4].map((seed) => answer({ temperature: 1.5, top_k: topK, seed })))
      expect(new Set(sampled).size, `top_k ${topK}`).toBeGreaterThan(1)
    }
    expect(await answer({ temperature: 1.5, top_k: 2, seed: 5 })).toBe(
      await answer({ temperature: 1.5, top_k: 2, seed: 5 })
    )
  })

  it("applies repetition_penalty, greedy too", async () => {
    // The model answers a text-only question "nothing" again and again; penalized, its first
    // answer's tokens are not drawn again while any other word is likelier.
    expect(await answer({ temperature: 0 })).toBe("nothing".repeat(8))
    const penalized = await answer({ temperature: 0, repetition_penalty: 1000 })
    expect(penalized).toMatch(/^nothing/)
    expect(penalized).not.toMatch(/^nothingnothing/)
    expect(await answer({ temperature: 0, repetition_penalty: 1000 })).toBe(penalized)
  })

  it("400 for a top_k or repetition_penalty out of range", async () => {
    for (const field of [{ top_k: -2 }, { top_k: 1.5 }, { repetition_penalty: 0 }, { repetition_penalty: -1 }]) {
      const { status, body } = await chat(field)
      expect(status, JSON.stringify(field)).toBe(400)
      expect(body.error?.code).toBe("BadRequest")
    }
  })
})

describe("the LLM executor's chat template", () => {
  it("is chat_template.jinja's, and a message it refuses is a 400 naming the file and what it raised", async () => {
    const { status, body } = await chat({ messages: [{ role: "developer", content: "hi" }] })
    expect(status).toBe(400)
    expect(body.error?.message).toBe(
      "the model's chat template (chat_template.jinja) cannot render these messages: developer messages are not for this model"
    )
  })
})
