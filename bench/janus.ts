/**
 * Janus-Pro text to image: a random-weight Janus-Pro at Janus-Pro's image geometry (576 image tokens
 * on a 24 × 24 grid, a 16384-entry codebook of 8-wide entries, decoded with 4 upsamplings to 384 ×
 * 384 pixels) with a language model much smaller than Janus-Pro-1B's (hidden 256, 4 layers, 4 heads
 * of 64, ffn 704; Janus-Pro-1B is hidden 2048 with 24 layers), in the community's layout
 * (onnx-community/Janus-Pro-1B-ONNX), against transformers.js's
 * `MultiModalityCausalLM.generate_images` on the same files in this process, greedy (`do_sample:
 * false`, min_new_tokens = max_new_tokens = the image's tokens, the model's guidance scale 5, so two
 * rows a step), with the same ONNX Runtime thread count, in the same run.
 *
 * The language model is this small so that the run fits a 2-core machine: at hidden 512 with 8
 * layers transformers.js took 32 s an image (ours 13 s), at hidden 512 with 2 layers 17 s (ours 6 s);
 * at hidden 256 with 4 layers about 13 s (ours about 3.5 s), and 3 rounds of 5 prompts take about
 * 7.5 minutes.
 *
 * Ours is the platform's two executors as real processes on one node, called as the task dispatcher
 * calls them for examples/janus.ts's task, without the gateway and the app in front: the LLM
 * executor's `POST /v1/cornserve/image-tokens` (the prompt in the "text_to_image" template, the image
 * tokens chosen with classifier-free guidance and sent through the node's sidecar) and, at the same
 * time, Geri's `POST /generate` (which takes the tokens from the sidecar and answers a PNG). A
 * request's time runs from sending both to Geri's answer.
 *
 * - 1 request: one image at a time on each side: seconds an image, images per second.
 * - 4 concurrent: 4 images asked for at once vs 4 generate_images calls started together
 *   (Promise.all): images per second.
 *
 * The codebook reaches beyond the recipe's end of sentence token (id 320 of its 327-token
 * vocabulary), which the recipe refuses (transformers.js stops a generation on it whatever head
 * chose it), so the bench asks the recipe for a vocabulary padded to the codebook plus 1024 (its
 * special tokens last, above the codebook).
 *
 * Every image of ours is checked against transformers.js's for the same prompt in the same
 * measurement: the PNG's RGB bytes equal to generate_images' pixels, byte for byte. Runs alternate
 * which side goes first in rounds; the ratios are medians. Prints a table, then (as the last line)
 * one JSON object.
 *
 * Env: BENCH_ROUNDS (default 3), BENCH_THREADS (ONNX Runtime threads of each side's sessions, and
 * of each executor, default 2), BENCH_SMALL=1 (the recipe's tiny test geometry: 16 image tokens of a
 * 256-entry codebook, 64 × 64 pixels, a 2-layer 64-wide language model, for a quick try).
 */
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { AutoProcessor, MultiModalityCausalLM, type Processor, type RawImage } from "@huggingface/transformers"
import sharp from "sharp"
import type { ImageAnswer } from "../src/executors/geri/api.js"
import type { ImageTokensRequest } from "../src/executors/llm/api.js"
import { type JanusConfig, janusImageSide } from "../src/models/architectures/Janus.js"
import { janusTokens, janusVocabulary, randomJanusFiles } from "../src/models/recipes/RandomJanus.js"
import type { ModelFiles } from "../src/models/recipes/Recipe.js"
import { writeModelFiles } from "../test/models/support/SmolVlmFixture.js"
import { offline } from "../test/models/support/TransformersJs.js"
import { executorHeaders, startExecutor, startSidecar } from "../test/support/executors.js"
import { median, round } from "./support/chat-stream.js"

const rounds = Number(process.env.BENCH_ROUNDS ?? 3)
const threads = Number(process.env.BENCH_THREADS ?? 2)
const small = process.env.BENCH_SMALL === "1"
const concurrency = 4
const seed = 7
const targets = { single: 1, concurrent: 1 }

type Geometry = Omit<JanusConfig, "language"> & { readonly language: Omit<JanusConfig["language"], "vocabSize"> }

