import {
  AutoModelForImageTextToText,
  AutoProcessor,
  AutoTokenizer,
  RawImage,
  type Tensor
} from "@huggingface/transformers"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import type * as ort from "onnxruntime-node"
import sharp from "sharp"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { qwen2VLSpecialTokens } from "../../src/models/recipes/RandomQwen2VL.js"
import {
  llavaOnevisionChatTemplate,
  llavaOnevisionSpecialTokens,
  type RandomLlavaOnevision,
  randomLlavaOnevision
} from "../../src/models/recipes/RandomLlavaOnevision.js"
import { writeModelBuild } from "../../src/models/recipes/Recipe.js"
import {
  referenceLlavaOnevisionEmbeddings,
  referenceLlavaOnevisionGreedy,
  referenceLlavaOnevisionImageFeatures,
  referenceLlavaOnevisionLogits
} from "./support/LlavaOnevisionModelReference.js"
import { floatTensor, int64Tensor, numbers, relativeError, session } from "./support/Ort.js"
import { offline } from "./support/TransformersJs.js"

let root: string
let modelDir: string
let fixture: RandomLlavaOnevision

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "llava-onevision-graphs-"))
  modelDir = join(root, "llava-onevision-tiny")
  fixture = randomLlavaOnevision({ seed: 1 })
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

/** 56-pixel images of 14-pixel patches: 16 image tokens an image. */
const imageTokens = 16

/** A PNG with a colour gradient (turned by `phase`), so that every patch, and every image, differs. */
const gradientImage = async (width: number, height: number, phase = 0): Promise<RawImage> => {
  const data = new Uint8Array(width * height * 3)
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const i = (y * width + x) * 3
      data[i] = Math.round((255 * x) / (width - 1))
      data[i + 1] = Math.round((255 * y) / (height - 1))
      data[i + 2] = (x * 7 + y * 3 + phase) % 256
    }
  }
  const png = await sharp(data, { raw: { width, height, channels: 3 } })
    .png()
    .toBuffer()
  return RawImage.fromBlob(new Blob([new Uint8Array(png)]))
}

const ids = (tensor: unknown): Array<number> => Array.from((tensor as Tensor).data as BigInt64Array, Number)

const imageChat = (images: number) => [
  {
    role: "user",
    content: [
      ...Array.from({ length: images }, () => ({ type: "image" })),
      { type: "text", text: "What is in this image" }
    ]
  }
]

/** The template's prompt with each `<image>` expanded to the image's rows, as LlavaOnevisionProcessor does. */
const expandedPrompt = (prompt: string) =>
  prompt.replaceAll(llavaOnevisionSpecialTokens.image, llavaOnevisionSpecialTokens.image.repeat(imageTokens))

