import { AutoProcessor, Gemma3ImageProcessor, RawImage, type Tensor } from "@huggingface/transformers"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import sharp from "sharp"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  countImageMarkers,
  expandGemma3Prompt,
  Gemma3ImageMarkerMismatch,
  type Gemma3ProcessorConfig,
  gemma3PixelValues,
  gemma3ProcessorConfig
} from "../../src/models/Gemma3Processor.js"
import { gemma3PreprocessorConfig } from "../../src/models/recipes/RandomGemma3.js"
import { InvalidModelDirectory, loadModelDirectory, type ModelDirectory } from "../../src/models/ModelDirectory.js"
import { type ChatMessage, ChatTokenizer } from "../../src/models/Tokenizer.js"
import { offline } from "./support/TransformersJs.js"
import { packagedTokenizerConfig, writeTokenizerModel } from "./support/tokenizerModels.js"

/**
 * Gemma 3's processor against transformers.js's Gemma3Processor and Gemma3ImageProcessor, run
 * offline on a model directory with Google's gemma-3-4b-it processor files (at a small image size)
 * and the real Gemma 3 tokenizer: pixel_values equal to the bit, and prompts that tokenize to the
 * same input_ids.
 */

const googlePreprocessorConfig = (side: number) => gemma3PreprocessorConfig(side, 4)

const side = 56
const imageSeqLength = 4

const googleWithout = (field: string) => {
  const { [field]: _, ...rest } = googlePreprocessorConfig(side) as Record<string, unknown>
  return rest
}

const modelConfig = {
  architectures: ["Gemma3ForConditionalGeneration"],
  model_type: "gemma3",
  boi_token_index: 255999,
  eoi_token_index: 256000,
  image_token_index: 262144,
  mm_tokens_per_image: imageSeqLength,
  eos_token_id: [1, 106],
  text_config: { model_type: "gemma3_text", hidden_size: 64, num_hidden_layers: 2 },
  vision_config: { model_type: "siglip_vision_model", image_size: side, patch_size: 14 }
}

/** Seeded 8-bit noise. */
const noise = (length: number, seed: number): Uint8Array => {
  const data = new Uint8Array(length)
  let state = seed
  for (let i = 0; i < length; i++) {
    state = (state * 1103515245 + 12345) >>> 0
    data[i] = state >>> 24
  }
  return data
}

/** Smooth ramps with a little noise, so that every resample kernel has something to interpolate. */
const picture = (width: number, height: number, channels: 1 | 3 | 4, seed: number): Uint8Array => {
  const grain = noise(width * height * channels, seed)
  const data = new Uint8Array(width * height * channels)
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      for (let c = 0; c < channels; c++) {
        const i = (y * width + x) * channels + c
        const ramp = c % 2 === 0 ? (255 * x) / Math.max(1, width - 1) : (255 * y) / Math.max(1, height - 1)
        data[i] = c === 3 ? grain[i]! : Math.min(255, Math.round(0.8 * ramp + 0.2 * grain[i]!))
      }
    }
  }
  return data
}

const png = async (width: number, height: number, channels: 1 | 3 | 4, seed: number) =>
  new Uint8Array(
    await sharp(picture(width, height, channels, seed), { raw: { width, height, channels } })
      .png()
      .toBuffer()
  )

/** A JPEG stored 60×30 whose EXIF says to turn it a quarter clockwise (shown 30×60). */
const rotatedJpeg = async () =>
  new Uint8Array(
    await sharp(picture(60, 30, 3, 8), { raw: { width: 60, height: 30, channels: 3 } })
      .jpeg({ quality: 90 })
      .withMetadata({ orientation: 6 })
      .toBuffer()
  )

const images: ReadonlyArray<{ readonly name: string; readonly bytes: () => Promise<Uint8Array> }> = [
  { name: "wider than tall (90×40)", bytes: () => png(90, 40, 3, 1) },
  { name: "taller than wide (33×101)", bytes: () => png(33, 101, 3, 2) },
  { name: "smaller than a patch (5×9)", bytes: () => png(5, 9, 3, 3) },
  { name: "larger than the size (300×220)", bytes: () => png(300, 220, 3, 4) },
  { name: "exactly the size (56×56)", bytes: () => png(side, side, 3, 5) },
  { name: "gray (64×48)", bytes: () => png(64, 48, 1, 6) },
  { name: "RGBA with varied alpha (45×70)", bytes: () => png(45, 70, 4, 7) },
  { name: "an EXIF-rotated JPEG", bytes: rotatedJpeg }
]