/** Janus-Pro's image geometry with a small language model, or (BENCH_SMALL=1) the recipe's tiny one. */
const geometry: Geometry = small
  ? {
      visionHidden: 32,
      codebookSize: 256,
      codebookDim: 8,
      imageTokens: 16,
      upsamplings: 4,
      decoderChannels: 16,
      language: {
        hiddenSize: 64,
        intermediateSize: 128,
        layers: 2,
        heads: 4,
        kvHeads: 4,
        headDim: 16,
        maxPositions: 1024,
        ropeTheta: 10000,
        rmsNormEps: 1e-6
      }
    }
  : {
      visionHidden: 32,
      codebookSize: 16384,
      codebookDim: 8,
      imageTokens: 576,
      upsamplings: 4,
      decoderChannels: 16,
      language: {
        hiddenSize: 256,
        intermediateSize: 704,
        layers: 4,
        heads: 4,
        kvHeads: 4,
        headDim: 64,
        maxPositions: 1024,
        ropeTheta: 10000,
        rmsNormEps: 1e-6
      }
    }

const prompts = [
  "A red fox in the sky",
  "A blue house with a tree",
  "the green cat",
  "A picture of a red tree in the sky",
  "An image of the blue cat on a house"
]

/**
 * The recipe's files at the geometry. The recipe refuses a codebook that reaches its end of
 * sentence token: for Janus-Pro's the vocabulary is padded past the codebook, so that its special
 * tokens, last, get ids above it.
 */
const janusFiles = (): ModelFiles => {
  const padded = geometry.codebookSize > janusVocabulary().tokenId(janusTokens.endOfSentence)
  return randomJanusFiles({ seed, geometry, ...(padded ? { vocabSize: geometry.codebookSize + 1024 } : {}) }).files
}

/** One image painted by one side: its RGB bytes, channels last, and how long it took. */
interface Painted {
  readonly rgb: Buffer
  readonly width: number
  readonly height: number
  readonly seconds: number
  /** Ours: when the LLM executor answered that the tokens were sent (seconds from the start). */
  readonly tokensSeconds?: number
}

export default async function janusBench(): Promise<void> {
  const root = await mkdtemp(join(tmpdir(), "cornserve-bench-janus-"))
  try {
    await benchIn(root)
  } finally {
    await rm(root, { recursive: true, force: true })
  }
}

