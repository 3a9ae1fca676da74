import { mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import {
  AutoModelForImageTextToText,
  AutoProcessor,
  AutoTokenizer,
  RawImage,
  type Tensor
} from "@huggingface/transformers"
import OpenAI from "openai"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { llavaOnevisionImageTokens } from "../../src/models/architectures/LlavaOnevision.js"
import { randomLlavaOnevision } from "../../src/models/recipes/RandomLlavaOnevision.js"
import { writeModelFiles } from "../models/support/SmolVlmFixture.js"
import { offline } from "../models/support/TransformersJs.js"
import { gradientPng, mllmAppSource } from "../support/mllmApps.js"
import { type RunningPlatform, runCli, startPlatform } from "../support/platform.js"

/**
 * LLaVA-OneVision in the split layout transformers.js runs (LlavaOnevisionForConditionalGeneration:
 * a SigLIP tower's last layer and the projector in vision_encoder.onnx, a Qwen2 decoder), on a
 * random-weight fixture of the project's recipe, served end to end by the real binary with encoder
 * fission on and off. Each image is resized to the tower's size whatever its own, and its rows
 * replace the `<image>` token's copies; the answers are transformers.js's, alone and in a batch
 * with text-only requests.
 */

const maxTokens = 8

type Part =
  | { readonly type: "text"; readonly text: string }
  | { readonly type: "image_url"; readonly image_url: { readonly url: string } }

describe("LLaVA-OneVision end to end", () => {
  let root: string
  let model: string
  let platform: RunningPlatform
  const fixture = randomLlavaOnevision({ seed: 7 })
  const imageTokens = llavaOnevisionImageTokens(fixture.config.vision)
  /** Wider than tall, taller than wide, under a patch (14), larger than the size (56). */
  const sizes = { wide: [112, 42], tall: [40, 100], tiny: [9, 5], large: [150, 120] } as const
  const images = new Map<string, Buffer>()

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-llava-onevision-"))
    model = join(root, "llava-onevision-tiny")
    await writeModelFiles(model, fixture.files)
    for (const [name, [width, height]] of Object.entries(sizes)) images.set(name, await gradientPng(width, height))
    platform = await startPlatform({ args: ["--devices", "cpu:0,cpu:1,cpu:2", "--model-root", root] })
    for (const [name, fission] of [
      ["llava_fission", true],
      ["llava_local", false]
    ] as const) {
      const file = join(root, `${name}.ts`)
      await writeFile(file, mllmAppSource(model, ["image"], fission))
      const registered = await runCli(["app", "register", file], { CORNSERVE_GATEWAY_URL: platform.url })
      expect(registered.code, registered.stderr).toBe(0)
    }
  }, 240_000)

  afterAll(async () => {
    await platform?.stop()
    if (root !== undefined) await rm(root, { recursive: true, force: true })
  })

  const ask = async (app: string, content: ReadonlyArray<Part> | string) => {
    const client = new OpenAI({ baseURL: `${platform.url}/app/${app}/v1`, apiKey: "unused", maxRetries: 0 })
    const completion = await client.chat.completions.create({
      model,
      messages: [{ role: "user", content: content as never }],
      max_tokens: maxTokens,
      temperature: 0
    })
    return completion.choices[0]!.message.content!
  }

  const imagePart = (name: string): Part => ({
    type: "image_url",
    image_url: { url: `data:image/png;base64,${images.get(name)!.toString("base64")}` }
  })

  /**
   * transformers.js's greedy answers: its processor makes the pixels (it has no LLaVA-OneVision
   * processor class, so the prompt's `<image>` is spelled out by hand, one per feature row, as its
   * masked scatter needs), its model generates; text alone goes through the same model.
   */
  const references = async (
    asks: ReadonlyArray<{ readonly image?: string; readonly text: string }>
  ): Promise<Array<string>> => {
    const id = offline(model)
    const processor = await AutoProcessor.from_pretrained(id)
    const tokenizer = await AutoTokenizer.from_pretrained(id)
    const vlm = await AutoModelForImageTextToText.from_pretrained(id, { dtype: "fp32" })
    try {
      const answers: Array<string> = []
      for (const { image, text } of asks) {
        const content = [...(image === undefined ? [] : [{ type: "image" }]), { type: "text", text }]
        const prompt = (
          tokenizer.apply_chat_template([{ role: "user", content }] as never, {
            add_generation_prompt: true,
            tokenize: false
          }) as string
        ).replace("<image>", "<image>".repeat(imageTokens))
        const inputs = tokenizer(prompt)
        const pixels =
          image === undefined
            ? {}
            : await processor(await RawImage.fromBlob(new Blob([new Uint8Array(images.get(image)!)])))
        const output = (await vlm.generate({
          ...inputs,
          ...pixels,
          max_new_tokens: maxTokens,
          do_sample: false
        })) as Tensor
        const ids = Array.from(output.data as BigInt64Array, Number).slice((inputs.input_ids as Tensor).dims[1]!)
        answers.push(tokenizer.decode(ids, { skip_special_tokens: true }))
      }
      return answers
    } finally {
      await vlm.dispose()
    }
  }

  it("answers images of awkward sizes as transformers.js does, with encoder fission and without", async () => {
    const question = "What is in this image"
    const names = Object.keys(sizes)
    const expected = await references(names.map((image) => ({ image, text: question })))
    // Something to compare: answers that differ by image, and say something.
    expect(new Set(expected).size).toBeGreaterThan(1)
    for (const [index, name] of names.entries()) {
      expect(expected[index]!.length).toBeGreaterThan(0)
      for (const app of ["llava_local", "llava_fission"])
        expect(await ask(app, [imagePart(name), { type: "text", text: question }]), `${app}, ${name}`).toBe(
          expected[index]
        )
    }
  })

  it("gives each request its own answer in a batch of image and text-only requests", async () => {
    const question = "Describe the picture"
    const names = ["wide", "tall"]
    const texts = ["Hello", "What is in this image? Describe the picture in a few words"]
    const expected = await references([
      ...names.map((image) => ({ image, text: question })),
      ...texts.map((text) => ({ text }))
    ])
    for (const app of ["llava_local", "llava_fission"]) {
      const answers = await Promise.all([
        ...names.map((name) => ask(app, [imagePart(name), { type: "text", text: question }])),
        ...texts.map((text) => ask(app, [{ type: "text", text }]))
      ])
      expect(answers, app).toEqual(expected)
    }
  })

  it("refuses an image that is not one, with a 400", async () => {
    const client = new OpenAI({ baseURL: `${platform.url}/app/llava_fission/v1`, apiKey: "unused", maxRetries: 0 })
    const refused = async (part: unknown) =>
      client.chat.completions
        .create({ model, messages: [{ role: "user", content: [part] as never }], max_tokens: 2 })
        .then(() => undefined)
        .catch((caught: unknown) => caught as { status?: number; message?: string })
    const broken = await refused({
      type: "image_url",
      image_url: { url: `data:image/png;base64,${Buffer.from("nope").toString("base64")}` }
    })
    expect(broken?.status).toBe(400)
  })
})
