import { readdirSync } from "node:fs"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { packedWeightsDirEnvName } from "../../../src/executors/common/PackedWeights.js"
import { startExecutor } from "../../support/executors.js"
import { postAuthorized, secretEnv } from "../executorSecret.js"

/**
 * The LLM executor with a packed-weights folder in its environment, as `serve --packed-weights-dir`
 * starts it: its first start writes the decoder's copy and says so, its next maps the copy and says
 * so, and both answer as an executor without the folder does.
 */

const model = "cornserve/tiny-color-vlm"

let dir: string

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "cornserve-packed-executor-"))
})

afterAll(async () => {
  await rm(dir, { recursive: true, force: true })
})

const answer = async (env: Readonly<Record<string, string>>) => {
  const executor = await startExecutor(["--kind", "llm", "--model", model, "--devices", "cpu:0"], {
    ...secretEnv,
    ...env
  })
  try {
    const { status, body } = await postAuthorized<{ choices: Array<{ message: { content: string } }> }>(
      `${executor.url}/v1/chat/completions`,
      { model, messages: [{ role: "user", content: "Name a colour" }], temperature: 0, max_tokens: 12 }
    )
    expect(status).toBe(200)
    return { text: body.choices[0]!.message.content, output: executor.output() }
  } finally {
    await executor.stop()
  }
}

describe("an LLM executor with a packed-weights folder", () => {
  it("writes the decoder's copy on its first start, maps it on the next, and answers the same", async () => {
    const without = await answer({})
    const first = await answer({ [packedWeightsDirEnvName]: dir })
    expect(first.output).toMatch(/the decoder's packed weights were written to \S+ for the next load/)
    expect(readdirSync(dir)).toHaveLength(1)
    const second = await answer({ [packedWeightsDirEnvName]: dir })
    expect(second.output).toMatch(/the decoder's packed weights are mapped from \S+/)
    expect(first.text).toBe(without.text)
    expect(second.text).toBe(without.text)
  })
})