const rawImage = (bytes: Uint8Array) => RawImage.fromBlob(new Blob([bytes]))

/** Bit-for-bit equality of two float arrays, naming the first value that differs. */
const expectSameBits = (ours: Float32Array, theirs: Float32Array) => {
  expect(ours.length).toBe(theirs.length)
  const a = new Uint32Array(ours.buffer, ours.byteOffset, ours.length)
  const b = new Uint32Array(theirs.buffer, theirs.byteOffset, theirs.length)
  const first = a.findIndex((bits, i) => bits !== b[i])
  expect(first === -1 ? "all equal" : `value ${first}: ${ours[first]} vs ${theirs[first]}`).toBe("all equal")
}

const pixelValuesOf = (output: unknown): Tensor => (output as { pixel_values: Tensor }).pixel_values

let root: string
let dir: string
let model: ModelDirectory
let config: Gemma3ProcessorConfig
let tokenizer: ChatTokenizer
let reference: Awaited<ReturnType<typeof AutoProcessor.from_pretrained>>

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "cornserve-gemma3-processor-"))
  const chatTemplate = (await packagedTokenizerConfig("gemma3")).chat_template as string
  dir = await writeTokenizerModel(root, "gemma-3", "gemma3", {
    config: modelConfig,
    files: {
      "preprocessor_config.json": JSON.stringify(googlePreprocessorConfig(side)),
      "processor_config.json": JSON.stringify({ image_seq_length: imageSeqLength, processor_class: "Gemma3Processor" }),
      "chat_template.jinja": chatTemplate
    }
  })
  model = await loadModelDirectory(dir)
  config = gemma3ProcessorConfig(model)
  tokenizer = new ChatTokenizer(model)
  reference = await AutoProcessor.from_pretrained(offline(dir))
}, 60_000)

afterAll(async () => {
  await rm(root, { recursive: true, force: true })
})

