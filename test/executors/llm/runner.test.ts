import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { SamplingParams } from "../../../src/executors/llm/protocol.js"
import { Runner } from "../../../src/executors/llm/Runner.js"
import { decodeImageProcessorConfig, pixelValues } from "../../../src/models/ImageProcessor.js"
import { loadModelDirectory, type ModelDirectory } from "../../../src/models/ModelDirectory.js"
import { buildModel } from "../../../src/models/ModelStore.js"
import { Random } from "../../../src/models/Random.js"
import { decoderGraph, embedTokensGraph } from "../../../src/models/architectures/Decoder.js"
import { decoderRecipe, randomDecoderWeights } from "../../../src/models/recipes/BenchDecoder125m.js"
import { chatVocabulary } from "../../../src/models/recipes/ChatVocabulary.js"
import { colors } from "../../../src/models/recipes/ColorChannels.js"
import { ChatTokenizer } from "../../../src/models/Tokenizer.js"
import { matrix } from "../../../src/models/Weights.js"
import { ColorVlmRunner } from "../../models/support/ColorVlmRunner.js"
import { colorImage } from "../../models/support/Synthetic.js"
import { drive, type Scripted } from "../../support/driveRunner.js"

/**
 * The LLM worker's model side, in process: continuous batching must not change what a request
 * generates, whoever it shares steps with and whenever it joins or they leave.
 */

const greedy = (maxNewTokens: number, stopTokenIds: ReadonlyArray<number> = []): SamplingParams => ({
  temperature: 0,
  topP: 1,
  seed: 0,
  maxNewTokens,
  stopTokenIds
})

let root: string
let decoder: ModelDirectory
let vlm: ModelDirectory

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "cornserve-llm-runner-"))
  const preset = {
    hidden: 64,
    layers: 2,
    heads: 4,
    intermediate: 128,
    vocabSize: chatVocabulary().vocabSize,
    maxPositions: 256,
    seed: 11
  }
  const recipe = decoderRecipe("test/tiny-decoder", preset)
  // Untied, larger random weights than the recipe's, so that greedy text wanders instead of repeating one token.
  const weights = randomDecoderWeights(preset)
  const random = new Random(12)
  const files = new Map([
    ...recipe.build(),
    [
      "onnx/embed_tokens.onnx",
      embedTokensGraph({
        ...weights,
        embedTokens: matrix(weights.embedTokens.rows, preset.hidden, random.normals(weights.embedTokens.data.length, 1))
      }).toBytes()
    ],
    [
      "onnx/decoder_model_merged.onnx",
      decoderGraph({
        ...weights,
        positions: matrix(preset.maxPositions, preset.hidden, random.normals(preset.maxPositions * preset.hidden, 1)),
        lmHead: matrix(preset.hidden, preset.vocabSize, random.normals(preset.hidden * preset.vocabSize, 1))
      }).toBytes()
    ]
  ])
  const decoderDir = join(root, "tiny-decoder")
  for (const [file, bytes] of files) {
    await mkdir(dirname(join(decoderDir, file)), { recursive: true })
    await writeFile(join(decoderDir, file), bytes)
  }
  decoder = await loadModelDirectory(decoderDir)
  vlm = await loadModelDirectory(await buildModel("cornserve/tiny-color-vlm", root))
})

afterAll(async () => {
  await rm(root, { recursive: true, force: true })
})

