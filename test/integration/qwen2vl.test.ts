import { mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { AutoModelForImageTextToText, AutoProcessor, RawImage, type Tensor } from "@huggingface/transformers"
import OpenAI from "openai"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { mropePositions } from "../../src/models/MRope.js"
import {
  qwen2VLSpecialTokens,
  randomQwen2VLFiles,
  randomQwen2VLWeights
} from "../../src/models/recipes/RandomQwen2VL.js"
import { referenceQwen2VLGreedy } from "../models/support/Qwen2VLModelReference.js"
import { writeModelFiles } from "../models/support/SmolVlmFixture.js"
import { offline } from "../models/support/TransformersJs.js"
import { type RunningPlatform, runCli, startPlatform } from "../support/platform.js"
import { disaggregatedMllmAppSource } from "../support/disaggregatedApps.js"
import { gradientPng, mllmAppSource } from "../support/mllmApps.js"
import { ffmpegFile, rawInput } from "../support/videos.js"

/**
 * Qwen2-VL in the community's split layout (onnx-community/Qwen2-VL-2B-Instruct's tensor names),
 * served end to end by the real binary: the vision encoder in Eric with its features and patch
 * grid sent through the sidecar (encoder fission), or run by the LLM executor itself. Images of
 * several sizes and aspect ratios take as many patches as their area, their tokens M-RoPE
 * positions; the answers are transformers.js's Qwen2VLForConditionalGeneration's, alone and in a
 * batch with text-only requests of other lengths. Text-only prompts follow transformers (Python),
 * whose decode positions transformers.js 4.3.1 gets wrong (see qwen2vlGraphs.test.ts): they are
 * checked against the float64 reference computation instead. Qwen2.5-VL's export differs in its
 * names (config.json's qwen2_5_vl, the encoder's image_grid_thw): served alike.
 */

const maxTokens = 8
const seed = 3

type Part =
  | { readonly type: "text"; readonly text: string }
  | { readonly type: "image_url"; readonly image_url: { readonly url: string } }
  | { readonly type: "video_url"; readonly video_url: { readonly url: string } }

describe("Qwen2-VL end to end", () => {
  let root: string
  let model: string
  let model25: string
  let platform: RunningPlatform
  const fixture = randomQwen2VLFiles({ seed })
  const fixture25 = randomQwen2VLFiles({ seed: seed + 1, family: "qwen2_5_vl" })
  const weights = randomQwen2VLWeights(fixture.config, seed)
  /** Wide, tall, square, and one with an edge under a patch (scaled up), each a different number of patches. */
  const sizes = { wide: [112, 42], tall: [40, 100], square: [70, 70], thin: [150, 20] } as const
  const images = new Map<string, Buffer>()

  // Starting the platform and three apps starts their executors: on two busy cores that can take longer
  // than the default hook limit.
  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-qwen2vl-"))
    model = join(root, "qwen2-vl-tiny")
    await writeModelFiles(model, fixture.files)
    model25 = join(root, "qwen2.5-vl-tiny")
    await writeModelFiles(model25, fixture25.files)
    for (const [name, [width, height]] of Object.entries(sizes)) images.set(name, await gradientPng(width, height))
    platform = await startPlatform({
      args: ["--devices", "cpu:0,cpu:1,cpu:2,cpu:3,cpu:4,cpu:5", "--model-root", root]
    })
    for (const [name, path, fission] of [
      ["qwen2vl_fission", model, true],
      ["qwen2vl_local", model, false],
      ["qwen25vl_fission", model25, true]
    ] as const) {
      const file = join(root, `${name}.ts`)
      await writeFile(file, mllmAppSource(path, ["image", "video"], fission))
      const registered = await runCli(["app", "register", file], { CORNSERVE_GATEWAY_URL: platform.url })
      expect(registered.code, registered.stderr).toBe(0)
    }
    // Prefill and decode apart: the image's features and patch grid go on from the prefill executor to the decode one.
    const apart = join(root, "qwen2vl_apart.ts")
    await writeFile(apart, disaggregatedMllmAppSource(model, "DisaggregatedMLLMTask", ["image", "video"]))
    const registered = await runCli(["app", "register", apart], { CORNSERVE_GATEWAY_URL: platform.url })
    expect(registered.code, registered.stderr).toBe(0)
  }, 240_000)

  afterAll(async () => {
    await platform?.stop()
    await rm(root, { recursive: true, force: true })
  })

  const ask = async (app: string, content: ReadonlyArray<Part> | string, extra: Record<string, unknown> = {}) => {
    const client = new OpenAI({ baseURL: `${platform.url}/app/${app}/v1`, apiKey: "unused" })
    const completion = await client.chat.completions.create({
      model: app.startsWith("qwen25") ? model25 : model,
      messages: [{ role: "user", content: content as never }],
      max_tokens: maxTokens,
      temperature: 0,
      ...extra
    })
    return completion.choices[0]!.message.content!
  }

  const imagePart = (name: string): Part => ({
    type: "image_url",
    image_url: { url: `data:image/png;base64,${images.get(name)!.toString("base64")}` }
  })

  /** transformers.js's greedy answers to the question about each image. */
  const references = async (
    names: ReadonlyArray<string>,
    question: string,
    directory = model,
    bounds?: { readonly min_pixels: number; readonly max_pixels: number }
  ): Promise<Map<string, string>> => {
    const id = offline(directory)
    const processor = await AutoProcessor.from_pretrained(id)
    if (bounds !== undefined) Object.assign(processor.image_processor!, bounds)
    const vlm = await AutoModelForImageTextToText.from_pretrained(id, { dtype: "fp32" })
    const answers = new Map<string, string>()
    try {
      const prompt = processor.apply_chat_template(
        [{ role: "user", content: [{ type: "image" }, { type: "text", text: question }] }],
        { add_generation_prompt: true }
      ) as string
      for (const name of names) {
        const inputs = await processor(prompt, await RawImage.fromBlob(new Blob([images.get(name)!])))
        const output = (await vlm.generate({
          ...inputs,
          max_new_tokens: maxTokens,
          do_sample: false
        })) as Tensor
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
    const pads = {
      imagePad: fixture.tokenId(qwen2VLSpecialTokens.imagePad),
      videoPad: fixture.tokenId(qwen2VLSpecialTokens.videoPad)
    }
    const { positions, delta } = mropePositions(ids, pads, { images: [], videos: [] }, 2)
    const tokens = referenceQwen2VLGreedy(weights.text, ids, new Set(), [], positions, delta, maxTokens)
    const eos = [qwen2VLSpecialTokens.imEnd, qwen2VLSpecialTokens.endOfText].map(fixture.tokenId)
    const end = tokens.findIndex((token) => eos.includes(token))
    return processor.tokenizer!.decode(end < 0 ? tokens : tokens.slice(0, end), { skip_special_tokens: true })
  }

  it("answers images of several sizes as transformers.js does, with encoder fission and without, and with prefill and decode apart", async () => {
    const question = "What is in this image"
    const expected = await references(Object.keys(sizes), question)
    expect(new Set(expected.values()).size).toBeGreaterThan(1)
    for (const [name, answer] of expected) {
      expect(answer.length).toBeGreaterThan(0)
      for (const app of ["qwen2vl_local", "qwen2vl_fission", "qwen2vl_apart"]) {
        expect(await ask(app, [imagePart(name), { type: "text", text: question }]), `${app}, ${name}`).toBe(answer)
      }
    }
  })

  it("gives each request its own answer in a batch of image and text-only requests of different lengths", async () => {
    const question = "Describe the picture"
    const expected = await references(["wide", "tall", "thin"], question)
    const texts = ["Hello", "What is in this image? Describe the picture"]
    const textExpected = await Promise.all(texts.map(textReference))
    for (const app of ["qwen2vl_local", "qwen2vl_fission"]) {
      const answers = await Promise.all([
        ...["wide", "tall", "thin"].map((name) => ask(app, [imagePart(name), { type: "text", text: question }])),
        ...texts.map((text) => ask(app, text))
      ])
      expect(answers, app).toEqual([...expected.values(), ...textExpected])
    }
  })

  // The vision encoder's grid input is found by name in Eric and in the LLM executor alike (Sessions.ts).
  it("serves Qwen2.5-VL's export (image_grid_thw) as transformers.js's Qwen2_5_VLForConditionalGeneration answers", async () => {
    const question = "What is in this image"
    const expected = await references(["wide", "thin"], question, model25)
    for (const [name, answer] of expected) {
      expect(answer.length).toBeGreaterThan(0)
      for (const app of ["qwen25vl_fission"]) {
        expect(await ask(app, [imagePart(name), { type: "text", text: question }]), `${app}, ${name}`).toBe(answer)
      }
    }
  })

  it("follows the request's mm_processor_kwargs as transformers.js's processor with those bounds, and refuses bounds over the model's", async () => {
    const question = "What is in this image"
    const bounds = { min_pixels: 28 * 28, max_pixels: 28 * 28 * 4 }
    const expected = await references(["wide", "square"], question, model, bounds)
    const unbounded = await references(["wide", "square"], question)
    expect([...expected.values()]).not.toEqual([...unbounded.values()])
    for (const [name, answer] of expected) {
      for (const app of ["qwen2vl_local", "qwen2vl_fission"]) {
        const content = [imagePart(name), { type: "text", text: question } as const]
        expect(await ask(app, content, { mm_processor_kwargs: bounds }), `${app}, ${name}`).toBe(answer)
      }
    }
    for (const app of ["qwen2vl_local", "qwen2vl_fission"]) {
      const refused = await ask(app, [imagePart("wide")], { mm_processor_kwargs: { max_pixels: 10 ** 8 } }).catch(
        (error: { status?: number; message?: string }) => error
      )
      expect((refused as { status?: number }).status, app).toBe(400)
      expect((refused as { message?: string }).message).toMatch(/max_pixels is 100000000; this model takes at most/)
    }
  })

  it("answers a video (an mp4 made with ffmpeg) alike with and without encoder fission, and refuses broken ones", async () => {
    // 2 s at 6 fps of moving colour: sampled at 2 fps, 4 frames in 2 temporal patches.
    const width = 56
    const height = 42
    const frames = Buffer.alloc(12 * width * height * 3)
    for (let f = 0; f < 12; f++) {
      for (let p = 0; p < width * height; p++) {
        frames.set([(f * 20 + p) % 256, (p * 3) % 256, (f * 50) % 256], (f * width * height + p) * 3)
      }
    }
    const mp4 = await ffmpegFile(
      [...rawInput(width, height, 6), "-c:v", "libx264", "-pix_fmt", "yuv444p", "-qp", "0"],
      "mp4",
      frames
    )
    const video = (bytes: Buffer, mime = "video/mp4"): Part => ({
      type: "video_url",
      video_url: { url: `data:${mime};base64,${bytes.toString("base64")}` }
    })
    const question = { type: "text", text: "Describe the picture" } as const
    const local = await ask("qwen2vl_local", [video(mp4), question])
    expect(local.length).toBeGreaterThan(0)
    expect(await ask("qwen2vl_fission", [video(mp4), question])).toBe(local)
    // The video reaches the model: an image in its place gets another answer.
    expect(await ask("qwen2vl_local", [imagePart("square"), question])).not.toBe(local)

    const client = new OpenAI({ baseURL: `${platform.url}/app/qwen2vl_local/v1`, apiKey: "unused", maxRetries: 0 })
    const refused = async (content: ReadonlyArray<Part>) => {
      const error = await client.chat.completions
        .create({ model, messages: [{ role: "user", content: content as never }], max_tokens: 2 })
        .then(() => undefined)
        .catch((caught: unknown) => caught as { status?: number; message?: string })
      expect(error, "refused").toBeDefined()
      return error!
    }
    const truncated = await refused([video(mp4.subarray(0, Math.floor(mp4.length / 2))), question])
    expect(truncated.status).toBe(400)
    expect(truncated.message).toMatch(/video/)
    const noise = Buffer.concat([mp4.subarray(0, 12), Buffer.alloc(4000, 7)])
    expect((await refused([video(noise), question])).status).toBe(400)
    const notAVideo = await refused([video(images.get("square")!, "video/mp4"), question])
    expect(notAVideo.status).toBe(400)
    expect(notAVideo.message).toMatch(/mp4, mov or webm/)
  })
})