describe("Gemma 3's processor config", () => {
  it("reads Google's files: size, resample, scaling, image_seq_length and the image tokens", () => {
    expect(config).toEqual({
      size: { height: side, width: side },
      resample: 2,
      do_rescale: true,
      rescale_factor: 0.00392156862745098,
      do_normalize: true,
      image_mean: [0.5, 0.5, 0.5],
      image_std: [0.5, 0.5, 0.5],
      imageSeqLength,
      boi: { text: "<start_of_image>", id: 255999 },
      eoi: { text: "<end_of_image>", id: 256000 },
      image: { text: "<image_soft_token>", id: 262144 }
    })
    expect(reference.image_processor).toBeInstanceOf(Gemma3ImageProcessor)
  })

  it("ignores pan-and-scan, as transformers.js does", () => {
    const panAndScan = {
      ...model,
      preprocessorConfig: { ...googlePreprocessorConfig(side), do_pan_and_scan: true, pan_and_scan_max_num_crops: 4 }
    }
    expect(gemma3ProcessorConfig(panAndScan)).toEqual(config)
  })

  const refusals: ReadonlyArray<{
    readonly name: string
    readonly change: (model: ModelDirectory) => ModelDirectory
    readonly reason: string
  }> = [
    {
      name: "a size without a width",
      change: (m) => ({ ...m, preprocessorConfig: { ...googlePreprocessorConfig(side), size: { height: side } } }),
      reason: "preprocessor_config.json: size.width is missing"
    },
    {
      name: "a size by shortest edge",
      change: (m) => ({
        ...m,
        preprocessorConfig: { ...googlePreprocessorConfig(side), size: { shortest_edge: side } }
      }),
      reason: `preprocessor_config.json: size.shortest_edge is unexpected, expected: "height" | "width"`
    },
    {
      name: "a resample filter PIL does not have",
      change: (m) => ({ ...m, preprocessorConfig: { ...googlePreprocessorConfig(side), resample: 7 } }),
      reason: "preprocessor_config.json: resample must be one of PIL's filters: 0 nearest, 1 Lanczos"
    },
    {
      name: "do_convert_rgb false",
      change: (m) => ({ ...m, preprocessorConfig: { ...googlePreprocessorConfig(side), do_convert_rgb: false } }),
      reason: "preprocessor_config.json: do_convert_rgb must be true: this processor reads every image as RGB"
    },
    {
      name: "a center crop",
      change: (m) => ({ ...m, preprocessorConfig: { ...googlePreprocessorConfig(side), do_center_crop: true } }),
      reason: "preprocessor_config.json: do_center_crop is not supported by Gemma 3's processor"
    },
    {
      name: "a processor_config.json without image_seq_length",
      change: (m) => ({ ...m, processorConfig: { processor_class: "Gemma3Processor" } }),
      reason: "processor_config.json: image_seq_length is missing"
    },
    {
      name: "normalizing without a mean",
      change: (m) => ({ ...m, preprocessorConfig: { ...googlePreprocessorConfig(side), image_mean: undefined } }),
      reason: "preprocessor_config.json turns do_normalize on but lacks image_mean or image_std"
    },
    {
      name: "no preprocessor_config.json",
      change: (m) => ({ ...m, preprocessorConfig: undefined }),
      reason: "preprocessor_config.json is missing"
    },
    {
      name: "no processor_config.json",
      change: (m) => ({ ...m, processorConfig: undefined }),
      reason: "processor_config.json is missing (Gemma 3's processor reads image_seq_length from it)"
    },
    {
      name: "an image_seq_length config.json disagrees with",
      change: (m) => ({
        ...m,
        processorConfig: { image_seq_length: 9 },
        preprocessorConfig: googleWithout("image_seq_length")
      }),
      reason: "config.json's mm_tokens_per_image is 4, but processor_config.json's image_seq_length is 9"
    },
    {
      name: "a size the vision encoder does not take",
      change: (m) => ({ ...m, preprocessorConfig: googlePreprocessorConfig(112) }),
      reason: "config.json's vision_config.image_size is 56, but preprocessor_config.json's size.height is 112"
    },
    {
      name: "a tokenizer_config.json without image_token",
      change: (m) => ({
        ...m,
        tokenizer: { ...m.tokenizer!, rawConfig: { ...m.tokenizer!.rawConfig, image_token: undefined } }
      }),
      reason: "tokenizer_config.json has no image_token"
    },
    {
      name: "an image token config.json gives another id",
      change: (m) => ({ ...m, config: { ...m.config, image_token_id: 7 } }),
      reason: "config.json's image_token_index is 7, but the id of <image_soft_token> is 262144"
    }
  ]

  for (const { name, change, reason } of refusals) {
    it(`refuses ${name}, saying why`, () => {
      const changed = change(model)
      expect(() => gemma3ProcessorConfig(changed)).toThrow(InvalidModelDirectory)
      expect(() => gemma3ProcessorConfig(changed)).toThrow(`invalid model directory ${model.path}: ${reason}`)
    })
  }

  it("refuses a directory on disk without processor_config.json, naming it", async () => {
    const bare = await writeTokenizerModel(root, "no-processor-config", "gemma3", {
      config: modelConfig,
      files: { "preprocessor_config.json": JSON.stringify(googlePreprocessorConfig(side)) }
    })
    const loaded = await loadModelDirectory(bare)
    expect(() => gemma3ProcessorConfig(loaded)).toThrow(
      `invalid model directory ${loaded.path}: processor_config.json is missing`
    )
  })
})

describe("Gemma 3's pixel_values, against transformers.js", () => {
  for (const { name, bytes } of images) {
    it(`are transformers.js's, to the bit: ${name}`, async () => {
      const encoded = await bytes()
      const theirs = pixelValuesOf(await reference.image_processor!(await rawImage(encoded)))
      const ours = await gemma3PixelValues(encoded, config)
      expect(ours.shape).toEqual(theirs.dims)
      expectSameBits(ours.data, theirs.data as Float32Array)
    })
  }

  for (const resample of [0, 1, 2, 3] as const) {
    it(`are transformers.js's with resample ${resample}, scaled up and down`, async () => {
      const imageProcessor = new Gemma3ImageProcessor({ ...googlePreprocessorConfig(side), resample } as never)
      const ours = { ...config, resample }
      for (const encoded of [await png(90, 40, 3, 11), await png(300, 220, 3, 12), await png(20, 31, 4, 13)]) {
        const theirs = pixelValuesOf(await imageProcessor(await rawImage(encoded)))
        expectSameBits((await gemma3PixelValues(encoded, ours)).data, theirs.data as Float32Array)
      }
    })
  }

  it("are transformers.js's at Google's 896 × 896", async () => {
    const google = googlePreprocessorConfig(896)
    const at896 = gemma3ProcessorConfig({
      ...model,
      preprocessorConfig: google,
      rawConfig: { ...model.rawConfig, vision_config: { image_size: 896, patch_size: 14 } }
    })
    const encoded = new Uint8Array(
      await sharp(picture(640, 480, 3, 21), { raw: { width: 640, height: 480, channels: 3 } })
        .jpeg()
        .toBuffer()
    )
    const theirs = pixelValuesOf(await new Gemma3ImageProcessor(google as never)(await rawImage(encoded)))
    const ours = await gemma3PixelValues(encoded, at896)
    expect(ours.shape).toEqual([1, 3, 896, 896])
    expectSameBits(ours.data, theirs.data as Float32Array)
  })
})

