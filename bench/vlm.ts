/**
 * Image chats, family by family: a random-weight model in the community's split layout (a vision
 * tower of 8 blocks at 512 wide, a decoder of 6 layers at 512 wide; 224×224 images, 64 vision
 * tokens a prompt, 49 for Qwen3-VL) through the LLM executor's chat API, against transformers.js's
 * ...ForConditionalGeneration on the same files in this process, with the same ONNX Runtime
 * thread count, in the same run. The families:
 *
 * - qwen2vl: Qwen2-VL (256 patches of 14 pixels, merged 2×2; M-RoPE positions);
 * - qwen3vl: Qwen3-VL (196 patches of 16 pixels, merged 2×2 into 49 tokens; learned positions
 *   interpolated; interleaved M-RoPE);
 * - llava-onevision: LLaVA-OneVision as transformers.js runs it (a SigLIP tower's 64 patches of 28
 *   pixels, every one a row; a Qwen2 decoder);
 * - gemma3: Gemma 3 (a SigLIP tower over 256 patches of 14 pixels, pooled 2×2 into 64 soft
 *   tokens; a decoder of sliding-window layers (a window of 512) and a full one, positions from 1).
 *
 * - 1 request: one streamed image chat at a time vs one generate() at a time: chats per second and
 *   time to first token.
 * - 8 concurrent: 8 image chats at once (continuously batched) vs the same 8 through transformers.js
 *   called together (which runs them one after another); time to first token counts from when all 8
 *   arrive.
 * - The vision encoder on Eric (`/embeddings`, one image a request, 8 at once, the features sent
 *   through the sidecar and drained by a receiver, as encoder fission sends them) against a direct
 *   loop of the same preprocessing and the same vision_encoder.onnx in this process: images per
 *   second.
 *
 * Each image is different (a gradient of its own colours), so nothing is cached. Greedy answers
 * through the API are checked against transformers.js's. Runs alternate between the two sides in
 * rounds; the ratios are medians. Prints a table, then (as the last line) one JSON object.
 *
 * BENCH_SIZE=2b runs Qwen2-VL alone at Qwen2-VL-2B's geometry instead (`bench/qwen2-vl-2b`: a fp32
 * vision encoder of 32 blocks at 1280 wide, a 4-bit decoder of 28 layers at 1536 wide and Qwen's
 * vocabulary; about 4.6 GB, built into the model folder on first use with its build time printed),
 * both sides running the decoder at q4; it also prints the peak resident memory of the LLM
 * executor's and Eric's workers against the bytes of the weights they load.
 *
 * Env: BENCH_ROUNDS (default 3), BENCH_THREADS (ONNX Runtime threads, default 2), BENCH_TOKENS
 * (at most this many tokens a chat, default 16; both sides stop at the end of sequence),
 * BENCH_FAMILY (qwen2vl, qwen3vl, gemma3, llava-onevision, or all: the default), BENCH_SIZE
 * (small, the default, or 2b).
 */
import { existsSync, statSync } from "node:fs"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { basename, dirname, join } from "node:path"
import {
  AutoModelForImageTextToText,
  AutoProcessor,
  AutoTokenizer,
  env,
  RawImage,
  type Tensor
} from "@huggingface/transformers"
import * as ort from "onnxruntime-node"
import sharp from "sharp"
import { fixedSizeImage, qwen2VLImage } from "../src/executors/common/media/preprocess.js"
import { gemma3ProcessorConfig } from "../src/models/Gemma3Processor.js"
import { llavaOnevisionProcessorConfig } from "../src/models/LlavaOnevisionProcessor.js"
import { loadModelDirectory } from "../src/models/ModelDirectory.js"
import { resolveModel } from "../src/models/ModelStore.js"
import { qwen2VLProcessor } from "../src/models/Qwen2VLProcessor.js"
import { randomGemma3, tinyGemma3Config } from "../src/models/recipes/RandomGemma3.js"
import { randomLlavaOnevision, tinyLlavaOnevisionConfig } from "../src/models/recipes/RandomLlavaOnevision.js"
import { qwen2VLVocabulary, randomQwen2VLFiles } from "../src/models/recipes/RandomQwen2VL.js"
import { randomQwen3VLFiles, tinyQwen3VLConfig } from "../src/models/recipes/RandomQwen3VL.js"
import type { ModelFiles } from "../src/models/recipes/Recipe.js"
import { writeModelFiles } from "../test/models/support/SmolVlmFixture.js"
import { SidecarClient } from "../src/sidecar/SidecarClient.js"
import { descendants, executorHeaders, startExecutor, startSidecar } from "../test/support/executors.js"
import { median, round, streamed } from "./support/chat-stream.js"
import { peakRssOf } from "./support/processes.js"