/** The empty cache of the first step: every layer's keys and values, [1, kvHeads, 0, headDim]. */
const emptyCache = (): Record<string, ort.Tensor> => {
  const { layers, kvHeads, hiddenSize, heads } = fixture.config.text
  return Object.fromEntries(
    Array.from({ length: layers }, (_, i) =>
      ["key", "value"].map((kind) => [
        `past_key_values.${i}.${kind}`,
        floatTensor(new Float32Array(0), [1, kvHeads, 0, hiddenSize / heads])
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

/** Runs a decoder on rows [from, to) of `embeds` after `past`, at positions counted from 0. */
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
      Array.from({ length: to - from }, (_, i) => from + i),
      [1, to - from]
    ),
    ...past
  })
}

const json = (file: string): unknown => JSON.parse(new TextDecoder().decode(fixture.files.get(file)!))

describe("a random LLaVA-OneVision in the split layout", () => {
  it("has the input and output names transformers.js feeds and reads, and a cache of numeric heads and head size", async () => {
    const [vision, embed, decoder] = await sessions()
    try {
      expect(vision!.inputNames).toEqual(["pixel_values"])
      expect(vision!.outputNames).toEqual(["image_features"])
      expect(embed!.inputNames).toEqual(["input_ids"])
      expect(embed!.outputNames).toEqual(["inputs_embeds"])
      const { layers, kvHeads, hiddenSize, heads } = fixture.config.text
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
        expect(meta.isTensor && meta.shape, meta.name).toEqual([
          "batch_size",
          kvHeads,
          "past_sequence_length",
          hiddenSize / heads
        ])
      }
    } finally {
      await Promise.all([vision, embed, decoder].map((s) => s!.release()))
    }
  })

  it("writes llava-onevision-qwen2's files: config, preprocessor and processor configs, and its chat template", async () => {
    const { tokenId } = fixture
    const image = tokenId(llavaOnevisionSpecialTokens.image)
    const video = tokenId(llavaOnevisionSpecialTokens.video)
    expect(video).toBe(image + 1)
    expect(json("config.json")).toMatchObject({
      model_type: "llava_onevision",
      architectures: ["LlavaOnevisionForConditionalGeneration"],
      image_token_index: image,
      video_token_index: video,
      vision_feature_layer: -1,
      vision_feature_select_strategy: "full",
      vision_aspect_ratio: "anyres_max_9",
      vision_config: {
        model_type: "siglip_vision_model",
        hidden_size: 32,
        num_hidden_layers: 2,
        image_size: 56,
        patch_size: 14,
        layer_norm_eps: 1e-6
      },
      text_config: {
        model_type: "qwen2",
        hidden_size: 64,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        vocab_size: fixture.config.text.vocabSize,
        tie_word_embeddings: false,
        eos_token_id: tokenId(qwen2VLSpecialTokens.imEnd)
      }
    })
    const pinpoints = (json("config.json") as { image_grid_pinpoints: Array<[number, number]> }).image_grid_pinpoints
    expect(pinpoints).toHaveLength(36)
    expect([pinpoints[0], pinpoints[1], pinpoints[35]]).toEqual([
      [56, 56],
      [56, 112],
      [336, 336]
    ])
    expect(json("preprocessor_config.json")).toMatchObject({
      image_processor_type: "LlavaOnevisionImageProcessor",
      processor_class: "LlavaOnevisionProcessor",
      size: { height: 56, width: 56 },
      resample: 3,
      do_pad: true,
      image_mean: [0.5, 0.5, 0.5],
      image_std: [0.5, 0.5, 0.5],
      image_grid_pinpoints: pinpoints
    })
    expect(json("processor_config.json")).toEqual({
      image_token: "<image>",
      num_image_tokens: imageTokens,
      processor_class: "LlavaOnevisionProcessor",
      video_token: "<video>",
      vision_aspect_ratio: "anyres_max_9",
      vision_feature_select_strategy: "full"
    })
    expect((json("tokenizer_config.json") as { chat_template: string }).chat_template).toBe(llavaOnevisionChatTemplate)

    const tokenizer = await AutoTokenizer.from_pretrained(offline(modelDir))
    const prompt = tokenizer.apply_chat_template(imageChat(1), { add_generation_prompt: true, tokenize: false })
    expect(prompt).toBe("<|im_start|>user\n<image>\nWhat is in this image<|im_end|>\n<|im_start|>assistant\n")
    expect(ids(tokenizer("<image><video>", { add_special_tokens: false }).input_ids)).toEqual([image, video])
  })

  it("encodes images as SigLIP's last encoder layer and LLaVA-OneVision's projector do, each image of a batch alone", async () => {
    const vision = await session(join(modelDir, "onnx", "vision_encoder.onnx"))
    try {
      const size = fixture.config.vision.imageSize
      const pixels = Float32Array.from({ length: 2 * 3 * size * size }, (_, i) => Math.sin(i * 0.37) * 0.9)
      const { image_features: features } = await vision.run({ pixel_values: floatTensor(pixels, [2, 3, size, size]) })
      expect(features!.dims).toEqual([2, imageTokens, fixture.config.text.hiddenSize])
      const expected = referenceLlavaOnevisionImageFeatures(fixture.vision, pixels, 2)
      expectNear(numbers(features), expected, "image_features")
      const alone = await vision.run({
        pixel_values: floatTensor(pixels.slice(3 * size * size), [1, 3, size, size])
      })
      expectNear(numbers(alone.image_features), expected.subarray(expected.length / 2), "the second image alone")
    } finally {
      await vision.release()
    }
  })

  it("embeds and decodes a chat with an image as modeling_qwen2 does, and the same through the cache", async () => {
    const name = offline(modelDir)
    const tokenizer = await AutoTokenizer.from_pretrained(name)
    const processor = await AutoProcessor.from_pretrained(name)
    const prompt = tokenizer.apply_chat_template(imageChat(1), { add_generation_prompt: true, tokenize: false })
    const promptIds = ids(tokenizer(expandedPrompt(prompt as string), { add_special_tokens: false }).input_ids)
    const pixelValues = (await processor(await gradientImage(70, 42))).pixel_values as Tensor
    expect(pixelValues.dims).toEqual([1, 3, 56, 56])
    const hidden = fixture.config.text.hiddenSize
    const length = promptIds.length

    const [vision, embed, decoder] = await sessions()
    try {
      const { image_features: features } = await vision!.run({
        pixel_values: floatTensor(pixelValues.data as Float32Array, pixelValues.dims)
      })
      expectNear(
        numbers(features),
        referenceLlavaOnevisionImageFeatures(fixture.vision, pixelValues.data as Float32Array, 1),
        "image_features of the processor's pixels"
      )

      const { inputs_embeds: textEmbeds } = await embed!.run({ input_ids: int64Tensor(promptIds, [1, length]) })
      expectNear(numbers(textEmbeds), referenceLlavaOnevisionEmbeddings(fixture.text, promptIds), "inputs_embeds")
      const embeds = Float32Array.from(numbers(textEmbeds))
      const imageToken = fixture.tokenId(llavaOnevisionSpecialTokens.image)
      const featureRows = Float32Array.from(numbers(features))
      let row = 0
      promptIds.forEach((id, at) => {
        if (id !== imageToken) return
        embeds.set(featureRows.subarray(row * hidden, (row + 1) * hidden), at * hidden)
        row++
      })
      expect(row).toBe(imageTokens)

      const whole = await decode(decoder!, embeds, 0, length, emptyCache())
      const reference = referenceLlavaOnevisionLogits(
        fixture.text,
        Float64Array.from(embeds),
        promptIds.map((_, i) => i)
      )
      expectNear(numbers(whole.logits), reference, "logits of the image chat")

      // The first five tokens, then the rest one at a time.
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

  it("transformers.js generates on it, one image, two images or text alone, the greedy tokens of the reference", async () => {
    const name = offline(modelDir)
    const tokenizer = await AutoTokenizer.from_pretrained(name)
    const processor = await AutoProcessor.from_pretrained(name)
    const model = await AutoModelForImageTextToText.from_pretrained(name, { dtype: "fp32" })
    expect(model.constructor.name).toBe("LlavaForConditionalGeneration")
    const steps = 8
    const imageToken = fixture.tokenId(llavaOnevisionSpecialTokens.image)
    const stops = [fixture.tokenId(qwen2VLSpecialTokens.imEnd), fixture.tokenId(qwen2VLSpecialTokens.endOfText)]
    const generate = async (images: ReadonlyArray<RawImage>) => {
      const prompt = tokenizer.apply_chat_template(imageChat(images.length), {
        add_generation_prompt: true,
        tokenize: false
      }) as string
      const textInputs = tokenizer(images.length === 0 ? prompt : expandedPrompt(prompt), { add_special_tokens: false })
      const promptIds = ids(textInputs.input_ids)
      expect(promptIds.filter((id) => id === imageToken)).toHaveLength(images.length * imageTokens)
      const pixelValues = images.length === 0 ? undefined : ((await processor([...images])).pixel_values as Tensor)
      const output = (await model.generate({
        ...textInputs,
        ...(pixelValues === undefined ? {} : { pixel_values: pixelValues }),
        max_new_tokens: steps,
        do_sample: false
      })) as Tensor
      const features =
        pixelValues === undefined
          ? new Float64Array(0)
          : referenceLlavaOnevisionImageFeatures(fixture.vision, pixelValues.data as Float32Array, images.length)
      return {
        generated: ids(output).slice(promptIds.length),
        expected: referenceLlavaOnevisionGreedy(
          fixture.text,
          promptIds,
          { tokenId: imageToken, features },
          steps,
          stops
        )
      }
    }
    try {
      const first = await gradientImage(70, 42)
      const second = await gradientImage(40, 64, 90)
      const oneImage = await generate([first])
      expect(oneImage.generated).toEqual(oneImage.expected)
      expect(new Set(oneImage.generated).size).toBeGreaterThan(1)
      // Two images: the first's rows over the first 16 <image> tokens, the second's over the next.
      const twoImages = await generate([first, second])
      expect(twoImages.generated).toEqual(twoImages.expected)
      const swapped = await generate([second, first])
      expect(swapped.generated).toEqual(swapped.expected)
      expect(swapped.generated).not.toEqual(twoImages.generated)
      const textAlone = await generate([])
      expect(textAlone.generated).toEqual(textAlone.expected)
    } finally {
      await model.dispose()
    }
  })

  it("transformers.js refuses a prompt whose <image> tokens are not the image's rows", async () => {
    const name = offline(modelDir)
    const tokenizer = await AutoTokenizer.from_pretrained(name)
    const processor = await AutoProcessor.from_pretrained(name)
    const model = await AutoModelForImageTextToText.from_pretrained(name, { dtype: "fp32" })
    try {
      const prompt = tokenizer.apply_chat_template(imageChat(1), { add_generation_prompt: true, tokenize: false })
      const { pixel_values } = await processor(await gradientImage(70, 42))
      await expect(
        model.generate({
          ...tokenizer(prompt as string, { add_special_tokens: false }),
          pixel_values,
          max_new_tokens: 1
        })
      ).rejects.toThrow(/tokens: 1, features 16/)
    } finally {
      await model.dispose()
    }
  })
})