describe("Gemma 3's prompts, against transformers.js", () => {
  const ids = (tensor: Tensor) => Array.from(tensor.data as BigInt64Array, Number)

  const chats: ReadonlyArray<{
    readonly name: string
    readonly messages: ReadonlyArray<ChatMessage>
    readonly images: () => Promise<ReadonlyArray<Uint8Array>>
  }> = [
    {
      name: "one image",
      messages: [
        {
          role: "user",
          content: [{ type: "image" }, { type: "text", text: "Describe this image." }]
        }
      ],
      images: async () => [await png(90, 40, 3, 31)]
    },
    {
      name: "two images, with a system prompt",
      messages: [
        { role: "system", content: [{ type: "text", text: "You compare pictures." }] },
        {
          role: "user",
          content: [
            { type: "text", text: "Here is the first:" },
            { type: "image" },
            { type: "text", text: "and the second:" },
            { type: "image" },
            { type: "text", text: "Which is brighter?" }
          ]
        }
      ],
      images: async () => [await png(33, 101, 3, 32), await png(64, 48, 1, 33)]
    }
  ]

  for (const { name, messages, images: imagesOf } of chats) {
    it(`tokenize to transformers.js's input_ids and pixel_values: ${name}`, async () => {
      const encoded = await imagesOf()
      const text = reference.apply_chat_template(messages as never, { add_generation_prompt: true }) as string
      const theirs = (await reference(text, await Promise.all(encoded.map(rawImage)), {
        add_special_tokens: false
      })) as Record<string, Tensor>

      const prompt = tokenizer.applyChatTemplate(messages, { addGenerationPrompt: true })
      expect(prompt).toBe(text)
      expect(countImageMarkers(prompt, config)).toBe(encoded.length)
      const inputIds = tokenizer.encode(expandGemma3Prompt(prompt, config, encoded.length))
      expect(inputIds).toEqual(ids(theirs.input_ids!))
      expect(inputIds.filter((id) => id === config.image.id)).toHaveLength(encoded.length * imageSeqLength)
      expect(inputIds[0]).toBe(2)
      expect(inputIds[1]).not.toBe(2)

      const ours = await Promise.all(encoded.map((bytes) => gemma3PixelValues(bytes, config)))
      const stacked = new Float32Array(ours.reduce((n, image) => n + image.data.length, 0))
      ours.forEach((image, i) => stacked.set(image.data, i * image.data.length))
      expect(theirs.pixel_values!.dims).toEqual([encoded.length, 3, side, side])
      expectSameBits(stacked, theirs.pixel_values!.data as Float32Array)
    })
  }

  it("expands every image marker as transformers.js does, merging the newlines with the text around", () => {
    const soft = "<image_soft_token>".repeat(imageSeqLength)
    expect(expandGemma3Prompt("user\n<start_of_image>Hi", config)).toBe(
      `user\n\n\n<start_of_image>${soft}<end_of_image>\n\nHi`
    )
    const ids = tokenizer.encode(expandGemma3Prompt("user\n<start_of_image>", config))
    expect(ids.slice(0, 3)).toEqual([tokenizer.tokenId("user"), tokenizer.tokenId("\n\n\n"), 255999])
  })

  it("refuses a prompt whose image markers do not match its images", () => {
    expect(() => expandGemma3Prompt("<start_of_image> and <start_of_image>", config, 1)).toThrow(
      Gemma3ImageMarkerMismatch
    )
    expect(() => expandGemma3Prompt("<start_of_image>", config, 2)).toThrow(
      "the prompt has 1 <start_of_image> marker(s) for 2 image(s)"
    )
    expect(countImageMarkers("no image here", config)).toBe(0)
  })
})
