/**
 * One vision tower for two Gemma 3 sizes (Eric's adapters) against an encoder for each.
 *
 * Two random Gemma 3 models whose vision encoders hold the same SigLIP tower (12 blocks of 768 at
 * 224 pixels: 86M parameters, pooled to 64 soft tokens) and differ in the projector alone (their
 * language models are 1,024 and 1,536 wide), as Google's 4B, 12B and 27B do:
 *
 * - shared: one Eric on the first with the second as its adapter, 2 ONNX Runtime threads;
 * - apart: an Eric on each, 1 thread each (the same cores).
 *
 * For each side: the time from start to ready, the memory of its processes once warm (PSS, read
 * from /proc, shared pages counted once), and images per second with 8 requests in flight, half
 * for each model, one image a request, the features sent through the sidecar and drained by a
 * receiver as encoder fission sends them. The embeddings of both sides are checked equal (inline).
 * Rounds alternate between the sides; figures are medians. Prints a table, then (as the last line)
 * one JSON object.
 *
 * Env: BENCH_ROUNDS (default 3), BENCH_IMAGES (a round's images, default 32).
 */
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { performance } from "node:perf_hooks"
import sharp from "sharp"
import { processPss, processTree } from "../src/metrics/Footprint.js"
import { randomGemma3, tinyGemma3Config } from "../src/models/recipes/RandomGemma3.js"
import { SidecarClient } from "../src/sidecar/SidecarClient.js"
import { writeModelFiles } from "../test/models/support/SmolVlmFixture.js"
import { executorHeaders, startExecutor, startSidecar } from "../test/support/executors.js"
import { median, round } from "./support/chat-stream.js"

const rounds = Number(process.env.BENCH_ROUNDS ?? 3)
const imagesPerRound = Number(process.env.BENCH_IMAGES ?? 32)
const inFlight = 8
const side = 224
const MiB = 2 ** 20

const modelFiles = (textHidden: number) => {
  const tiny = tinyGemma3Config(randomGemma3().config.text.vocabSize)
  return randomGemma3({
    seed: 21,
    config: {
      vision: { ...tiny.vision, hiddenSize: 768, intermediateSize: 3072, layers: 12, heads: 12, imageSize: side },
      text: {
        ...tiny.text,
        hiddenSize: textHidden,
        intermediateSize: 2 * textHidden,
        layers: 1,
        layerTypes: ["full_attention"]
      },
      mmTokensPerImage: 64
    }
  }).files
}

/** A 224×224 PNG of its own colours. */
const image = (seed: number): Promise<Buffer> => {
  const data = Buffer.alloc(side * side * 3)
  for (let i = 0; i < data.length; i++) data[i] = (i * (seed * 7 + 3) + seed * 31) % 256
  return sharp(data, { raw: { width: side, height: side, channels: 3 } })
    .png()
    .toBuffer()
}

const settings = (threads: number, adapters: ReadonlyArray<string>) =>
  JSON.stringify({
    threadsPerDevice: threads,
    maxBatchSize: inFlight,
    maxBatchDelayMs: 0,
    preprocessThreads: 2,
    ...(adapters.length === 0 ? {} : { adapters })
  })

/** The PSS of a process and everything below it, in bytes. */
const treePss = (pid: number) =>
  processTree(pid).reduce((sum, member) => {
    const pss = processPss(member)
    return sum + (typeof pss === "number" ? pss : 0)
  }, 0)

export default async function encoderSharingBench(): Promise<void> {
  const root = await mkdtemp(join(tmpdir(), "cornserve-bench-sharing-"))
  try {
    await runBench(root)
  } finally {
    await rm(root, { recursive: true, force: true })
  }
}

