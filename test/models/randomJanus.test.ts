import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import {
  AutoProcessor,
  BaseStreamer,
  MultiModalityCausalLM,
  type Processor,
  RawImage,
  type Tensor
} from "@huggingface/transformers"
import * as ort from "onnxruntime-node"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { janusImageSide, janusImageSize } from "../../src/models/architectures/Janus.js"
import { janusTokens, type RandomJanus, randomJanusFiles, tinyJanus } from "../../src/models/recipes/RandomJanus.js"
import { writeModelFiles } from "./support/SmolVlmFixture.js"
import { offline } from "./support/TransformersJs.js"

/**
 * The random Janus-Pro loaded by transformers.js, the reference: its six sessions have the
 * export's inputs and outputs, `generate_images` writes images of the configured size from image
 * tokens that depend on the prompt, and `generate` writes text, with or without an image.
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

type Session = ort.InferenceSession

describe("random Janus-Pro in transformers.js", () => {
  let root: string
  let modelDir: string
  let built: RandomJanus
  let processor: Processor
  let model: MultiModalityCausalLM

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-janus-"))
    modelDir = join(root, "tiny-janus")
    built = randomJanusFiles({ seed: 1 })
    await writeModelFiles(modelDir, built.files)
    processor = await AutoProcessor.from_pretrained(offline(modelDir))
    model = (await MultiModalityCausalLM.from_pretrained(offline(modelDir), {
      dtype: "fp32"
    })) as MultiModalityCausalLM
  }, 60_000)

  afterAll(async () => {
    await model?.dispose()
    await rm(root, { recursive: true, force: true })
  })

  const session = (name: string) => (model.sessions as Record<string, Session>)[name]!

  it("has the export's six sessions with their input and output names", () => {
    const layers = built.config.language.layers
    const cache = (prefix: string) =>
      Array.from({ length: layers }, (_, i) => [`${prefix}.${i}.key`, `${prefix}.${i}.value`]).flat()
    // transformers.js keys the language model's session "model" (onnx/language_model.onnx).
    const expected: Record<string, { inputs: Array<string>; outputs: Array<string> }> = {
      prepare_inputs_embeds: {
        inputs: ["input_ids", "pixel_values", "images_seq_mask", "images_emb_mask"],
        outputs: ["inputs_embeds"]
      },
      model: {
        inputs: ["inputs_embeds", "attention_mask", "position_ids", ...cache("past_key_values")],
        outputs: [...cache("present"), "last_hidden_state"]
      },
      lm_head: { inputs: ["last_hidden_state"], outputs: ["logits"] },
      gen_head: { inputs: ["last_hidden_state"], outputs: ["logits"] },
      gen_img_embeds: { inputs: ["image_ids"], outputs: ["inputs_embeds"] },
      image_decode: { inputs: ["generated_tokens"], outputs: ["decoded_image"] }
    }
    expect(Object.keys(model.sessions).sort()).toEqual(Object.keys(expected).sort())
    for (const [name, names] of Object.entries(expected)) {
      expect([name, session(name).inputNames]).toEqual([name, names.inputs])
      expect([name, session(name).outputNames]).toEqual([name, names.outputs])
    }
  })

  const imagePrompt = (prompt: string) =>
    processor([{ role: janusTokens.user, content: prompt }], { chat_template: "text_to_image" })

  const promptText = (inputs: Record<string, unknown>) =>
    processor.tokenizer!.decode(Array.from((inputs.input_ids as Tensor).data as BigInt64Array, Number))

  it("renders Janus's prompts: the conversation, and the image prompt opening an image", async () => {
    const { beginOfSentence, user, assistant, beginOfImage } = janusTokens
    expect(promptText(await imagePrompt("A red fox"))).toBe(
      `${beginOfSentence}${user}: A red fox\n\n${assistant}:${beginOfImage}`
    )
    expect(promptText(await processor([{ role: user, content: "Describe a red fox" }]))).toBe(
      `${beginOfSentence}${user}: Describe a red fox\n\n${assistant}:`
    )
  })

  const generateImage = async (prompt: string) => {
    const inputs = await imagePrompt(prompt)
    const recorder = new TokenRecorder()
    const count = built.config.imageTokens
    const images = await model.generate_images({
      ...inputs,
      min_new_tokens: count,
      max_new_tokens: count,
      do_sample: false,
      streamer: recorder
    })
    return { images, tokens: recorder.tokens }
  }

  /** What generate_images does with image_decode's output: [-1, 1] to bytes, channels last. */
  const decodeToBytes = async (tokens: ReadonlyArray<number>) => {
    const { decoded_image } = await session("image_decode").run({
      generated_tokens: new ort.Tensor("int64", BigInt64Array.from(tokens, BigInt), [1, tokens.length])
    })
    const [, channels, height, width] = decoded_image!.dims as [number, number, number, number]
    const values = decoded_image!.data as Float32Array
    const bytes = new Uint8Array(channels * height * width)
    for (let c = 0; c < channels; c++) {
      for (let p = 0; p < height * width; p++) {
        bytes[p * channels + c] = Math.min(255, Math.max(0, ((values[c * height * width + p]! + 1) * 255) / 2))
      }
    }
    return { bytes, values }
  }

  it("generates images from image tokens that depend on the prompt", async () => {
    const side = janusImageSide(built.config)
    expect(side).toBe(64)
    const prompts = ["A red fox in the sky", "A blue house with a tree"]
    const results = []
    for (const prompt of prompts) results.push(await generateImage(prompt))
    for (const { images, tokens } of results) {
      expect(images).toHaveLength(1)
      const [image] = images
      expect([image!.width, image!.height, image!.channels]).toEqual([side, side, 3])
      expect(tokens).toHaveLength(built.config.imageTokens)
      for (const token of tokens) {
        expect(token).toBeGreaterThanOrEqual(0)
        expect(token).toBeLessThan(built.config.codebookSize)
      }
      expect(new Set(tokens).size).toBeGreaterThanOrEqual(6)
      // The observed tokens are the ones decoded: image_decode on them gives the returned pixels.
      const { bytes, values } = await decodeToBytes(tokens)
      expect(Math.max(...values.map(Math.abs))).toBeLessThanOrEqual(1)
      expect(Array.from(image!.data)).toEqual(Array.from(bytes))
    }
    expect(results[0]!.tokens).not.toEqual(results[1]!.tokens)
    expect(Array.from(results[0]!.images[0]!.data)).not.toEqual(Array.from(results[1]!.images[0]!.data))
  })

  const inputLength = (inputs: Record<string, unknown>) => (inputs.input_ids as Tensor).dims[1]!

  const generateText = async (inputs: Record<string, unknown>, count: number) => {
    const output = (await model.generate({ ...inputs, max_new_tokens: count, do_sample: false })) as Tensor
    return Array.from(output.data as BigInt64Array, Number).slice(inputLength(inputs))
  }

  it("writes text through the language head", async () => {
    const inputs = await processor([{ role: janusTokens.user, content: "Describe a red fox" }])
    const tokens = await generateText(inputs, 4)
    expect(tokens).toHaveLength(4)
    for (const token of tokens) expect(token).toBeLessThan(built.config.language.vocabSize)
  })

  const solidImage = (red: number, green: number, blue: number) => {
    const data = new Uint8ClampedArray(96 * 64 * 3)
    for (let i = 0; i < data.length; i += 3) data.set([red, green, blue], i)
    return new RawImage(data, 96, 64, 3)
  }

  it("writes an image's features at its placeholders and answers about it", async () => {
    const conversation = [
      { role: janusTokens.user, content: `${janusTokens.imagePlaceholder}\nWhat is in this image?` }
    ]
    const withImage = async (image: RawImage) => processor(conversation, { images: [image] })
    const [red, blue] = [await withImage(solidImage(200, 30, 30)), await withImage(solidImage(30, 30, 200))]
    const count = built.config.imageTokens
    expect((red.pixel_values as Tensor).dims).toEqual([1, 1, 3, janusImageSize, janusImageSize])
    expect((red.images_emb_mask as Tensor).dims).toEqual([1, 1, count])

    const embeds = async (inputs: Record<string, unknown>) => {
      const feeds = Object.fromEntries(
        ["input_ids", "pixel_values", "images_seq_mask", "images_emb_mask"].map((name) => [
          name,
          (inputs[name] as { ort_tensor: ort.Tensor }).ort_tensor
        ])
      )
      const { inputs_embeds } = await session("prepare_inputs_embeds").run(feeds)
      return inputs_embeds!.data as Float32Array
    }
    const hidden = built.config.language.hiddenSize
    const [redEmbeds, blueEmbeds] = [await embeds(red), await embeds(blue)]
    const mask = Array.from((red.images_seq_mask as Tensor).data as Uint8Array, Boolean)
    expect(mask.filter(Boolean)).toHaveLength(count)
    mask.forEach((isImage, position) => {
      const row = (of: Float32Array) => Array.from(of.subarray(position * hidden, (position + 1) * hidden))
      if (isImage) expect(row(redEmbeds)).not.toEqual(row(blueEmbeds))
      else expect(row(redEmbeds)).toEqual(row(blueEmbeds))
    })

    const tokens = await generateText(red, 3)
    expect(tokens).toHaveLength(3)
  })

  it("builds cornserve/tiny-janus in the same layout, stamped with its recipe", () => {
    const files = new Map(tinyJanus.build())
    expect([...files.keys()].sort()).toEqual([...built.files.keys()].sort())
    const config = JSON.parse(new TextDecoder().decode(files.get("config.json") as Uint8Array))
    expect(config.model_type).toBe("multi_modality")
    expect(config.cornserve).toEqual({ recipe: "cornserve/tiny-janus", version: 1 })
  })
})
