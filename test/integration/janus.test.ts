import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { AutoProcessor, MultiModalityCausalLM, type Processor, type RawImage } from "@huggingface/transformers"
import OpenAI from "openai"
import sharp from "sharp"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { janusTokens, tinyJanus } from "../../src/models/recipes/RandomJanus.js"
import { writeModelFiles } from "../models/support/SmolVlmFixture.js"
import { offline } from "../models/support/TransformersJs.js"
import { invoke, type RunningPlatform, repoRoot, runCli, startPlatform } from "../support/platform.js"

/**
 * Janus-Pro text to image through the real binary and OpenAI's client: examples/janus.ts (the LLM
 * executor's image tokens, decoded by Geri, on the built-in cornserve/tiny-janus) answers
 * `/v1/images/generations` with the pixels transformers.js's `generate_images` paints for the same
 * prompt, concurrent requests as alone; text chat on the Janus LLM is refused, saying why.
 */

const prompts = ["A red fox in the sky", "A blue house with a tree", "the green cat"]

/** The bytes of a PNG the platform answered, channels last, and its size. */
const pixelsOf = async (base64: string) => {
  const { data, info } = await sharp(Buffer.from(base64, "base64")).raw().toBuffer({ resolveWithObject: true })
  return { data, width: info.width, height: info.height, channels: info.channels }
}

describe("Janus-Pro text to image end to end", () => {
  let root: string
  let platform: RunningPlatform
  let client: OpenAI
  const reference = new Map<string, RawImage>()

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-janus-e2e-"))
    const dir = join(root, "tiny-janus")
    await writeModelFiles(dir, tinyJanus.build())
    const processor: Processor = await AutoProcessor.from_pretrained(offline(dir))
    const model = (await MultiModalityCausalLM.from_pretrained(offline(dir), {
      dtype: "fp32"
    })) as MultiModalityCausalLM
    try {
      for (const prompt of prompts) {
        const inputs = await processor([{ role: janusTokens.user, content: prompt }], {
          chat_template: "text_to_image"
        })
        const count = 16
        const [image] = await model.generate_images({
          ...inputs,
          min_new_tokens: count,
          max_new_tokens: count,
          do_sample: false
        })
        reference.set(prompt, image!)
      }
    } finally {
      await model.dispose()
    }
    platform = await startPlatform()
    for (const app of [
      join(repoRoot, "examples", "janus.ts"),
      join(repoRoot, "test", "fixtures", "apps", "janus_chat.ts")
    ]) {
      const registered = await runCli(["app", "register", app], { CORNSERVE_GATEWAY_URL: platform.url })
      expect(registered.code, registered.stderr).toBe(0)
    }
    client = new OpenAI({ baseURL: `${platform.url}/app/janus/v1`, apiKey: "unused", maxRetries: 0 })
  }, 240_000)

  afterAll(async () => {
    await platform?.stop()
    await rm(root, { recursive: true, force: true })
  })

  const paint = async (prompt: string, extra: Record<string, unknown> = {}) => {
    const answer = await client.images.generate({ prompt, ...extra } as never)
    return Promise.all(answer.data!.map((image) => pixelsOf(image.b64_json!)))
  }

  const expectReference = (image: Awaited<ReturnType<typeof pixelsOf>>, prompt: string) => {
    const expected = reference.get(prompt)!
    expect([image.width, image.height, image.channels]).toEqual([expected.width, expected.height, 3])
    expect(image.data.equals(Buffer.from(expected.data)), prompt).toBe(true)
  }

  it("paints the pixels transformers.js's generate_images paints for the prompt", async () => {
    for (const prompt of prompts) {
      const [image] = await paint(prompt)
      expectReference(image!, prompt)
    }
    const [fox] = await paint(prompts[0]!)
    const [house] = await paint(prompts[1]!)
    expect(fox!.data.equals(house!.data)).toBe(false)
  })

  it("answers concurrent requests as alone", async () => {
    const answers = await Promise.all([...prompts, ...prompts].map((prompt) => paint(prompt)))
    answers.forEach(([image], index) => expectReference(image!, prompts[index % prompts.length]!))
  })

  it("resizes to the size asked for, and draws seeded images the same every time", async () => {
    const [small] = await paint(prompts[0]!, { size: "32x48" })
    expect([small!.width, small!.height]).toEqual([32, 48])
    const seeded = await paint(prompts[0]!, { seed: 11, n: 2 })
    const again = await paint(prompts[0]!, { seed: 11, n: 2 })
    expect(seeded.map((image) => image.data.toString("base64"))).toEqual(
      again.map((image) => image.data.toString("base64"))
    )
    expect(seeded[0]!.data.equals(seeded[1]!.data)).toBe(false)
  })

  it("refuses text chat on the Janus LLM, saying why", async () => {
    const response = await invoke(platform.url, "janus_chat", JSON.stringify({ question: "What is this?" }))
    const body = (await response.json()) as { error: { message: string } }
    expect(response.status, JSON.stringify(body)).toBe(400)
    expect(body.error.message).toContain("served for image generation only")
  })
})
