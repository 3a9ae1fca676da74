import {
  AutoModelForCausalLM,
  AutoModelForImageTextToText,
  AutoProcessor,
  AutoTokenizer,
  RawImage,
  type Tensor
} from "@huggingface/transformers"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as ort from "onnxruntime-node"
import sharp from "sharp"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { gemma3DecoderGraph } from "../../src/models/architectures/Gemma3.js"
import {
  gemma3ChatTemplate,
  gemma3SpecialTokens,
  type RandomGemma3,
  randomGemma3
} from "../../src/models/recipes/RandomGemma3.js"
import { writeModelBuild } from "../../src/models/recipes/Recipe.js"
import {
  referenceGemma3Embeddings,
  referenceGemma3Greedy,
  referenceGemma3ImageFeatures,
  referenceGemma3Logits
} from "./support/Gemma3ModelReference.js"
import { floatTensor, int64Tensor, numbers, relativeError, session } from "./support/Ort.js"
import { packagedTokenizerConfig } from "./support/tokenizerModels.js"
import { offline } from "./support/TransformersJs.js"

let root: string
let modelDir: string
let fixture: RandomGemma3

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "gemma3-graphs-"))
  modelDir = join(root, "gemma3-tiny")
  fixture = randomGemma3({ seed: 1 })
  await writeModelBuild(modelDir, fixture.files)
})

afterAll(async () => {
  await rm(root, { recursive: true, force: true })
})

const stems = ["vision_encoder", "embed_tokens", "decoder_model_merged"] as const

const sessions = () => Promise.all(stems.map((stem) => session(join(modelDir, "onnx", `${stem}.onnx`))))

const expectNear = (actual: ArrayLike<number>, expected: ArrayLike<number>, name: string) => {
  const error = relativeError(actual, expected)
  expect(error, `${name}: relative error ${error}`).toBeLessThanOrEqual(1e-5)
}

/** A PNG with a colour gradient, so that every patch differs. */
const gradientImage = async (width: number, height: number): Promise<RawImage> => {
  const data = new Uint8Array(width * height * 3)
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const i = (y * width + x) * 3
      data[i] = Math.round((255 * x) / (width - 1))
      data[i + 1] = Math.round((255 * y) / (height - 1))
      data[i + 2] = (x * 7 + y * 3) % 256
    }
  }
  const png = await sharp(data, { raw: { width, height, channels: 3 } })
    .png()
    .toBuffer()
  return RawImage.fromBlob(new Blob([new Uint8Array(png)]))
}

const ids = (tensor: unknown): Array<number> => Array.from((tensor as Tensor).data as BigInt64Array, Number)

const imageChat = () => [
  { role: "user", content: [{ type: "image" }, { type: "text", text: "What is in this image" }] }
]

/** The empty cache of the first step: every layer's keys and values, [1, kvHeads, 0, headDim]. */
const emptyCache = (): Record<string, ort.Tensor> => {
  const { layers, kvHeads, headDim } = fixture.config.text
  return Object.fromEntries(
    Array.from({ length: layers }, (_, i) =>
      ["key", "value"].map((kind) => [
        `past_key_values.${i}.${kind}`,
        floatTensor(new Float32Array(0), [1, kvHeads, 0, headDim])
      ])
    ).flat()
  )
}

const presentAsPast = (outputs: ort.InferenceSession.OnnxValueMapType): Record<string, ort.Tensor> =>
  Object.fromEntries(
    Object.entries(outputs)
      .filter(([name]) => name.startsWith("present."))
      .map(([name, value]) => [name.replace("present.", "past_key_values."), value as ort.Tensor])
  )

/** Runs a decoder on rows [from, to) of `embeds` after `past`, at positions counted from 1. */
const decode = (
  decoder: ort.InferenceSession,
  embeds: Float32Array,
  from: number,
  to: number,
  past: Record<string, ort.Tensor>
) => {
  const hidden = fixture.config.text.hiddenSize
  return decoder.run({
    inputs_embeds: floatTensor(embeds.slice(from * hidden, to * hidden), [1, to - from, hidden]),
    attention_mask: int64Tensor(new Array(to).fill(1), [1, to]),
    position_ids: int64Tensor(
      Array.from({ length: to - from }, (_, i) => from + i + 1),
      [1, to - from]
    ),
    ...past
  })
}