const rounds = Number(process.env.BENCH_ROUNDS ?? 3)
const threads = Number(process.env.BENCH_THREADS ?? 2)
const tokens = Number(process.env.BENCH_TOKENS ?? 16)
const concurrency = 8
const side = 224
const question = "Describe the picture"
const targets = { single: 1, concurrent: 2, encoder: 0.9 }
const size = process.env.BENCH_SIZE ?? "small"
if (size !== "small" && size !== "2b") throw new Error(`BENCH_SIZE=${size}: small or 2b`)

/** A 224×224 PNG of its own colours. */
const image = (seed: number): Promise<Buffer> => {
  const data = Buffer.alloc(side * side * 3)
  for (let y = 0; y < side; y++) {
    for (let x = 0; x < side; x++) {
      const at = (y * side + x) * 3
      data[at] = (x * 255) / side
      data[at + 1] = (y * 255) / side
      data[at + 2] = ((x + y) * (seed * 13 + 7) + seed * 31) % 256
    }
  }
  return sharp(data, { raw: { width: side, height: side, channels: 3 } })
    .png()
    .toBuffer()
}

const dataUrl = (png: Buffer) => `data:image/png;base64,${png.toString("base64")}`

/** What differs from one family to the next. */
interface Family {
  readonly name: string
  readonly described: string
  readonly reference: string
  /** The model's files, written to a folder of the run's own; or a model the store builds (a bench recipe's name). */
  readonly files: (() => ModelFiles) | { readonly recipe: string }
  /** The decoder's dtype on both sides, where it is not fp32. */
  readonly decoderDtype?: "q4"
  /** transformers.js's processor options: Gemma 3's chat template writes the <bos> itself. */
  readonly processorOptions: Record<string, unknown>
  /** The vision encoder's feeds for an image, preprocessed as the executors do. */
  readonly encoderFeeds: (model: string) => Promise<(png: Buffer) => Promise<Record<string, ort.Tensor>>>
  /** The chunks Eric sends an image's encoding in. */
  readonly ericChunks: number
  /** The rows an image takes in the prompt. */
  readonly visionTokens: number
  /**
   * transformers.js's inputs for a chat with an image, where its processor does not make them
   * itself (LLaVA-OneVision: no processor class, the prompt spelled out by hand); by default its
   * AutoProcessor's on the chat template's prompt.
   */
  readonly referenceInputs?: (model: string) => Promise<(png: Buffer) => Promise<Record<string, unknown>>>
}

const floats = (tensor: { readonly data: unknown; readonly shape: ReadonlyArray<number> }) =>
  new ort.Tensor("float32", tensor.data as Float32Array, tensor.shape as Array<number>)

const qwen2VLFamily: Family = {
  name: "qwen2vl",
  described: "random Qwen2-VL (vision 8×512, decoder 6×512)",
  reference: "Qwen2VLForConditionalGeneration",
  files: () => qwen2VLBenchFiles(),
  processorOptions: {},
  encoderFeeds: async (model) => {
    const processor = qwen2VLProcessor((await loadModelDirectory(model)).preprocessorConfig!)
    return async (png) => {
      const { inputs, thw } = await qwen2VLImage({ bytes: new Uint8Array(png), processor })
      return {
        pixel_values: floats(inputs.pixel_values!),
        grid_thw: new ort.Tensor("int64", BigInt64Array.from(thw!, BigInt), [1, 3])
      }
    }
  },
  // The patch grid, then the features.
  ericChunks: 2,
  visionTokens: 64
}