async function runBench(root: string): Promise<void> {
  const models = { small: join(root, "gemma-3-a"), wide: join(root, "gemma-3-b") }
  const built = performance.now()
  await writeModelFiles(models.small, modelFiles(1024))
  await writeModelFiles(models.wide, modelFiles(1536))
  console.error(`encoder sharing bench: models built in ${Math.round(performance.now() - built)} ms under ${root}`)
  const allowRoot = { CORNSERVE_MODEL_ROOTS: root }
  const sidecar = await startSidecar("bench-sharing", {})
  const receiver = await SidecarClient.connect(sidecar.socket)
  const start = async (model: string, threads: number, adapters: ReadonlyArray<string>) => {
    const began = performance.now()
    const executor = await startExecutor(
      [
        "--kind",
        "eric",
        "--model",
        model,
        "--devices",
        "cpu:0",
        "--sidecar-socket",
        sidecar.socket,
        "--settings",
        settings(threads, adapters)
      ],
      allowRoot
    )
    return { ...executor, readyMs: performance.now() - began }
  }
  const shared = await start(models.small, 2, [models.wide])
  const apart = { small: await start(models.small, 1, []), wide: await start(models.wide, 1, []) }
  const executors = [shared, apart.small, apart.wide]
  try {
    let nextId = 0
    const embed = async (url: string, model: string, png: Buffer, inline = false) => {
      const id = `bench-${nextId++}`
      const response = await fetch(`${url}/embeddings`, {
        method: "POST",
        headers: executorHeaders({ "content-type": "application/json" }),
        body: JSON.stringify({
          items: [{ id, modality: "image", url: `data:image/png;base64,${png.toString("base64")}`, model }],
          ...(inline ? { return: "inline" } : {})
        })
      })
      if (response.status !== 200) throw new Error(`Eric answered ${response.status}: ${await response.text()}`)
      const answer = (await response.json()) as { items: Array<{ embedding?: Array<number> }> }
      if (inline) return answer.items[0]!.embedding!
      await receiver.recv(id, 0, { timeoutMs: 30_000 })
      await receiver.markDone(id, 0)
      return undefined
    }
    const sides = {
      shared: (model: "small" | "wide", png: Buffer) => embed(shared.url, models[model], png),
      apart: (model: "small" | "wide", png: Buffer) => embed(apart[model].url, models[model], png)
    }

    // Both sides embed alike, to the bit: each model's projector over the one tower.
    const checks = await Promise.all([image(1000), image(1001)])
    let differing = 0
    for (const model of ["small", "wide"] as const) {
      for (const png of checks) {
        const one = await embed(shared.url, models[model], png, true)
        const other = await embed(apart[model].url, models[model], png, true)
        if (JSON.stringify(one) !== JSON.stringify(other)) differing++
      }
    }

    let serial = 0
    const round_ = async (run: (model: "small" | "wide", png: Buffer) => Promise<unknown>) => {
      const pngs = await Promise.all(Array.from({ length: imagesPerRound }, () => image(serial++)))
      let next = 0
      const began = performance.now()
      await Promise.all(
        Array.from({ length: inFlight }, async () => {
          while (next < pngs.length) {
            const at = next++
            await run(at % 2 === 0 ? "small" : "wide", pngs[at]!)
          }
        })
      )
      return pngs.length / ((performance.now() - began) / 1000)
    }
    await round_(sides.shared)
    await round_(sides.apart)
    const rates = { shared: [] as Array<number>, apart: [] as Array<number> }
    for (let r = 0; r < rounds; r++) {
      rates.apart.push(await round_(sides.apart))
      rates.shared.push(await round_(sides.shared))
      console.error(
        `  round ${r + 1}: shared ${round(rates.shared.at(-1)!, 2)} images/s, apart ${round(rates.apart.at(-1)!, 2)}`
      )
    }
    const memory = {
      shared: treePss(shared.process.pid!),
      apart: treePss(apart.small.process.pid!) + treePss(apart.wide.process.pid!)
    }
    const figures = {
      readyMs: { shared: Math.round(shared.readyMs), apart: Math.round(apart.small.readyMs + apart.wide.readyMs) },
      pssMiB: { shared: Math.round(memory.shared / MiB), apart: Math.round(memory.apart / MiB) },
      imagesPerSecond: { shared: round(median(rates.shared), 2), apart: round(median(rates.apart), 2) }
    }
    const ratios = {
      memory: round(memory.shared / memory.apart, 3),
      throughput: round(median(rates.shared) / median(rates.apart), 3)
    }
    console.log(
      `encoder sharing: two Gemma 3 sizes, one SigLIP tower (12×768 at ${side} px, 64 soft tokens), ${inFlight} images in flight, medians over ${rounds} rounds`
    )
    console.log("measure             shared (one Eric, 2 threads)  apart (an Eric each, 1 thread each)  ratio")
    console.log(
      `ready (ms, summed)  ${String(figures.readyMs.shared).padEnd(29)} ${String(figures.readyMs.apart).padEnd(36)} ${round(figures.readyMs.shared / figures.readyMs.apart, 3)}`
    )
    console.log(
      `PSS once warm (MiB) ${String(figures.pssMiB.shared).padEnd(29)} ${String(figures.pssMiB.apart).padEnd(36)} ${ratios.memory}`
    )
    console.log(
      `images/s            ${String(figures.imagesPerSecond.shared).padEnd(29)} ${String(figures.imagesPerSecond.apart).padEnd(36)} ${ratios.throughput}`
    )
    console.log(
      JSON.stringify({
        bench: "encoderSharing",
        rounds,
        imagesPerRound,
        inFlight,
        embeddingsDiffering: differing,
        ...figures,
        ratios
      })
    )
  } finally {
    for (const executor of executors) executor.process.kill("SIGTERM")
    await receiver.close()
    sidecar.process.kill("SIGTERM")
  }
}
