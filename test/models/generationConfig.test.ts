import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { GenerationConfig } from "../../src/models/GenerationConfig.js"
import { InvalidModelDirectory, loadModelDirectory } from "../../src/models/ModelDirectory.js"

let root: string
let next = 0

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "cornserve-generation-config-"))
})

afterAll(async () => {
  await rm(root, { recursive: true, force: true })
})

/** The generation config of a model directory with this config.json and generation_config.json. */
const generationOf = async (config: Record<string, unknown>, generation?: Record<string, unknown>) => {
  const dir = join(root, `model-${next++}`)
  await mkdir(join(dir, "onnx"), { recursive: true })
  await writeFile(join(dir, "onnx", "model.onnx"), "")
  await writeFile(join(dir, "config.json"), JSON.stringify({ model_type: "llama", ...config }))
  if (generation !== undefined) await writeFile(join(dir, "generation_config.json"), JSON.stringify(generation))
  return GenerationConfig.of(await loadModelDirectory(dir))
}

describe("GenerationConfig", () => {
  it("takes generation_config.json's eos ids over config.json's, a single id or a list", async () => {
    // Llama 3.1 Instruct: config.json names one end token, generation_config.json all three.
    const llama = await generationOf(
      { eos_token_id: 128009, bos_token_id: 128000 },
      { eos_token_id: [128001, 128008, 128009], do_sample: true, temperature: 0.6, top_p: 0.9 }
    )
    expect(llama.eosTokenIds).toEqual([128001, 128008, 128009])
    expect(llama.bosTokenId).toBe(128000)
    expect((await generationOf({ eos_token_id: 2 }, { temperature: 0.7 })).eosTokenIds).toEqual([2])
    expect((await generationOf({ eos_token_id: [1, 106] })).eosTokenIds).toEqual([1, 106])
  })

  it("reads the ids of a multimodal config's text_config, as transformers.js lifts it", async () => {
    const gemma = await generationOf({ eos_token_id: 1, text_config: { eos_token_id: [1, 106], pad_token_id: 0 } })
    expect(gemma.eosTokenIds).toEqual([1, 106])
    expect(gemma.padTokenId).toBe(0)
  })

  it("makes generation_config.json's sampling fields the defaults, and leaves the others off", async () => {
    // Qwen 3's generation_config.json.
    const qwen = await generationOf(
      {},
      { do_sample: true, temperature: 0.6, top_k: 20, top_p: 0.95, eos_token_id: [151645, 151643] }
    )
    expect(qwen.sampling).toEqual({ temperature: 0.6, topP: 0.95, topK: 20, repetitionPenalty: 1 })
    expect((await generationOf({}, { repetition_penalty: 1.1 })).sampling).toEqual({
      temperature: 1,
      topP: 1,
      topK: 0,
      repetitionPenalty: 1.1
    })
    expect((await generationOf({})).sampling).toEqual({ temperature: 1, topP: 1, topK: 0, repetitionPenalty: 1 })
  })

  it("is greedy by default when the model says do_sample: false", async () => {
    expect((await generationOf({}, { do_sample: false, temperature: 0.9 })).sampling.temperature).toBe(0)
  })

  it("ignores config.json's leftover sampling and length defaults", async () => {
    const old = await generationOf({ max_length: 20, do_sample: false, top_k: 50, eos_token_id: 2 })
    expect(old.sampling).toEqual({ temperature: 1, topP: 1, topK: 0, repetitionPenalty: 1 })
    expect(old.maxNewTokens(10)).toBeUndefined()
  })

  it("limits a completion by max_new_tokens, else by what max_length leaves", async () => {
    expect((await generationOf({}, { max_new_tokens: 512, max_length: 100 })).maxNewTokens(90)).toBe(512)
    expect((await generationOf({}, { max_length: 4096 })).maxNewTokens(96)).toBe(4000)
    expect((await generationOf({}, { max_length: 50 })).maxNewTokens(96)).toBe(1)
  })

  it("names generation_config.json and the field when a value is wrong", async () => {
    const error = await generationOf({}, { top_p: 1.5, eos_token_id: "two" }).catch((e: unknown) => e)
    expect(error).toBeInstanceOf(InvalidModelDirectory)
    expect((error as Error).message).toMatch(/generation_config\.json: [\s\S]*eos_token_id[\s\S]*top_p/)
  })
})
