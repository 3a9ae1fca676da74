import { cp, mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { AutoTokenizer } from "@huggingface/transformers"
import OpenAI from "openai"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { buildModel } from "../../src/models/ModelStore.js"
import { randomLlamaFiles } from "../../src/models/recipes/RandomLlama.js"
import { offline, transformersGreedy } from "../models/support/TransformersJs.js"
import { type RunningPlatform, runCli, startPlatform } from "../support/platform.js"

/**
 * A model exported the way the community exports it, served by the real binary: registered in an
 * app, called through the OpenAI client, answering what transformers.js answers; and models the
 * platform cannot serve refused at registration with the reason.
 */

const config = {
  hiddenSize: 64,
  intermediateSize: 96,
  layers: 2,
  heads: 4,
  kvHeads: 2,
  headDim: 16,
  vocabSize: 512,
  maxPositions: 256,
  ropeTheta: 10000,
  rmsNormEps: 1e-5
}

const appSource = (task: string) => `
import { ChatCompletionRequest, defineApp, EncoderTask, LLMTask } from "cornserve/app"
const task = ${task}
export default defineApp({
  tasks: { task },
  request: ChatCompletionRequest,
  serve: (request) => task.invoke(request as never)
})
`

describe("community exports through the real binary", () => {
  let platform: RunningPlatform
  let root: string
  let llama: string
  let env: Record<string, string>

  const register = async (name: string, task: string) => {
    const file = join(root, `${name}.ts`)
    await writeFile(file, appSource(task))
    return runCli(["app", "register", file], env)
  }

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-community-apps-"))
    llama = join(root, "models", "tiny-llama")
    for (const [file, bytes] of randomLlamaFiles({ config, layout: "decoder-only", dtypes: ["fp32", "q4"] })) {
      await mkdir(dirname(join(llama, file)), { recursive: true })
      await writeFile(join(llama, file), bytes)
    }
    platform = await startPlatform({
      args: ["--devices", "cpu:0,cpu:1"],
      env: { CORNSERVE_MODEL_DIR: join(root, "models") }
    })
    env = { CORNSERVE_GATEWAY_URL: platform.url }
  })

  afterAll(async () => {
    await platform?.stop()
    await rm(root, { recursive: true, force: true })
  })

  it("serves a decoder-only q4 export: the OpenAI client gets transformers.js's greedy answer", async () => {
    const registered = await register("tiny_llama", `new LLMTask({ model: ${JSON.stringify(llama)}, dtype: "q4" })`)
    expect(registered.code, registered.stderr).toBe(0)

    const messages = [{ role: "user" as const, content: "What colour is the sky?" }]
    const tokenizer = await AutoTokenizer.from_pretrained(offline(llama))
    const { input_ids: promptIds } = tokenizer.apply_chat_template(messages, {
      add_generation_prompt: true,
      tokenize: true,
      return_tensor: false
    }) as unknown as { input_ids: Array<number> }
    const [expectedIds] = await transformersGreedy(llama, "q4", [promptIds], 12)
    const expected = tokenizer.decode(expectedIds!, { skip_special_tokens: true })

    const client = new OpenAI({ baseURL: `${platform.url}/app/tiny_llama/v1`, apiKey: "unused" })
    const completion = await client.chat.completions.create({
      model: llama,
      messages,
      max_tokens: 12,
      temperature: 0
    })
    expect(completion.choices[0]!.message.content).toBe(expected)
    expect(completion.usage!.prompt_tokens).toBe(promptIds.length)
    expect(completion.usage!.completion_tokens).toBe(expectedIds!.length)
  })

  it("refuses a dtype the model does not have, listing those it has", async () => {
    const registered = await register(
      "tiny_llama_int8",
      `new LLMTask({ model: ${JSON.stringify(llama)}, dtype: "int8" })`
    )
    expect(registered.code).not.toBe(0)
    expect(registered.stderr).toMatch(/has no int8 export \(model_int8\.onnx\); the dtypes it has: fp32, q4/)
  })

  it("an encoder that cannot read its preprocessor config hands its reason to the registration error", async () => {
    const vlm = join(root, "models", "odd-vlm")
    await cp(await buildModel("cornserve/tiny-color-vlm", join(root, "built")), vlm, { recursive: true })
    const preprocessor = JSON.parse(await readFile(join(vlm, "preprocessor_config.json"), "utf8"))
    await writeFile(
      join(vlm, "preprocessor_config.json"),
      JSON.stringify({ ...preprocessor, size: { longest_edge: 512 } })
    )
    const registered = await register(
      "odd_encoder",
      `new EncoderTask({ model: ${JSON.stringify(vlm)}, modality: "image" })`
    )
    expect(registered.code).not.toBe(0)
    expect(registered.stderr).toMatch(/preprocessor_config\.json/)
    expect(registered.stderr).toMatch(/size/)
  })
})
