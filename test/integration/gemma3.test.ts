import { mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import {
  AutoModelForCausalLM,
  AutoModelForImageTextToText,
  AutoProcessor,
  AutoTokenizer,
  RawImage,
  type Tensor
} from "@huggingface/transformers"
import OpenAI from "openai"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { randomGemma3 } from "../../src/models/recipes/RandomGemma3.js"
import { writeModelFiles } from "../models/support/SmolVlmFixture.js"
import { offline } from "../models/support/TransformersJs.js"
import { gradientPng, mllmAppSource } from "../support/mllmApps.js"
import { type RunningPlatform, runCli, startPlatform } from "../support/platform.js"

/**
 * Gemma 3 (image and text) in the split layout transformers.js runs, on a random-weight fixture of
 * the project's recipe (a SigLIP tower with Gemma 3's projector, a decoder whose sliding-window
 * layers attend to 8 positions, positions counted from 1), served end to end by the real binary:
 * the vision encoder in Eric with its soft tokens sent through the sidecar (encoder fission), or
 * run by the LLM executor itself. Each image is resized to the processor's size, whatever its own;
 * the answers are transformers.js's Gemma3ForConditionalGeneration's (and, for text alone,
 * Gemma3ForCausalLM's), alone and in a batch of image and text-only requests of other lengths.
 */

const maxTokens = 8

type Part =
  | { readonly type: "text"; readonly text: string }
  | { readonly type: "image_url"; readonly image_url: { readonly url: string } }

describe("Gemma 3 end to end", () => {
  let root: string
  let model: string
  let platform: RunningPlatform
  const fixture = randomGemma3({ seed: 5 })
  /** Wider than tall, taller than wide, under a patch (14), larger than the size (56), and the size itself. */
  const sizes = { wide: [112, 42], tall: [40, 100], tiny: [9, 5], large: [150, 120], exact: [56, 56] } as const
  const images = new Map<string, Buffer>()

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-gemma3-"))
    model = join(root, "gemma-3-tiny")
    await writeModelFiles(model, fixture.files)
    for (const [name, [width, height]] of Object.entries(sizes)) images.set(name, await gradientPng(width, height))
    platform = await startPlatform({ args: ["--devices", "cpu:0,cpu:1,cpu:2,cpu:3", "--model-root", root] })
    for (const [name, fission] of [
      ["gemma3_fission", true],
      ["gemma3_local", false]
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

  const decoded = (output: Tensor, promptLength: number, decode: (ids: Array<number>) => string) =>
    decode(Array.from(output.data as BigInt64Array, Number).slice(promptLength))

  /** transformers.js's greedy answers to the question about each image. */
  const references = async (names: ReadonlyArray<string>, question: string): Promise<Map<string, string>> => {
    const id = offline(model)
    const processor = await AutoProcessor.from_pretrained(id)
    const vlm = await AutoModelForImageTextToText.from_pretrained(id, { dtype: "fp32" })
    const answers = new Map<string, string>()
    try {
      const prompt = processor.apply_chat_template(
        [{ role: "user", content: [{ type: "image" }, { type: "text", text: question }] }],
        { add_generation_prompt: true }
      ) as string
      for (const name of names) {
        // The chat template writes the <bos>: the tokenizer must not add another.
        const inputs = await processor(prompt, await RawImage.fromBlob(new Blob([images.get(name)!])), {
          add_special_tokens: false
        })
        const output = (await vlm.generate({ ...inputs, max_new_tokens: maxTokens, do_sample: false })) as Tensor
        answers.set(
          name,
          decoded(output, (inputs.input_ids as Tensor).dims[1]!, (ids) =>
            processor.tokenizer!.decode(ids, { skip_special_tokens: true })
          )
        )
      }
    } finally {
      await vlm.dispose()
    }
    return answers
  }

  /** transformers.js's greedy answer to a text-only chat (Gemma3ForCausalLM: embed_tokens and the decoder). */
  const textReferences = async (texts: ReadonlyArray<string>): Promise<Array<string>> => {
    const id = offline(model)
    const tokenizer = await AutoTokenizer.from_pretrained(id)
    const lm = await AutoModelForCausalLM.from_pretrained(id, { dtype: "fp32" })
    try {
      const answers: Array<string> = []
      for (const text of texts) {
        const prompt = tokenizer.apply_chat_template([{ role: "user", content: [{ type: "text", text }] }], {
          add_generation_prompt: true,
          tokenize: false
        }) as string
        const inputs = tokenizer(prompt, { add_special_tokens: false })
        const output = (await lm.generate({ ...inputs, max_new_tokens: maxTokens, do_sample: false })) as Tensor
        answers.push(
          decoded(output, (inputs.input_ids as Tensor).dims[1]!, (ids) =>
            tokenizer.decode(ids, { skip_special_tokens: true })
          )
        )
      }
      return answers
    } finally {
      await lm.dispose()
    }
  }

  it("answers images of awkward sizes as transformers.js does, with encoder fission and without", async () => {
    const question = "What is in this image"
    const expected = await references(Object.keys(sizes), question)
    // Something to compare: answers that differ by image, and say something.
    expect(new Set(expected.values()).size).toBeGreaterThan(1)
    for (const [name, answer] of expected) {
      expect(answer.length).toBeGreaterThan(0)
      for (const app of ["gemma3_local", "gemma3_fission"])
        expect(await ask(app, [imagePart(name), { type: "text", text: question }]), `${app}, ${name}`).toBe(answer)
    }
  })

  it("gives each request its own answer in a batch of image and text-only requests of different lengths", async () => {
    const question = "Describe the picture"
    const names = ["wide", "tall", "large"]
    const expected = await references(names, question)
    // Prompts longer than the sliding window (8 positions), and of different lengths.
    const texts = ["Hello", "What is in this image? Describe the picture in a few words, please"]
    const textExpected = await textReferences(texts)
    for (const app of ["gemma3_local", "gemma3_fission"]) {
      const answers = await Promise.all([
        ...names.map((name) => ask(app, [imagePart(name), { type: "text", text: question }])),
        ...texts.map((text) => ask(app, text))
      ])
      expect(answers, app).toEqual([...names.map((name) => expected.get(name)), ...textExpected])
    }
  })

  it("keeps a client's own image marker as text, and refuses an image that is not one", async () => {
    const client = new OpenAI({ baseURL: `${platform.url}/app/gemma3_local/v1`, apiKey: "unused", maxRetries: 0 })
    // A marker typed by the client stays text: spelled out as an image's, it would be a marker
    // without an image, which is refused.
    const typed = await ask("gemma3_local", "<start_of_image> hello")
    expect(typeof typed).toBe("string")
    const broken = await client.chat.completions
      .create({
        model,
        messages: [
          {
            role: "user",
            content: [
              {
                type: "image_url",
                image_url: { url: `data:image/png;base64,${Buffer.from("nope").toString("base64")}` }
              }
            ]
          }
        ],
        max_tokens: 2
      })
      .then(() => undefined)
      .catch((caught: unknown) => caught as { status?: number; message?: string })
    expect(broken?.status).toBe(400)
  })
})