const gemma3Family: Family = {
  name: "gemma3",
  described: "random Gemma 3 (SigLIP 8×512 pooled to 64 soft tokens, decoder 6×512: 5 sliding layers, 1 full)",
  reference: "Gemma3ForConditionalGeneration",
  files: () => {
    const tiny = tinyGemma3Config(randomGemma3().config.text.vocabSize)
    return randomGemma3({
      seed: 11,
      config: {
        vision: { ...tiny.vision, hiddenSize: 512, intermediateSize: 2048, layers: 8, heads: 8, imageSize: side },
        text: {
          ...tiny.text,
          hiddenSize: 512,
          intermediateSize: 1408,
          layers: 6,
          heads: 8,
          kvHeads: 2,
          headDim: 64,
          maxPositions: 4096,
          queryPreAttnScalar: 64,
          slidingWindow: 512,
          layerTypes: [...Array.from({ length: 5 }, () => "sliding_attention" as const), "full_attention"]
        },
        mmTokensPerImage: 64
      }
    }).files
  },
  processorOptions: { add_special_tokens: false },
  encoderFeeds: async (model) => {
    const config = gemma3ProcessorConfig(await loadModelDirectory(model))
    return async (png) => ({
      pixel_values: floats((await fixedSizeImage({ bytes: new Uint8Array(png), config })).inputs.pixel_values!)
    })
  },
  ericChunks: 1,
  visionTokens: 64
}

const qwen3VLFamily: Family = {
  name: "qwen3vl",
  described: "random Qwen3-VL (vision 8×512 over 196 patches of 16 pixels, merged 2×2; decoder 6×512)",
  reference: "Qwen3VLForConditionalGeneration",
  files: () => {
    const vocabSize = qwen2VLVocabulary().vocabSize
    const tiny = tinyQwen3VLConfig(vocabSize)
    return randomQwen3VLFiles({
      seed: 11,
      config: {
        vision: {
          ...tiny.vision,
          depth: 8,
          hiddenSize: 512,
          heads: 8,
          intermediateSize: 2048,
          outHiddenSize: 512,
          numPositionEmbeddings: 2304
        },
        text: {
          ...tiny.text,
          hiddenSize: 512,
          intermediateSize: 1408,
          layers: 6,
          heads: 8,
          kvHeads: 2,
          headDim: 64,
          mropeSection: [16, 8, 8]
        }
      },
      maxPixels: side * side
    }).files
  },
  processorOptions: {},
  encoderFeeds: async (model) => {
    const processor = qwen2VLProcessor((await loadModelDirectory(model)).preprocessorConfig!)
    return async (png) => {
      const { inputs, thw } = await qwen2VLImage({ bytes: new Uint8Array(png), processor })
      return {
        pixel_values: floats(inputs.pixel_values!),
        image_grid_thw: new ort.Tensor("int64", BigInt64Array.from(thw!, BigInt), [1, 3])
      }
    }
  },
  ericChunks: 2,
  visionTokens: 49
}

const llavaOnevisionFamily: Family = {
  name: "llava-onevision",
  described: "random LLaVA-OneVision (SigLIP 8×512 over 64 patches of 28 pixels, a Qwen2 decoder 6×512)",
  reference: "LlavaOnevisionForConditionalGeneration",
  files: () => {
    const tiny = tinyLlavaOnevisionConfig(randomLlavaOnevision().config.text.vocabSize)
    return randomLlavaOnevision({
      seed: 11,
      config: {
        ...tiny,
        vision: {
          ...tiny.vision,
          hiddenSize: 512,
          intermediateSize: 2048,
          layers: 8,
          heads: 8,
          imageSize: side,
          patchSize: 28
        },
        text: {
          ...tiny.text,
          hiddenSize: 512,
          intermediateSize: 1408,
          layers: 6,
          heads: 8,
          kvHeads: 2,
          maxPositions: 4096
        }
      }
    }).files
  },
  processorOptions: {},
  encoderFeeds: async (model) => {
    const config = llavaOnevisionProcessorConfig(await loadModelDirectory(model))
    return async (png) => ({
      pixel_values: floats((await fixedSizeImage({ bytes: new Uint8Array(png), config })).inputs.pixel_values!)
    })
  },
  ericChunks: 1,
  visionTokens: 64,
  // transformers.js has no LLaVA-OneVision processor: its image processor's pixels, and the chat
  // template's <image> spelled out once a row, as its masked scatter needs.
  referenceInputs: async (id) => {
    const processor = await AutoProcessor.from_pretrained(id)
    const tokenizer = await AutoTokenizer.from_pretrained(id)
    const prompt = (
      tokenizer.apply_chat_template(
        [{ role: "user", content: [{ type: "image" }, { type: "text", text: question }] }] as never,
        { add_generation_prompt: true, tokenize: false }
      ) as string
    ).replace("<image>", "<image>".repeat(64))
    return async (png) => ({
      ...tokenizer(prompt),
      ...(await processor(await RawImage.fromBlob(new Blob([new Uint8Array(png)]))))
    })
  }
}

