import { mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { AutoModelForImageTextToText, AutoProcessor, RawImage, type Tensor } from "@huggingface/transformers"
import OpenAI from "openai"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { randomGemma3 } from "../../src/models/recipes/RandomGemma3.js"
import { writeModelFiles } from "../models/support/SmolVlmFixture.js"
import { offline } from "../models/support/TransformersJs.js"
import { gradientPng } from "../support/mllmApps.js"
import { type RunningPlatform, runCli, startPlatform } from "../support/platform.js"

/**
 * Two Gemma 3 models of two sizes (language models 64 and 48 wide) whose vision encoders hold one
 * SigLIP tower and differ in the projector, as Google's 4B, 12B and 27B do: two apps, each an MLLM
 * task on one of them naming both as `encoderModels`, deploy one encoder task (the tower once, a
 * projector each) beside their two LLMs. Each app's answers are its model's alone, as
 * transformers.js gives them with that model's whole vision encoder.
 */

const maxTokens = 6

const sharedApp = (model: string, models: ReadonlyArray<string>) => `
import { ChatCompletionRequest, defineApp, MLLMTask } from "cornserve/app"
const mllm = new MLLMTask({ model: ${JSON.stringify(model)}, modalities: ["image"], encoderModels: ${JSON.stringify(models)} })
export default defineApp({ tasks: { mllm }, request: ChatCompletionRequest, serve: (request) => mllm.invoke(request) })
`

describe("one vision tower shared by two Gemma 3 sizes", () => {
  let root: string
  let platform: RunningPlatform
  const small = randomGemma3({ seed: 5 })
  const wider = randomGemma3({ seed: 5, config: { ...small.config, text: { ...small.config.text, hiddenSize: 48 } } })
  /** Another tower: an encoder cannot serve it beside the others. */
  const other = randomGemma3({ seed: 6 })
  const models = { small: "", wider: "" }
  const images = new Map<string, Buffer>()

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-encoder-sharing-"))
    models.small = join(root, "gemma-3-a")
    models.wider = join(root, "gemma-3-b")
    await writeModelFiles(models.small, small.files)
    await writeModelFiles(models.wider, wider.files)
    await writeModelFiles(join(root, "gemma-3-c"), other.files)
    images.set("wide", await gradientPng(112, 42))
    images.set("tall", await gradientPng(40, 100))
    platform = await startPlatform({ args: ["--devices", "cpu:0,cpu:1,cpu:2", "--model-root", root] })
    for (const [name, model] of Object.entries(models)) {
      const file = join(root, `shared_${name}.ts`)
      await writeFile(file, sharedApp(model, [models.wider, models.small]))
      const registered = await runCli(["app", "register", file], { CORNSERVE_GATEWAY_URL: platform.url })
      expect(registered.code, registered.stderr).toBe(0)
    }
  }, 240_000)

  afterAll(async () => {
    await platform?.stop()
    if (root !== undefined) await rm(root, { recursive: true, force: true })
  })

  const ask = async (app: string, model: string, image: string | undefined, text: string) => {
    const client = new OpenAI({ baseURL: `${platform.url}/app/${app}/v1`, apiKey: "unused", maxRetries: 0 })
    const content = [
      ...(image === undefined
        ? []
        : [
            { type: "image_url", image_url: { url: `data:image/png;base64,${images.get(image)!.toString("base64")}` } }
          ]),
      { type: "text", text }
    ]
    const completion = await client.chat.completions.create({
      model,
      messages: [{ role: "user", content: content as never }],
      max_tokens: maxTokens,
      temperature: 0
    })
    return completion.choices[0]!.message.content!
  }

  /** transformers.js's greedy answers of `model` alone (its whole vision_encoder.onnx) to the question about each image. */
  const references = async (model: string, question: string): Promise<Map<string, string>> => {
    const id = offline(model)
    const processor = await AutoProcessor.from_pretrained(id)
    const vlm = await AutoModelForImageTextToText.from_pretrained(id, { dtype: "fp32" })
    const answers = new Map<string, string>()
    try {
      const prompt = processor.apply_chat_template(
        [{ role: "user", content: [{ type: "image" }, { type: "text", text: question }] }],
        { add_generation_prompt: true }
      ) as string
      for (const [name, bytes] of images) {
        const inputs = await processor(prompt, await RawImage.fromBlob(new Blob([bytes])), {
          add_special_tokens: false
        })
        const output = (await vlm.generate({ ...inputs, max_new_tokens: maxTokens, do_sample: false })) as Tensor
        const ids = Array.from(output.data as BigInt64Array, Number).slice((inputs.input_ids as Tensor).dims[1]!)
        answers.set(name, processor.tokenizer!.decode(ids, { skip_special_tokens: true }))
      }
    } finally {
      await vlm.dispose()
    }
    return answers
  }

  it("deploys one encoder task for both apps, its tower's model first and the other as its adapter", async () => {
    const listed = (await (await fetch(`${platform.url}/tasks/list`)).json()) as {
      tasks: Array<{
        readonly kind: string
        readonly usedBy: ReadonlyArray<string>
        readonly settings: { readonly adapters?: ReadonlyArray<string> }
        readonly config: { readonly model: string }
      }>
    }
    const encoders = listed.tasks.filter((task) => task.kind === "encoder")
    expect(encoders).toHaveLength(1)
    expect([...encoders[0]!.usedBy].sort()).toEqual(["shared_small", "shared_wider"])
    // The models sorted: gemma-3-a's tower, gemma-3-b's projector beside it.
    expect(encoders[0]!.config.model).toBe(models.small)
    expect(encoders[0]!.settings.adapters).toEqual([models.wider])
    expect(listed.tasks.filter((task) => task.kind === "llm")).toHaveLength(2)
    const cli = await runCli(["tasks", "list"], { CORNSERVE_GATEWAY_URL: platform.url })
    expect(cli.code, cli.stderr).toBe(0)
    expect(cli.stdout).toContain(`adapters=${models.wider}`)
  })

  it("answers each app as its model alone, requests of both models and text-only ones together", async () => {
    const question = "What is in this image"
    const expected = {
      small: await references(models.small, question),
      wider: await references(models.wider, question)
    }
    // The projectors differ: the same image gets another answer from each model.
    expect(expected.small.get("wide")).not.toBe(expected.wider.get("wide"))
    const asked = (["small", "wider"] as const).flatMap((name) =>
      [...images.keys()].map(async (image) => ({
        name,
        image,
        answer: await ask(`shared_${name}`, models[name], image, question)
      }))
    )
    const text = Promise.all([
      ask("shared_small", models.small, undefined, "Hello"),
      ask("shared_wider", models.wider, undefined, "Hello")
    ])
    for (const { name, image, answer } of await Promise.all(asked)) {
      expect(answer, `${name}, ${image}`).toBe(expected[name].get(image))
    }
    expect((await text).every((answer) => typeof answer === "string")).toBe(true)
  })

  it("refuses, at registration and saying why, an app whose models' towers differ", async () => {
    const file = join(root, "shared_other.ts")
    await writeFile(file, sharedApp(models.small, [models.small, join(root, "gemma-3-c")]))
    const registered = await runCli(["app", "register", file], { CORNSERVE_GATEWAY_URL: platform.url })
    expect(registered.code).not.toBe(0)
    expect(registered.stderr).toMatch(/vision tower differs/)
    // The apps that share a tower still answer.
    expect(typeof (await ask("shared_small", models.small, "wide", "What is in this image"))).toBe("string")
  })
})
