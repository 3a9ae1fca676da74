import { mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { AutoModelForImageTextToText, AutoProcessor, RawImage, type Tensor } from "@huggingface/transformers"
import OpenAI from "openai"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { mropePositions } from "../../src/models/MRope.js"
import { qwen2VLSpecialTokens } from "../../src/models/recipes/RandomQwen2VL.js"
import { randomQwen3VLFiles, randomQwen3VLWeights } from "../../src/models/recipes/RandomQwen3VL.js"
import { referenceQwen3VLGreedy } from "../models/support/Qwen3VLModelReference.js"
import { writeModelFiles } from "../models/support/SmolVlmFixture.js"
import { offline } from "../models/support/TransformersJs.js"
import { gradientPng, mllmAppSource } from "../support/mllmApps.js"
import { type RunningPlatform, runCli, startPlatform } from "../support/platform.js"
import { ffmpegFile, rawInput } from "../support/videos.js"

/**
 * Qwen3-VL in the community's split layout (onnx-community/Qwen3-VL-2B-Instruct-ONNX's names), on
 * a random-weight fixture of the project's recipe (16-pixel patches, interpolated learned
 * positions, interleaved M-RoPE, q/k norms), served end to end by the real binary: the vision
 * encoder in Eric with its features and patch grid sent through the sidecar (encoder fission), or
 * run by the LLM executor itself. Images of awkward sizes take as many patches as their area
 * within the bounds; the answers are transformers.js's Qwen3VLForConditionalGeneration's, alone
 * and in a batch with text-only requests, whose answers follow transformers (Python) as
 * qwen2vl.test.ts explains. Videos are refused, saying why (VisionProcessor.ts).
 */

const maxTokens = 8
const seed = 4

type Part =
  | { readonly type: "text"; readonly text: string }
  | { readonly type: "image_url"; readonly image_url: { readonly url: string } }
  | { readonly type: "video_url"; readonly video_url: { readonly url: string } }

describe("Qwen3-VL end to end", () => {
  let root: string
  let model: string
  let platform: RunningPlatform
  const fixture = randomQwen3VLFiles({ seed })
  const weights = randomQwen3VLWeights(fixture.config, seed)
  /** Wider than tall, taller than wide, under a patch (16), over the maximum area (24,576 pixels). */
  const sizes = { wide: [150, 40], tall: [40, 130], tiny: [9, 5], large: [400, 300] } as const
  const images = new Map<string, Buffer>()
  const apps = ["qwen3vl_local", "qwen3vl_fission"] as const

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-qwen3vl-"))
    model = join(root, "qwen3-vl-tiny")
    await writeModelFiles(model, fixture.files)
    for (const [name, [width, height]] of Object.entries(sizes)) images.set(name, await gradientPng(width, height))
    platform = await startPlatform({ args: ["--devices", "cpu:0,cpu:1,cpu:2,cpu:3", "--model-root", root] })
    for (const [name, fission] of [
      ["qwen3vl_local", false],
      ["qwen3vl_fission", true]
    ] as const) {
      const file = join(root, `${name}.ts`)
      await writeFile(file, mllmAppSource(model, ["image", "video"], fission))
      const registered = await runCli(["app", "register", file], { CORNSERVE_GATEWAY_URL: platform.url })
      expect(registered.code, registered.stderr).toBe(0)
    }
  }, 240_000)

  afterAll(async () => {
    await platform?.stop()
    if (root !== undefined) await rm(root, { recursive: true, force: true })
  })

  const client = (app: string) =>
    new OpenAI({ baseURL: `${platform.url}/app/${app}/v1`, apiKey: "unused", maxRetries: 0 })

  const ask = async (app: string, content: ReadonlyArray<Part> | string) => {
    const completion = await client(app).chat.completions.create({
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
        const inputs = await processor(prompt, await RawImage.fromBlob(new Blob([images.get(name)!])))
        const output = (await vlm.generate({ ...inputs, max_new_tokens: maxTokens, do_sample: false })) as Tensor
        const length = (inputs.input_ids as Tensor).dims[1]!
        const generated = Array.from(output.data as BigInt64Array, Number).slice(length)
        answers.set(name, processor.tokenizer!.decode(generated, { skip_special_tokens: true }))
      }
    } finally {
      await vlm.dispose()
    }
    return answers
  }

  /** The answer transformers (Python) gives a text-only chat: the reference computation at delta 0. */
  const textReference = async (text: string): Promise<string> => {
    const processor = await AutoProcessor.from_pretrained(offline(model))
    const prompt = processor.apply_chat_template([{ role: "user", content: [{ type: "text", text }] }], {
      add_generation_prompt: true
    }) as string
    const ids = Array.from((processor.tokenizer!(prompt).input_ids as Tensor).data as BigInt64Array, Number)
    const imagePad = fixture.tokenId(qwen2VLSpecialTokens.imagePad)
    const pads = { imagePad, videoPad: fixture.tokenId(qwen2VLSpecialTokens.videoPad) }
    const { positions, delta } = mropePositions(ids, pads, { images: [], videos: [] }, 2)
    const tokens = referenceQwen3VLGreedy(weights.text, ids, imagePad, new Float64Array(0), positions, delta, maxTokens)
    const eos = [qwen2VLSpecialTokens.imEnd, qwen2VLSpecialTokens.endOfText].map(fixture.tokenId)
    const end = tokens.findIndex((token) => eos.includes(token))
    return processor.tokenizer!.decode(end < 0 ? tokens : tokens.slice(0, end), { skip_special_tokens: true })
  }

  it("answers images of awkward sizes as transformers.js does, with encoder fission and without", async () => {
    const question = "What is in this image"
    const expected = await references(Object.keys(sizes), question)
    expect(new Set(expected.values()).size).toBeGreaterThan(1)
    for (const [name, answer] of expected) {
      expect(answer.length).toBeGreaterThan(0)
      for (const app of apps)
        expect(await ask(app, [imagePart(name), { type: "text", text: question }]), `${app}, ${name}`).toBe(answer)
    }
  })

  it("gives each request its own answer in a batch of image and text-only requests of different lengths", async () => {
    const question = "Describe the picture"
    const names = ["wide", "tall", "large"]
    const expected = await references(names, question)
    const texts = ["Hello", "What is in this image? Describe the picture"]
    const textExpected = await Promise.all(texts.map(textReference))
    for (const app of apps) {
      const answers = await Promise.all([
        ...names.map((name) => ask(app, [imagePart(name), { type: "text", text: question }])),
        ...texts.map((text) => ask(app, text))
      ])
      expect(answers, app).toEqual([...names.map((name) => expected.get(name)), ...textExpected])
    }
  })

  it("refuses a video with and without encoder fission, saying why", async () => {
    const [width, height] = [64, 48]
    const frames = Buffer.alloc(4 * width * height * 3)
    for (let at = 0; at < frames.length; at++) frames[at] = (at * 7) % 256
    const mp4 = await ffmpegFile(
      [...rawInput(width, height, 2), "-c:v", "libx264", "-pix_fmt", "yuv444p"],
      "mp4",
      frames
    )
    const content: ReadonlyArray<Part> = [
      { type: "video_url", video_url: { url: `data:video/mp4;base64,${mp4.toString("base64")}` } },
      { type: "text", text: "Describe the picture" }
    ]
    for (const app of apps) {
      const refused = await client(app)
        .chat.completions.create({ model, messages: [{ role: "user", content: content as never }], max_tokens: 2 })
        .then(() => undefined)
        .catch((caught: unknown) => caught as { status?: number; message?: string })
      expect(refused, app).toBeDefined()
      expect(refused!.status, app).toBe(400)
      expect(refused!.message, app).toMatch(
        app === "qwen3vl_local" ? /not videos.*timestamp/ : /takes image; .* is video/
      )
    }
  })
})