/** Qwen2-VL at 2B's geometry, the decoder at 4 bits. */
const qwen2VL2bFamily: Family = {
  ...qwen2VLFamily,
  described: "random Qwen2-VL at 2B's geometry (vision 32×1280 fp32, decoder 28×1536 q4)",
  files: { recipe: "bench/qwen2-vl-2b" },
  decoderDtype: "q4"
}

const families: ReadonlyArray<Family> =
  size === "2b" ? [qwen2VL2bFamily] : [qwen2VLFamily, qwen3VLFamily, gemma3Family, llavaOnevisionFamily]

export default async function vlmBench(): Promise<void> {
  const asked = process.env.BENCH_FAMILY ?? "all"
  const chosen = families.filter((family) => asked === "all" || family.name === asked)
  if (chosen.length === 0)
    throw new Error(`BENCH_FAMILY ${asked}: not one of ${families.map((family) => family.name).join(", ")}, all`)
  const results: Array<Record<string, unknown>> = []
  for (const family of chosen) results.push(await benchFamily(family))
  console.log(JSON.stringify({ bench: "vlm", threads, rounds, tokens, families: results, targets }))
}

const qwen2VLBenchFiles = (): ModelFiles => {
  const vocabSize = qwen2VLVocabulary().vocabSize
  return randomQwen2VLFiles({
    seed: 11,
    config: {
      vision: {
        depth: 8,
        embedDim: 512,
        heads: 8,
        mlpRatio: 4,
        inChannels: 3,
        patchSize: 14,
        temporalPatchSize: 2,
        spatialMergeSize: 2
      },
      text: {
        hiddenSize: 512,
        intermediateSize: 1408,
        layers: 6,
        heads: 8,
        kvHeads: 2,
        vocabSize,
        maxPositions: 4096,
        ropeTheta: 1000000,
        rmsNormEps: 1e-6,
        mropeSection: [8, 12, 12],
        tieWordEmbeddings: false
      }
    },
    maxPixels: side * side
  }).files
}

/** The bytes of onnx/<stem><suffix>.onnx and its external data. */
const onnxBytes = (model: string, file: string): number =>
  [file, `${file}_data`]
    .map((name) => join(model, "onnx", name))
    .filter((path) => existsSync(path))
    .reduce((sum, path) => sum + statSync(path).size, 0)

/**
 * The peak resident memory of the LLM executor's and Eric's workers (the largest process under
 * each) beside the bytes of the weights each loads: the LLM the vision encoder, the embeddings and
 * the decoder (it encodes images itself when called directly); Eric the vision encoder.
 */
const workerPeaks = (model: string, decoderDtype: string | undefined, llmPid: number, ericPid: number) => {
  const vision = onnxBytes(model, "vision_encoder.onnx")
  const suffix = decoderDtype === undefined ? "" : `_${decoderDtype}`
  const peak = (pid: number) => Math.max(...descendants(pid).map((entry) => peakRssOf(entry.pid)))
  return {
    llm: {
      peakBytes: peak(llmPid),
      weightBytes:
        vision + onnxBytes(model, `embed_tokens${suffix}.onnx`) + onnxBytes(model, `decoder_model_merged${suffix}.onnx`)
    },
    eric: { peakBytes: peak(ericPid), weightBytes: vision }
  }
}