/** Seeded embedding rows [length, hidden] of size ~1, like scaled token embeddings. */
const syntheticEmbeds = (length: number): Float32Array =>
  Float32Array.from({ length: length * fixture.config.text.hiddenSize }, (_, i) => Math.sin(i * 0.731 + 0.2) * 1.3)

describe("a random Gemma 3 in the split layout", () => {
  it("has the input and output names transformers.js feeds and reads, and a cache of numeric heads and head size", async () => {
    const [vision, embed, decoder] = await sessions()
    try {
      expect(vision!.inputNames).toEqual(["pixel_values"])
      expect(vision!.outputNames).toEqual(["image_features"])
      expect(embed!.inputNames).toEqual(["input_ids"])
      expect(embed!.outputNames).toEqual(["inputs_embeds"])
      const { layers, kvHeads, headDim } = fixture.config.text
      const cache = (prefix: string) =>
        Array.from({ length: layers }, (_, i) => [`${prefix}.${i}.key`, `${prefix}.${i}.value`]).flat()
      expect(decoder!.inputNames).toEqual([
        "inputs_embeds",
        "attention_mask",
        "position_ids",
        ...cache("past_key_values")
      ])
      expect(decoder!.outputNames).toEqual(["logits", ...cache("present")])
      for (const meta of decoder!.inputMetadata.filter((m) => m.name.startsWith("past_key_values."))) {
        expect(meta.isTensor && meta.shape, meta.name).toEqual(["batch_size", kvHeads, "past_sequence_length", headDim])
      }
    } finally {
      await Promise.all([vision, embed, decoder].map((s) => s!.release()))
    }
  })

  it("writes config.json as Gemma3Config, every text_config field spelled out, and Gemma 3's chat template", async () => {
    const json = (file: string): unknown => JSON.parse(new TextDecoder().decode(fixture.files.get(file)!))
    const config = json("config.json")
    const { tokenId } = fixture
    expect(config).toMatchObject({
      model_type: "gemma3",
      architectures: ["Gemma3ForConditionalGeneration"],
      image_token_index: tokenId(gemma3SpecialTokens.imageSoftToken),
      boi_token_index: tokenId(gemma3SpecialTokens.startOfImage),
      eoi_token_index: tokenId(gemma3SpecialTokens.endOfImage),
      mm_tokens_per_image: 4,
      text_config: {
        model_type: "gemma3_text",
        vocab_size: fixture.config.text.vocabSize,
        hidden_size: 64,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 24,
        query_pre_attn_scalar: 20,
        sliding_window: 8,
        sliding_window_pattern: 3,
        layer_types: ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        rope_theta: 1000000,
        rope_local_base_freq: 10000,
        rope_scaling: { rope_type: "linear", factor: 8 },
        rms_norm_eps: 1e-6,
        max_position_embeddings: 512
      },
      vision_config: { model_type: "siglip_vision_model", image_size: 56, patch_size: 14 }
    })
    expect([tokenId("<pad>"), tokenId("<eos>"), tokenId("<bos>")]).toEqual([0, 1, 2])
    expect(json("generation_config.json")).toMatchObject({ eos_token_id: [1, tokenId(gemma3SpecialTokens.endOfTurn)] })
    expect(json("processor_config.json")).toEqual({ image_seq_length: 4, processor_class: "Gemma3Processor" })
    expect((await packagedTokenizerConfig("gemma3")).chat_template).toBe(gemma3ChatTemplate)
    expect(new TextDecoder().decode(fixture.files.get("chat_template.jinja"))).toBe(gemma3ChatTemplate)
  })

  it("encodes images as SigLIP's vision tower and Gemma 3's projector do, each image of a batch alone", async () => {
    const vision = await session(join(modelDir, "onnx", "vision_encoder.onnx"))
    try {
      const size = fixture.config.vision.imageSize
      const pixels = Float32Array.from({ length: 2 * 3 * size * size }, (_, i) => Math.sin(i * 0.37) * 0.9)
      const { image_features: features } = await vision.run({ pixel_values: floatTensor(pixels, [2, 3, size, size]) })
      expect(features!.dims).toEqual([2, 4, fixture.config.text.hiddenSize])
      const expected = referenceGemma3ImageFeatures(fixture.vision, pixels, 2)
      expectNear(numbers(features), expected, "image_features")
      const imageLength = 3 * size * size
      const alone = await vision.run({
        pixel_values: floatTensor(pixels.slice(imageLength), [1, 3, size, size])
      })
      expectNear(numbers(alone.image_features), expected.subarray(expected.length / 2), "the second image alone")
    } finally {
      await vision.release()
    }
  })

  it("embeds and decodes a chat with an image as modeling_gemma3 does, and the same through the cache", async () => {
    const processor = await AutoProcessor.from_pretrained(offline(modelDir))
    const prompt = processor.apply_chat_template(imageChat(), { add_generation_prompt: true }) as string
    const inputs = await processor(prompt, await gradientImage(70, 42), { add_special_tokens: false })
    const promptIds = ids(inputs.input_ids)
    const pixelValues = inputs.pixel_values as Tensor
    expect(pixelValues.dims).toEqual([1, 3, 56, 56])
    const hidden = fixture.config.text.hiddenSize
    const length = promptIds.length
    expect(length).toBeGreaterThan(2 * fixture.config.text.slidingWindow)

    const [vision, embed, decoder] = await sessions()
    try {
      const { image_features: features } = await vision!.run({
        pixel_values: floatTensor(pixelValues.data as Float32Array, pixelValues.dims)
      })
      expectNear(
        numbers(features),
        referenceGemma3ImageFeatures(fixture.vision, pixelValues.data as Float32Array, 1),
        "image_features of the processor's pixels"
      )

      const { inputs_embeds: textEmbeds } = await embed!.run({ input_ids: int64Tensor(promptIds, [1, length]) })
      expectNear(numbers(textEmbeds), referenceGemma3Embeddings(fixture.text, promptIds), "inputs_embeds")
      const embeds = Float32Array.from(numbers(textEmbeds))
      const imageToken = fixture.tokenId(gemma3SpecialTokens.imageSoftToken)
      const featureRows = Float32Array.from(numbers(features))
      let image = 0
      promptIds.forEach((id, row) => {
        if (id !== imageToken) return
        embeds.set(featureRows.subarray(image * hidden, (image + 1) * hidden), row * hidden)
        image++
      })
      expect(image).toBe(4)

      const whole = await decode(decoder!, embeds, 0, length, emptyCache())
      const reference = referenceGemma3Logits(
        fixture.text,
        Float64Array.from(embeds),
        promptIds.map((_, i) => i + 1)
      )
      expectNear(numbers(whole.logits), reference, "logits of the image chat")

      // The first five tokens, then the rest one at a time: every sliding layer's cache keeps growing.
      const vocab = fixture.config.text.vocabSize
      let outputs = await decode(decoder!, embeds, 0, 5, emptyCache())
      for (let at = 5; at < length; at++) {
        outputs = await decode(decoder!, embeds, at, at + 1, presentAsPast(outputs))
        expectNear(
          numbers(outputs.logits),
          numbers(whole.logits).subarray(at * vocab, (at + 1) * vocab),
          `logits of token ${at} through the cache`
        )
      }
      for (let i = 0; i < fixture.config.text.layers; i++) expect(outputs[`present.${i}.key`]!.dims[2]).toBe(length)
    } finally {
      await Promise.all([vision, embed, decoder].map((s) => s!.release()))
    }
  })

  it("attends within the sliding window on its sliding layers", async () => {
    const decoder = await session(join(modelDir, "onnx", "decoder_model_merged.onnx"))
    // The same layers, rotary bases included, with a window no prompt reaches: full attention everywhere.
    const unbounded = await ort.InferenceSession.create(
      gemma3DecoderGraph({
        ...fixture.text,
        config: { ...fixture.config.text, slidingWindow: fixture.config.text.maxPositions }
      }).toBytes()
    )
    try {
      const window = fixture.config.text.slidingWindow
      const vocab = fixture.config.text.vocabSize
      const lastLogits = async (model: ort.InferenceSession, length: number) => {
        const { logits } = await decode(model, syntheticEmbeds(length), 0, length, emptyCache())
        return numbers(logits).subarray((length - 1) * vocab)
      }
      // Up to the window, a sliding layer's last query sees every key; one token more, and it loses the first.
      expectNear(
        await lastLogits(decoder, window),
        await lastLogits(unbounded, window),
        "a prompt as long as the window"
      )
      const beyond = relativeError(await lastLogits(decoder, window + 1), await lastLogits(unbounded, window + 1))
      expect(beyond).toBeGreaterThan(1e-3)
    } finally {
      await Promise.all([decoder.release(), unbounded.release()])
    }
  })

  it("transformers.js generates on it, image and text or text alone, the greedy tokens of the reference", async () => {
    const name = offline(modelDir)
    const processor = await AutoProcessor.from_pretrained(name)
    const model = await AutoModelForImageTextToText.from_pretrained(name, { dtype: "fp32" })
    const steps = 8
    const { tokenId } = fixture
    const imageToken = tokenId(gemma3SpecialTokens.imageSoftToken)
    try {
      const prompt = processor.apply_chat_template(imageChat(), { add_generation_prompt: true }) as string
      const image = await gradientImage(70, 42)
      // The template begins with <bos> and the tokenizer adds another unless told not to.
      expect(ids((await processor(prompt, image)).input_ids).slice(0, 3)).toEqual([2, 2, tokenId("<start_of_turn>")])
      const inputs = await processor(prompt, image, { add_special_tokens: false })
      const promptIds = ids(inputs.input_ids)
      // One <bos>, the image expanded to boi, 4 soft tokens, eoi.
      expect(promptIds.slice(0, 2)).toEqual([tokenId("<bos>"), tokenId("<start_of_turn>")])
      const start = promptIds.indexOf(tokenId(gemma3SpecialTokens.startOfImage))
      expect(promptIds.slice(start, start + 6)).toEqual([
        tokenId(gemma3SpecialTokens.startOfImage),
        ...new Array(4).fill(imageToken),
        tokenId(gemma3SpecialTokens.endOfImage)
      ])
      const output = (await model.generate({ ...inputs, max_new_tokens: steps, do_sample: false })) as Tensor
      const generated = ids(output).slice(promptIds.length)
      const features = referenceGemma3ImageFeatures(
        fixture.vision,
        (inputs.pixel_values as Tensor).data as Float32Array,
        1
      )
      expect(generated).toEqual(referenceGemma3Greedy(fixture.text, promptIds, imageToken, features, steps))
      expect(new Set(generated).size).toBeGreaterThan(1)
    } finally {
      await model.dispose()
    }

    // Text alone through Gemma3ForCausalLM, which loads embed_tokens and the decoder only.
    const tokenizer = await AutoTokenizer.from_pretrained(name)
    const textModel = await AutoModelForCausalLM.from_pretrained(name, { dtype: "fp32" })
    try {
      const textPrompt = tokenizer.apply_chat_template(
        [{ role: "user", content: [{ type: "text", text: "Describe the picture" }] }],
        { add_generation_prompt: true, tokenize: false }
      ) as string
      const textInputs = tokenizer(textPrompt, { add_special_tokens: false })
      const textIds = ids(textInputs.input_ids)
      const output = (await textModel.generate({ ...textInputs, max_new_tokens: steps, do_sample: false })) as Tensor
      expect(ids(output).slice(textIds.length)).toEqual(
        referenceGemma3Greedy(fixture.text, textIds, imageToken, new Float64Array(0), steps)
      )
    } finally {
      await textModel.dispose()
    }
  })

  it("takes Gemma 3's own vocabulary: transformers.js prompts with Gemma 3's token ids and generates the reference's tokens", async () => {
    const real = randomGemma3({ seed: 1, tokenizer: "gemma3" })
    expect(real.config.text.vocabSize).toBe(262145)
    const dir = join(root, "gemma3-tiny-gemma-vocabulary")
    await writeModelBuild(dir, real.files)
    const name = offline(dir)
    const processor = await AutoProcessor.from_pretrained(name)
    const model = await AutoModelForImageTextToText.from_pretrained(name, { dtype: "fp32" })
    try {
      const prompt = processor.apply_chat_template(imageChat(), { add_generation_prompt: true }) as string
      const inputs = await processor(prompt, await gradientImage(70, 42), { add_special_tokens: false })
      const promptIds = ids(inputs.input_ids)
      // <bos> <start_of_turn> "user" "\n\n\n" <start_of_image> <image_soft_token>×4 <end_of_image> "\n\n"
      expect(promptIds.slice(0, 11)).toEqual([2, 105, 2364, 109, 255999, ...new Array(4).fill(262144), 256000, 108])
      const steps = 3
      const output = (await model.generate({ ...inputs, max_new_tokens: steps, do_sample: false })) as Tensor
      const features = referenceGemma3ImageFeatures(
        real.vision,
        (inputs.pixel_values as Tensor).data as Float32Array,
        1
      )
      expect(ids(output).slice(promptIds.length)).toEqual(
        referenceGemma3Greedy(real.text, promptIds, 262144, features, steps)
      )
    } finally {
      await model.dispose()
    }
  })
})
