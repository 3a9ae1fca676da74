/**
 * Qwen2-VL image chats: a random-weight Qwen2-VL in the community's split layout (vision tower of
 * 8 blocks at 512 wide, a Qwen2 decoder of 6 layers at 512 wide; 224×224 images, 256 patches, 64
 * vision tokens a prompt) through the LLM executor's chat API, against transformers.js's
 * Qwen2VLForConditionalGeneration on the same files in this process, with the same ONNX Runtime
 * thread count, in the same run.
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
 * Env: BENCH_ROUNDS (default 3), BENCH_THREADS (ONNX Runtime threads, default 2), BENCH_TOKENS
 * (at most this many tokens a chat, default 16; both sides stop at the end of sequence).
 */
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { basename, dirname, join } from "node:path"
import { AutoModelForImageTextToText, AutoProcessor, env, RawImage, type Tensor } from "@huggingface/transformers"
import * as ort from "onnxruntime-node"
import sharp from "sharp"
import { qwen2VLImage } from "../src/executors/common/media/preprocess.js"
import { qwen2VLProcessor } from "../src/models/Qwen2VLProcessor.js"
import { qwen2VLVocabulary, randomQwen2VLFiles } from "../src/models/recipes/RandomQwen2VL.js"
import { writeModelFiles } from "../test/models/support/SmolVlmFixture.js"
import { SidecarClient } from "../src/sidecar/SidecarClient.js"
import { executorHeaders, startExecutor, startSidecar } from "../test/support/executors.js"
import { median, round, streamed } from "./support/chat-stream.js"

const rounds = Number(process.env.BENCH_ROUNDS ?? 3)
const threads = Number(process.env.BENCH_THREADS ?? 2)
const tokens = Number(process.env.BENCH_TOKENS ?? 16)
const concurrency = 8
const side = 224
const question = "Describe the picture"
const targets = { single: 1, concurrent: 2, encoder: 0.9 }

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

export default async function vlmBench(): Promise<void> {
  const vocabSize = qwen2VLVocabulary().vocabSize
  const fixture = randomQwen2VLFiles({
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
  })
  const root = await mkdtemp(join(tmpdir(), "cornserve-bench-vlm-"))
  const model = join(root, "qwen2-vl-bench")
  await writeModelFiles(model, fixture.files)
  console.error(`vlm bench: ${model}, ${tokens} tokens a chat, ${threads} threads, ${rounds} rounds`)

  env.allowRemoteModels = false
  env.localModelPath = dirname(model)
  const processor = await AutoProcessor.from_pretrained(basename(model))
  const vlm = await AutoModelForImageTextToText.from_pretrained(basename(model), {
    dtype: "fp32",
    session_options: { intraOpNumThreads: threads, interOpNumThreads: 1 }
  })
  const prompt = processor.apply_chat_template(
    [{ role: "user", content: [{ type: "image" }, { type: "text", text: question }] }],
    { add_generation_prompt: true }
  ) as string
  /** transformers.js's greedy answer and its time to first token (from `origin`). */
  const reference = async (png: Buffer, origin: number) => {
    const inputs = await processor(prompt, await RawImage.fromBlob(new Blob([new Uint8Array(png)])))
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
    return { text: processor.tokenizer!.decode(generated, { skip_special_tokens: true }), ttft: firstAt - origin }
  }

  // The model is a directory of the bench's own: the executors are allowed its root.
  const allowRoot = { CORNSERVE_MODEL_ROOTS: root }
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
      String(concurrency)
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
  const encoderProcessor = qwen2VLProcessor(
    JSON.parse(new TextDecoder().decode(fixture.files.get("preprocessor_config.json")!))
  )
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
      const { inputs, thw } = await qwen2VLImage({ bytes: new Uint8Array(png), processor: encoderProcessor })
      const pixels = inputs.pixel_values!
      await vision.run({
        pixel_values: new ort.Tensor("float32", pixels.data as Float32Array, pixels.shape as Array<number>),
        grid_thw: new ort.Tensor("int64", BigInt64Array.from(thw!, BigInt), [1, 3])
      })
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
      // The patch grid, then the features.
      for (const chunk of [0, 1]) {
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
      // The vision encoder: 24 images, Eric (8 requests at a time) vs the direct loop.
      {
        const pngs = [...(await fresh()), ...(await fresh()), ...(await fresh())]
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
      `vlm bench: random Qwen2-VL (vision 8×512, decoder 6×512), ${side}×${side} images (64 vision tokens), ${tokens} greedy tokens a chat, ${threads} ORT threads each side, medians over ${rounds} rounds`
    )
    console.log(
      "baseline: transformers.js Qwen2VLForConditionalGeneration (chats), a direct ONNX Runtime loop of the same preprocessing and vision_encoder.onnx (encoder)"
    )
    for (const row of table) console.log(row.map((cell, column) => cell.padEnd(widths[column]!)).join("  "))
    console.log(
      JSON.stringify({
        bench: "vlm",
        threads,
        rounds,
        tokens,
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
        },
        targets
      })
    )
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