/** One family's runs; prints its table and answers its figures. */
async function benchFamily(family: Family): Promise<Record<string, unknown>> {
  const root = await mkdtemp(join(tmpdir(), "cornserve-bench-vlm-"))
  let model = join(root, `${family.name}-bench`)
  if (typeof family.files === "function") await writeModelFiles(model, family.files())
  else {
    const started = performance.now()
    model = await resolveModel(family.files.recipe)
    console.error(`vlm bench: ${family.files.recipe} ready in ${round((performance.now() - started) / 1000, 1)} s`)
  }
  console.error(`vlm bench: ${model}, ${tokens} tokens a chat, ${threads} threads, ${rounds} rounds`)

  env.allowRemoteModels = false
  env.localModelPath = dirname(model)
  const processor = await AutoProcessor.from_pretrained(basename(model))
  const vlm = await AutoModelForImageTextToText.from_pretrained(basename(model), {
    dtype:
      family.decoderDtype === undefined
        ? "fp32"
        : { vision_encoder: "fp32", embed_tokens: family.decoderDtype, decoder_model_merged: family.decoderDtype },
    session_options: { intraOpNumThreads: threads, interOpNumThreads: 1 }
  })
  const tokenizer = await AutoTokenizer.from_pretrained(basename(model))
  const prompt = tokenizer.apply_chat_template(
    [{ role: "user", content: [{ type: "image" }, { type: "text", text: question }] }] as never,
    { add_generation_prompt: true, tokenize: false }
  ) as string
  const referenceInputs =
    (await family.referenceInputs?.(basename(model))) ??
    (async (png: Buffer) =>
      processor(prompt, await RawImage.fromBlob(new Blob([new Uint8Array(png)])), family.processorOptions))
  /** transformers.js's greedy answer and its time to first token (from `origin`). */
  const reference = async (png: Buffer, origin: number) => {
    const inputs = (await referenceInputs(png)) as Record<string, unknown> & { readonly input_ids: Tensor }
    let puts = 0
    let firstAt = 0
    const streamer = {
      put: () => {
        if (++puts === 2) firstAt = performance.now()
      },
      end: () => {}
    }
    const output = (await vlm.generate({
      ...inputs,
      max_new_tokens: tokens,
      do_sample: false,
      streamer: streamer as never
    })) as Tensor
    const length = (inputs.input_ids as Tensor).dims[1]!
    const generated = Array.from(output.data as BigInt64Array, Number).slice(length)
    return { text: tokenizer.decode(generated, { skip_special_tokens: true }), ttft: firstAt - origin }
  }

  // The model is a directory of the bench's own: the executors are allowed its root.
  const allowRoot = { CORNSERVE_MODEL_ROOTS: dirname(model) }
  const dtypeArgs = family.decoderDtype === undefined ? [] : ["--dtype", family.decoderDtype]
  const llm = await startExecutor(
    [
      "--kind",
      "llm",
      "--model",
      model,
      "--devices",
      "cpu:0",
      "--threads-per-device",
      String(threads),
      "--max-batch-size",
      String(concurrency),
      ...dtypeArgs
    ],
    allowRoot
  )
  const sidecar = await startSidecar("bench-vlm", {})
  const eric = await startExecutor(
    [
      "--kind",
      "eric",
      "--model",
      model,
      "--devices",
      "cpu:0",
      "--threads-per-device",
      String(threads),
      "--max-batch-size",
      String(concurrency),
      "--max-batch-delay-ms",
      "0",
      "--sidecar-socket",
      sidecar.socket
    ],
    allowRoot
  )
  const stop = () => {
    llm.process.kill("SIGTERM")
    eric.process.kill("SIGTERM")
  }
  process.once("SIGINT", stop)
  const encoderFeeds = await family.encoderFeeds(model)
  const vision = await ort.InferenceSession.create(join(model, "onnx", "vision_encoder.onnx"), {
    intraOpNumThreads: threads,
    interOpNumThreads: 1,
    executionMode: "sequential"
  })
  const receiver = await SidecarClient.connect(sidecar.socket)
  try {
    const api = (png: Buffer, origin: number) =>
      streamed(
        llm.url,
        model,
        [
          { type: "image_url", image_url: { url: dataUrl(png) } },
          { type: "text", text: question }
        ],
        tokens,
        origin,
        // Both sides stop at the end of sequence, so that their answers can be compared.
        { ignore_eos: false }
      )
    const direct = async (png: Buffer) => {
      await vision.run(await encoderFeeds(png))
    }
    let nextId = 0
    const encode = async (png: Buffer) => {
      const id = `bench-${nextId++}`
      const response = await fetch(`${eric.url}/embeddings`, {
        method: "POST",
        headers: executorHeaders({ "content-type": "application/json" }),
        body: JSON.stringify({ items: [{ id, modality: "image", url: dataUrl(png) }] })
      })
      if (response.status !== 200) throw new Error(`Eric answered ${response.status}: ${await response.text()}`)
      await response.arrayBuffer()
      for (let chunk = 0; chunk < family.ericChunks; chunk++) {
        await receiver.recv(id, chunk, { timeoutMs: 10_000 })
        await receiver.markDone(id, chunk)
      }
    }

    let serial = 0
    const fresh = () => Promise.all(Array.from({ length: concurrency }, () => image(serial++)))

    // Warm-up, and the answers through the API are transformers.js's.
    const check = await fresh()
    let mismatches = 0
    for (const png of check.slice(0, 3)) {
      const [expected, answered] = [await reference(png, 0), await api(png, performance.now())]
      if (expected.text !== answered.text) {
        mismatches++
        console.error(
          `  differs: transformers.js ${JSON.stringify(expected.text)}, API ${JSON.stringify(answered.text)}`
        )
      }
    }
    await direct(check[0]!)
    await encode(check[0]!)

    const samples = {
      single: {
        ref: [] as Array<number>,
        api: [] as Array<number>,
        refTtft: [] as Array<number>,
        apiTtft: [] as Array<number>
      },
      concurrent: {
        ref: [] as Array<number>,
        api: [] as Array<number>,
        refTtft: [] as Array<number>,
        apiTtft: [] as Array<number>
      },
      encoder: { ref: [] as Array<number>, api: [] as Array<number> }
    }
    const ratios = { single: [] as Array<number>, concurrent: [] as Array<number>, encoder: [] as Array<number> }
    for (let r = 0; r < rounds; r++) {
      // 1 request: pairs alternate which side goes first.
      for (let pair = 0; pair < 2; pair++) {
        const [png] = await fresh()
        const runRef = async () => {
          const start = performance.now()
          const run = await reference(png!, start)
          return { seconds: (performance.now() - start) / 1000, ttft: run.ttft }
        }
        const runApi = async () => {
          const start = performance.now()
          const run = await api(png!, start)
          return { seconds: (performance.now() - start) / 1000, ttft: run.firstTokenMs }
        }
        const [ref, ours] =
          pair % 2 === 0
            ? [await runRef(), await runApi()]
            : await runApi().then(async (a) => [await runRef(), a] as const)
        samples.single.ref.push(1 / ref.seconds)
        samples.single.api.push(1 / ours.seconds)
        samples.single.refTtft.push(ref.ttft)
        samples.single.apiTtft.push(ours.ttft)
        ratios.single.push(ref.seconds / ours.seconds)
      }
      // 8 at once.
      {
        const pngs = await fresh()
        const start = performance.now()
        const refRuns = await Promise.all(pngs.map((png) => reference(png, start)))
        const refSeconds = (performance.now() - start) / 1000
        const apiStart = performance.now()
        const apiRuns = await Promise.all(pngs.map((png) => api(png, apiStart)))
        const apiSeconds = (performance.now() - apiStart) / 1000
        samples.concurrent.ref.push(concurrency / refSeconds)
        samples.concurrent.api.push(concurrency / apiSeconds)
        samples.concurrent.refTtft.push(refRuns.reduce((sum, run) => sum + run.ttft, 0) / concurrency)
        samples.concurrent.apiTtft.push(apiRuns.reduce((sum, run) => sum + run.firstTokenMs, 0) / concurrency)
        ratios.concurrent.push(refSeconds / apiSeconds)
      }
      // The vision encoder: 24 images (8 at 2B), Eric (8 requests at a time) vs the direct loop.
      {
        const pngs = size === "2b" ? await fresh() : [...(await fresh()), ...(await fresh()), ...(await fresh())]
        const directStart = performance.now()
        for (const png of pngs) await direct(png)
        const directSeconds = (performance.now() - directStart) / 1000
        const ericStart = performance.now()
        let taken = 0
        await Promise.all(
          Array.from({ length: concurrency }, async () => {
            while (taken < pngs.length) await encode(pngs[taken++]!)
          })
        )
        const ericSeconds = (performance.now() - ericStart) / 1000
        samples.encoder.ref.push(pngs.length / directSeconds)
        samples.encoder.api.push(pngs.length / ericSeconds)
        ratios.encoder.push(directSeconds / ericSeconds)
      }
      console.error(
        `  round ${r + 1}: 1 request ${round(ratios.single.at(-1)!)}×, 8 concurrent ${round(ratios.concurrent.at(-1)!)}×, encoder ${round(ratios.encoder.at(-1)!)}×`
      )
    }

    const figure = (values: ReadonlyArray<number>, digits = 2) => round(median(values), digits)
    const rows = [
      [
        "1 request",
        "image chats/s",
        figure(samples.single.ref),
        figure(samples.single.api),
        figure(ratios.single, 3),
        `≥ ${targets.single}`
      ],
      ["", "TTFT ms", figure(samples.single.refTtft, 1), figure(samples.single.apiTtft, 1), "", ""],
      [
        "8 concurrent",
        "image chats/s",
        figure(samples.concurrent.ref),
        figure(samples.concurrent.api),
        figure(ratios.concurrent, 3),
        `≥ ${targets.concurrent}`
      ],
      ["", "TTFT ms (mean)", figure(samples.concurrent.refTtft, 1), figure(samples.concurrent.apiTtft, 1), "", ""],
      [
        "vision encoder",
        "images/s",
        figure(samples.encoder.ref),
        figure(samples.encoder.api),
        figure(ratios.encoder, 3),
        `≥ ${targets.encoder}`
      ]
    ]
    const table = [
      ["load", "measure", "baseline", "cornserve", "ratio", "target"],
      ...rows.map((row) => row.map(String))
    ]
    const widths = table[0]!.map((_, column) => Math.max(...table.map((row) => row[column]!.length)))
    console.log(
      `vlm bench, ${family.name}: ${family.described}, ${side}×${side} images (${family.visionTokens} vision tokens), ${tokens} greedy tokens a chat, ${threads} ORT threads each side, medians over ${rounds} rounds`
    )
    console.log(
      `baseline: transformers.js ${family.reference} (chats), a direct ONNX Runtime loop of the same preprocessing and vision_encoder.onnx (encoder)`
    )
    for (const row of table) console.log(row.map((cell, column) => cell.padEnd(widths[column]!)).join("  "))
    const memory = workerPeaks(model, family.decoderDtype, llm.process.pid!, eric.process.pid!)
    for (const [role, figures] of Object.entries(memory))
      console.log(
        `${role} worker: peak resident ${round(figures.peakBytes / 1e9, 2)} GB, its weights' files ${round(figures.weightBytes / 1e9, 2)} GB (${round(figures.peakBytes / figures.weightBytes, 2)} ×)`
      )
    return {
      family: family.name,
      memory,
      answersDifferingFromTransformersJs: mismatches,
      single: {
        transformersJsChatsPerSecond: figure(samples.single.ref),
        apiChatsPerSecond: figure(samples.single.api),
        transformersJsTtftMs: figure(samples.single.refTtft, 1),
        apiTtftMs: figure(samples.single.apiTtft, 1)
      },
      concurrent: {
        transformersJsChatsPerSecond: figure(samples.concurrent.ref),
        apiChatsPerSecond: figure(samples.concurrent.api),
        transformersJsTtftMs: figure(samples.concurrent.refTtft, 1),
        apiTtftMs: figure(samples.concurrent.apiTtft, 1)
      },
      encoder: {
        directImagesPerSecond: figure(samples.encoder.ref),
        ericImagesPerSecond: figure(samples.encoder.api)
      },
      ratios: {
        single: figure(ratios.single, 3),
        concurrent: figure(ratios.concurrent, 3),
        encoder: figure(ratios.encoder, 3)
      }
    }
  } catch (error) {
    // What the executors said last: a worker that died says why there.
    for (const [role, executor] of [
      ["LLM executor", llm],
      ["Eric", eric]
    ] as const)
      console.error(`${role}'s last output (exit ${executor.process.exitCode}):\n${executor.output().slice(-4000)}`)
    throw error
  } finally {
    process.off("SIGINT", stop)
    await receiver.close()
    await Promise.all([llm.stop(), eric.stop()])
    await sidecar.stop()
    await vision.release()
    await vlm.dispose()
    await rm(root, { recursive: true, force: true })
  }
}