describe("Runner", () => {
  it("generates the same greedy tokens alone as batched with 7 others that join and leave at other steps", async () => {
    const runner = await Runner.open(decoder, "cpu:0", 1)
    const tokenizer = new ChatTokenizer(decoder)
    const texts = [
      "What colour is the sky?",
      "Paint it red",
      "Tell me about a zebra in Zürich 🦓",
      "hi",
      "Is this tone low or high? Answer in one word, please, and be quick about it.",
      "blue green",
      "nothing at all",
      "flibbertigibbet quux"
    ]
    const requests: Array<Scripted> = texts.map((text, i) => ({
      id: `r${i}`,
      prompt: { inputIds: Int32Array.from(tokenizer.encode(text)), media: [] },
      sampling: greedy(6 + 3 * i),
      joinAt: [0, 0, 1, 3, 3, 4, 9, 12][i]!
    }))
    const alone = new Map<string, ReadonlyArray<number>>()
    for (const request of requests)
      alone.set(request.id, (await drive(runner, [{ ...request, joinAt: 0 }])).get(request.id)!)
    expect(runner.held).toEqual([])
    const batched = await drive(runner, requests)
    for (const request of requests) {
      expect(batched.get(request.id), request.id).toEqual(alone.get(request.id))
      expect(batched.get(request.id)).toHaveLength(request.sampling.maxNewTokens)
    }
    expect(runner.held).toEqual([])
    await runner.close()
  })

  it("frees a cancelled request's cache and goes on with the others unchanged", async () => {
    const runner = await Runner.open(decoder, "cpu:0", 1)
    const tokenizer = new ChatTokenizer(decoder)
    const request = (id: string, text: string, cancelAt?: number): Scripted => ({
      id,
      prompt: { inputIds: Int32Array.from(tokenizer.encode(text)), media: [] },
      sampling: greedy(10),
      joinAt: 0,
      ...(cancelAt === undefined ? {} : { cancelAt })
    })
    const alone = await drive(runner, [request("kept", "Paint the sea green")])
    const mixed = await drive(runner, [
      request("kept", "Paint the sea green"),
      request("dropped", "What colour is this image?", 4)
    ])
    expect(mixed.get("kept")).toEqual(alone.get("kept"))
    // Two tokens at the step it joined (prefill and a decode), then one a step.
    expect(mixed.get("dropped")).toHaveLength(5)
    expect(runner.held).toEqual([])
    await runner.close()
  })

  it("answers the colour VLM's questions as a direct ONNX Runtime loop does, with images and without, batched", async () => {
    const runner = await Runner.open(vlm, "cpu:0", 1)
    const direct = await ColorVlmRunner.open(vlm.path)
    const tokenizer = new ChatTokenizer(vlm)
    const preprocessor = decodeImageProcessorConfig(vlm.preprocessorConfig)
    const random = new Random(3)
    const cases = await Promise.all(
      [0, 3, 5, 6, -1, 1, 2, 7].map(async (color) => ({
        color,
        pixels:
          color < 0
            ? undefined
            : await pixelValues(
                preprocessor,
                colorImage(random, colors[color]!, colors[(color + 4) % 8]!, "noisy-patch").image
              )
      }))
    )
    const imageToken = vlm.config.image_token_id!
    const rows = vlm.config.image_seq_length!
    const requests: Array<Scripted> = cases.map((c, i) => {
      const content = [
        ...(c.pixels === undefined ? [] : [{ type: "image" }]),
        { type: "text", text: "What colour is this image?" }
      ]
      const ids = tokenizer.encode(tokenizer.applyChatTemplate([{ role: "user", content }]))
      const at = ids.indexOf(imageToken)
      const inputIds =
        at < 0 ? ids : [...ids.slice(0, at), ...new Array<number>(rows).fill(imageToken), ...ids.slice(at + 1)]
      return {
        id: `q${i}`,
        prompt: {
          inputIds: Int32Array.from(inputIds),
          media:
            c.pixels === undefined
              ? []
              : [{ start: at, rows, input: { kind: "pixel_values", data: c.pixels, shape: [1, 3, 64, 64] } }]
        },
        sampling: greedy(8, [vlm.config.eos_token_id as number]),
        joinAt: i % 3
      }
    })
    const answers = await drive(runner, requests)
    const expected = await direct.answer(
      cases.map((c) => ({
        text: "What colour is this image?",
        ...(c.pixels === undefined ? {} : { images: [c.pixels] })
      })),
      8
    )
    requests.forEach((request, i) => expect(answers.get(request.id), request.id).toEqual(expected[i]!.ids))
    expect(expected.map((answer) => answer.text)).toEqual(
      cases.map((c) => (c.color < 0 ? "nothing" : colors[c.color]!.name))
    )
    await runner.close()

    // From the prefix cache and in chunks that cut through the image's rows: the same answers.
    // The image prompts have the same tokens: only their images' content tells their blocks apart.
    const pieces = await Runner.open(vlm, "cpu:0", 1, undefined, { prefixBlockTokens: 4, chunkTokens: 3 })
    try {
      for (const round of [0, 1]) {
        const again = await drive(
          pieces,
          requests.map((request, i) => ({ ...request, id: `${request.id}-${round}`, joinAt: i }))
        )
        requests.forEach((request, i) =>
          expect(again.get(`${request.id}-${round}`), `${request.id} round ${round}`).toEqual(expected[i]!.ids)
        )
      }
      const stats = pieces.prefixCache!.stats
      // Round 1 found every prompt's blocks; round 0 only the chat template's head, shared by all.
      expect(stats.lookups).toBe(16)
      expect(stats.hits).toBeGreaterThanOrEqual(8)
    } finally {
      await pieces.close()
    }
  })
})