/** The bench on a model written under `root` (which the caller removes). */
const benchIn = async (root: string): Promise<void> => {
  const model = join(root, "janus-bench")
  {
    // In a block: the files' bytes are garbage once written.
    const started = performance.now()
    await writeModelFiles(model, janusFiles())
    console.error(`janus bench: model written in ${round((performance.now() - started) / 1000, 1)} s`)
  }
  const side = janusImageSide({ ...geometry, language: { ...geometry.language, vocabSize: 0 } })
  console.error(
    `janus bench: ${model}, ${small ? "small" : "Janus-Pro image"} geometry (${geometry.imageTokens} tokens, ${side} px), ${threads} threads, ${rounds} rounds`
  )

  const processor: Processor = await AutoProcessor.from_pretrained(offline(model))
  const janus = (await MultiModalityCausalLM.from_pretrained(offline(model), {
    dtype: "fp32",
    session_options: { intraOpNumThreads: threads, interOpNumThreads: 1 }
  })) as MultiModalityCausalLM

  // The node's sidecar, and the two executors as the node agent starts them for examples/janus.ts's
  // tasks (the LLM with its defaults; Geri with its default batching), on a model directory of the
  // bench's own: they are allowed its root.
  const sidecar = await startSidecar("bench-janus")
  const allowRoot = { CORNSERVE_MODEL_ROOTS: root }
  const executorArgs = (kind: string) => [
    "--kind",
    kind,
    "--model",
    model,
    "--devices",
    "cpu:0",
    "--threads-per-device",
    String(threads),
    "--sidecar-socket",
    sidecar.socket
  ]
  const started: Array<{ readonly process: { kill(signal: NodeJS.Signals): boolean }; stop(): Promise<void> }> = [
    sidecar
  ]
  const stop = () => {
    for (const running of started) running.process.kill("SIGTERM")
  }
  process.once("SIGINT", stop)
  try {
    const llm = await startExecutor(executorArgs("llm"), allowRoot)
    started.push(llm)
    const geri = await startExecutor(executorArgs("geri"), allowRoot)
    started.push(geri)

    const reference = async (prompt: string): Promise<Painted> => {
      const start = performance.now()
      const inputs = await processor([{ role: janusTokens.user, content: prompt }], { chat_template: "text_to_image" })
      const [image] = (await janus.generate_images({
        ...inputs,
        min_new_tokens: geometry.imageTokens,
        max_new_tokens: geometry.imageTokens,
        do_sample: false
      })) as Array<RawImage>
      const seconds = (performance.now() - start) / 1000
      if (image === undefined || image.channels !== 3) throw new Error("generate_images gave no RGB image")
      return { rgb: Buffer.from(image.data), width: image.width, height: image.height, seconds }
    }

    const post = async (url: string, body: unknown) => {
      const response = await fetch(url, {
        method: "POST",
        headers: executorHeaders({ "content-type": "application/json" }),
        body: JSON.stringify(body)
      })
      if (response.status !== 200) throw new Error(`${url} answered ${response.status}: ${await response.text()}`)
      return response.json()
    }

    let next = 0
    /** Ours: the image's tokens from the LLM executor and Geri's PNG of them, asked for together as the dispatcher does. */
    const api = async (prompt: string): Promise<Painted> => {
      const id = `bench-janus-${process.pid}-${next++}`
      const start = performance.now()
      const tokensBody: ImageTokensRequest = { model, prompt, id, receivers: [sidecar.nodeId] }
      const [tokensSeconds, answer] = await Promise.all([
        post(`${llm.url}/v1/cornserve/image-tokens`, tokensBody).then(() => (performance.now() - start) / 1000),
        post(`${geri.url}/generate`, { embeddings: id, stream: false }) as Promise<ImageAnswer>
      ])
      const seconds = (performance.now() - start) / 1000
      const { data, info } = await sharp(Buffer.from(answer.image, "base64"))
        .removeAlpha()
        .raw()
        .toBuffer({ resolveWithObject: true })
      return { rgb: data, width: info.width, height: info.height, seconds, tokensSeconds }
    }

    let compared = 0
    const mismatches: Array<{ readonly prompt: string; readonly mode: string; readonly detail: string }> = []
    /** Ours against transformers.js's image of the same prompt: the same size, the same RGB bytes. */
    const compare = (prompt: string, mode: string, expected: Painted, got: Painted) => {
      compared++
      if (expected.width === got.width && expected.height === got.height && expected.rgb.equals(got.rgb)) return
      let differing = 0
      let most = 0
      for (let i = 0; i < Math.min(expected.rgb.length, got.rgb.length); i++) {
        const difference = Math.abs(expected.rgb[i]! - got.rgb[i]!)
        most = Math.max(most, difference)
        if (difference > 0) differing++
      }
      const detail = `${got.width}×${got.height} (transformers.js ${expected.width}×${expected.height}), ${differing} bytes differing (by at most ${most})`
      mismatches.push({ prompt, mode, detail })
      console.error(`  ${mode} ${JSON.stringify(prompt)} differs: ${detail}`)
    }

    const single = {
      ref: [] as Array<number>,
      api: [] as Array<number>,
      ratio: [] as Array<number>,
      tokens: [] as Array<number>
    }
    const concurrent = { ref: [] as Array<number>, api: [] as Array<number>, ratio: [] as Array<number> }

    /** One prompt on each side, one at a time, the reference first when `refFirst`. */
    const measureSingle = async (prompt: string, refFirst: boolean, record: boolean) => {
      const [ref, ours] = refFirst
        ? [await reference(prompt), await api(prompt)]
        : await api(prompt).then(async (first) => [await reference(prompt), first] as const)
      compare(prompt, "1 request", ref, ours)
      if (!record) {
        console.error(
          `  warm-up image: transformers.js ${round(ref.seconds, 2)} s, ours ${round(ours.seconds, 2)} s (tokens sent after ${round(ours.tokensSeconds!, 2)} s)`
        )
        return
      }
      single.ref.push(ref.seconds)
      single.api.push(ours.seconds)
      single.ratio.push(ref.seconds / ours.seconds)
      single.tokens.push(ours.tokensSeconds!)
    }

    /** `concurrency` prompts at once on each side (ours all sent together; theirs generate_images calls together). */
    const measureConcurrent = async (batch: ReadonlyArray<string>, refFirst: boolean) => {
      const run = async (paint: (prompt: string) => Promise<Painted>) => {
        const start = performance.now()
        const images = await Promise.all(batch.map(paint))
        return { seconds: (performance.now() - start) / 1000, images }
      }
      const [ref, ours] = refFirst
        ? [await run(reference), await run(api)]
        : await run(api).then(async (first) => [await run(reference), first] as const)
      batch.forEach((prompt, index) => compare(prompt, "concurrent", ref.images[index]!, ours.images[index]!))
      concurrent.ref.push(batch.length / ref.seconds)
      concurrent.api.push(batch.length / ours.seconds)
      concurrent.ratio.push(ref.seconds / ours.seconds)
    }

    // Warm-up of both sides; its images are checked too.
    await measureSingle(prompts[0]!, true, false)
    const bench = performance.now()
    for (let r = 0; r < rounds; r++) {
      for (let index = 0; index < prompts.length; index++)
        await measureSingle(prompts[index]!, (r + index) % 2 === 0, true)
      // A different set of prompts each round.
      const batch = Array.from({ length: concurrency }, (_, k) => prompts[(r + k) % prompts.length]!)
      await measureConcurrent(batch, r % 2 === 1)
      console.error(
        `  round ${r + 1}: 1 request ${round(median(single.ratio.slice(-prompts.length)), 3)}× (transformers.js ${round(median(single.ref.slice(-prompts.length)), 2)} s, ours ${round(median(single.api.slice(-prompts.length)), 2)} s), ${concurrency} concurrent ${round(concurrent.ratio.at(-1)!, 3)}× (${round(concurrent.ref.at(-1)!, 3)} vs ${round(concurrent.api.at(-1)!, 3)} images/s), ${round((performance.now() - bench) / 1000, 0)} s`
      )
    }

    const figure = (values: ReadonlyArray<number>, digits = 3) => round(median(values), digits)
    const perSecond = (seconds: ReadonlyArray<number>) => round(1 / median(seconds), 3)
    const table = [
      ["load", "measure", "transformers.js", "cornserve", "ratio", "target"],
      ...[
        [
          "1 request",
          "s per image (lower is better)",
          figure(single.ref),
          figure(single.api),
          figure(single.ratio),
          `≥ ${targets.single}`
        ],
        ["", "images/s", perSecond(single.ref), perSecond(single.api), "", ""],
        [
          `${concurrency} concurrent`,
          "images/s",
          figure(concurrent.ref),
          figure(concurrent.api),
          figure(concurrent.ratio),
          `≥ ${targets.concurrent}`
        ]
      ].map((row) => row.map(String))
    ]
    const widths = table[0]!.map((_, column) => Math.max(...table.map((row) => row[column]!.length)))
    const { language } = geometry
    console.log(
      `janus bench: random Janus-Pro (${geometry.imageTokens} image tokens of a ${geometry.codebookSize}-entry codebook, ${side} × ${side} pixels, ${geometry.decoderChannels}-channel decoder; language model hidden ${language.hiddenSize}, ${language.layers} layers, ${language.heads} heads, ffn ${language.intermediateSize}), guidance scale 5, greedy, ${prompts.length} prompts, ${threads} ORT threads each side, medians over ${rounds} rounds`
    )
    console.log(
      `ours: LLM executor's image tokens + Geri's PNG through the sidecar (tokens sent after ${figure(single.tokens, 2)} s of ${figure(single.api, 2)} s, median); images differing from transformers.js's: ${mismatches.length} of ${compared}`
    )
    for (const row of table) console.log(row.map((cell, column) => cell.padEnd(widths[column]!)).join("  "))
    console.log(
      JSON.stringify({
        bench: "janus",
        threads,
        rounds,
        small,
        geometry,
        imageSide: side,
        prompts: prompts.length,
        concurrency,
        imagesCompared: compared,
        imagesDifferingFromTransformersJs: mismatches.length,
        mismatches,
        single: {
          transformersJsSecondsPerImage: figure(single.ref),
          apiSecondsPerImage: figure(single.api),
          apiTokensSeconds: figure(single.tokens),
          transformersJsImagesPerSecond: perSecond(single.ref),
          apiImagesPerSecond: perSecond(single.api)
        },
        concurrent: {
          transformersJsImagesPerSecond: figure(concurrent.ref),
          apiImagesPerSecond: figure(concurrent.api)
        },
        ratios: { single: figure(single.ratio), concurrent: figure(concurrent.ratio) },
        targets
      })
    )
  } finally {
    process.off("SIGINT", stop)
    for (const running of started.reverse()) await running.stop()
    await janus.dispose()
  }
}
