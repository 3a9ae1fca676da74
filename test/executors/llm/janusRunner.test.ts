import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import {
  AutoProcessor,
  BaseStreamer,
  MultiModalityCausalLM,
  type Processor,
  type RawImage,
  type Tensor
} from "@huggingface/transformers"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { JanusDecoder } from "../../../src/executors/geri/JanusDecoder.js"
import { JanusRunner } from "../../../src/executors/llm/JanusRunner.js"
import type { SamplingParams } from "../../../src/executors/llm/protocol.js"
import { janusSpec } from "../../../src/models/JanusModel.js"
import { loadModelDirectory, type ModelDirectory } from "../../../src/models/ModelDirectory.js"
import { janusTokens, tinyJanus } from "../../../src/models/recipes/RandomJanus.js"
import { ChatTokenizer } from "../../../src/models/Tokenizer.js"
import { writeModelFiles } from "../../models/support/SmolVlmFixture.js"
import { offline } from "../../models/support/TransformersJs.js"
import { drive } from "../../support/driveRunner.js"

/**
 * Janus-Pro's image generation on the platform against transformers.js's `generate_images`, on the
 * built-in cornserve/tiny-janus: the LLM executor's JanusRunner chooses the same greedy image
 * tokens (classifier-free guidance over two rows, whoever shares its steps), and Geri's decoder
 * paints the same bytes from them.
 */

/** Records the tokens `generate` chooses; its first call carries the prompt, which it skips. */
class TokenRecorder extends BaseStreamer {
  readonly tokens: Array<number> = []
  private sawPrompt = false

  override put(value: Array<Array<bigint>>): void {
    if (!this.sawPrompt) {
      this.sawPrompt = true
      return
    }
    this.tokens.push(Number(value[0]![0]!))
  }

  override end(): void {}
}

const prompts = ["A red fox in the sky", "A blue house with a tree", "the green cat"]

describe("JanusRunner and JanusDecoder against transformers.js", () => {
  let root: string
  let model: ModelDirectory
  let reference: Array<{ readonly ids: Array<number>; readonly tokens: Array<number>; readonly image: RawImage }>
  let runner: JanusRunner

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-janus-runner-"))
    const dir = join(root, "tiny-janus")
    await writeModelFiles(dir, tinyJanus.build())
    model = await loadModelDirectory(dir)
    const processor: Processor = await AutoProcessor.from_pretrained(offline(dir))
    const transformers = (await MultiModalityCausalLM.from_pretrained(offline(dir), {
      dtype: "fp32"
    })) as MultiModalityCausalLM
    const count = janusSpec(model).imageTokens
    reference = []
    try {
      for (const prompt of prompts) {
        const inputs = await processor([{ role: janusTokens.user, content: prompt }], {
          chat_template: "text_to_image"
        })
        const recorder = new TokenRecorder()
        const [image] = await transformers.generate_images({
          ...inputs,
          min_new_tokens: count,
          max_new_tokens: count,
          do_sample: false,
          streamer: recorder
        })
        const ids = Array.from((inputs.input_ids as Tensor).data as BigInt64Array, Number)
        reference.push({ ids, tokens: recorder.tokens, image: image! })
      }
    } finally {
      await transformers.dispose()
    }
    runner = await JanusRunner.open(model, "cpu", 1)
  }, 120_000)

  afterAll(async () => {
    await runner?.close()
    await rm(root, { recursive: true, force: true })
  })

  const imageSampling = (): SamplingParams => ({
    temperature: 0,
    topP: 1,
    seed: 0,
    maxNewTokens: janusSpec(model).imageTokens,
    stopTokenIds: [],
    guidanceScale: janusSpec(model).guidanceScale!
  })

  const scripted = (index: number, joinAt: number) => ({
    id: `image-${index}`,
    prompt: { inputIds: Int32Array.from(reference[index]!.ids), media: [] },
    sampling: imageSampling(),
    joinAt
  })

  it("renders the image prompt with the text_to_image template as the processor does", () => {
    const tokenizer = new ChatTokenizer(model)
    prompts.forEach((prompt, index) => {
      const ids = tokenizer.encodeChat([{ role: janusTokens.user, content: prompt }], { template: "text_to_image" })
      expect(ids).toEqual(reference[index]!.ids)
    })
  })

  it("chooses transformers.js's greedy image tokens, one request at a time", async () => {
    expect(janusSpec(model).guidanceScale).toBe(5)
    for (const [index, { tokens }] of reference.entries()) {
      expect(tokens).toHaveLength(janusSpec(model).imageTokens)
      const generated = await drive(runner, [scripted(index, 0)])
      expect(generated.get(`image-${index}`)).toEqual(tokens)
    }
    expect(reference[0]!.tokens).not.toEqual(reference[1]!.tokens)
    expect(runner.held).toEqual([])
  })

  it("chooses the same tokens with other requests in flight, joining at other steps", async () => {
    const generated = await drive(runner, [scripted(0, 0), scripted(1, 3), scripted(2, 5)])
    reference.forEach(({ tokens }, index) => expect(generated.get(`image-${index}`)).toEqual(tokens))
  })

  it("decodes the tokens to transformers.js's pixels", async () => {
    const decoder = await JanusDecoder.open(model, "cpu", 1)
    try {
      const stacked = BigInt64Array.from(
        reference.flatMap(({ tokens }) => tokens),
        BigInt
      )
      const images = await decoder.decode(stacked, reference.length)
      images.forEach((image, index) => {
        const expected = reference[index]!.image
        expect([image.width, image.height, image.channels]).toEqual([expected.width, expected.height, 3])
        expect(Buffer.from(image.data).equals(Buffer.from(expected.data))).toBe(true)
      })
    } finally {
      await decoder.close()
    }
  })

  it("refuses prompt embeddings", async () => {
    const outputs = await runner.step(
      [
        {
          id: "embed",
          op: {
            op: "embed",
            prompt: { inputIds: Int32Array.of(1, 2), media: [] },
            id: "x",
            source: "embed_tokens",
            receivers: [],
            inline: true
          }
        }
      ],
      () => undefined
    )
    expect(outputs[0]).toEqual({ error: "a Janus model gives image tokens, not prompt embeddings" })
  })
})
