/**
 * Eric's overhead: throughput at saturation and latency at low load of the `bench/vit-b16` encoder
 * (224×224 → 197×768) through Eric's HTTP API (router, engine, two CPU workers of one thread
 * each, embeddings sent through the sidecar and drained by a receiver), against direct ONNX
 * Runtime sessions doing the same work (decode, preprocess, encode) in the same run.
 *
 * Env: BENCH_SECONDS (saturation phase length, default 20), BENCH_LATENCY_REQUESTS (default 12),
 * BENCH_CONCURRENCY (saturation clients, default 8).
 */
import { randomBytes } from "node:crypto"
import * as ort from "onnxruntime-node"
import sharp from "sharp"
import { decodeImage } from "../src/executors/common/media/MediaDecoder.js"
import { decodeImageProcessorConfig, normalizePixels, resizeTarget } from "../src/models/ImageProcessor.js"
import { loadModelDirectory, onnxPath } from "../src/models/ModelDirectory.js"
import { resolveModel } from "../src/models/ModelStore.js"
import { SidecarClient } from "../src/sidecar/SidecarClient.js"
import { executorHeaders, startExecutor, startSidecar } from "../test/support/executors.js"

const seconds = Number(process.env.BENCH_SECONDS ?? 20)
const latencyRequests = Number(process.env.BENCH_LATENCY_REQUESTS ?? 12)
const concurrency = Number(process.env.BENCH_CONCURRENCY ?? 8)
const rounds = 3
const model = "bench/vit-b16"

const percentile = (values: ReadonlyArray<number>, p: number) => {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!
}
const round = (value: number, digits = 2) => Number(value.toFixed(digits))

/** Runs `work` from `clients` loops until `ms` elapse; answers completions per second. */
const closedLoop = async (clients: number, ms: number, work: (client: number) => Promise<void>) => {
  const end = performance.now() + ms
  let done = 0
  const started = performance.now()
  await Promise.all(
    Array.from({ length: clients }, async (_, client) => {
      while (performance.now() < end) {
        await work(client)
        done++
      }
    })
  )
  return done / ((performance.now() - started) / 1000)
}

/** One request at a time, alternating between the two ways, so that both see the same machine. */
const alternatingLatencies = async (
  count: number,
  first: (index: number) => Promise<void>,
  second: (index: number) => Promise<void>
) => {
  const latencies = { first: [] as Array<number>, second: [] as Array<number> }
  for (let index = 0; index < count; index++) {
    for (const [work, into] of [
      [first, latencies.first],
      [second, latencies.second]
    ] as const) {
      const started = performance.now()
      await work(index)
      into.push(performance.now() - started)
    }
  }
  return latencies
}

export default async function ericBench(): Promise<void> {
  const modelDir = await resolveModel(model)
  const directory = await loadModelDirectory(modelDir)
  const config = decodeImageProcessorConfig(directory.preprocessorConfig)
  const { height, width } = config.size
  const images = await Promise.all(
    Array.from({ length: 8 }, () =>
      sharp(randomBytes(width * height * 3), { raw: { width, height, channels: 3 } })
        .png()
        .toBuffer()
    )
  )
  const urls = images.map((image) => `data:image/png;base64,${image.toString("base64")}`)

  const sessions = await Promise.all(
    [0, 1].map(() =>
      ort.InferenceSession.create(onnxPath(directory, "vision_encoder"), {
        executionProviders: ["cpu"],
        intraOpNumThreads: 1,
        interOpNumThreads: 1,
        graphOptimizationLevel: "all"
      })
    )
  )
  const direct = async (session: ort.InferenceSession, index: number) => {
    const values = normalizePixels(config, await decodeImage(images[index % images.length]!, resizeTarget(config)))
    await session.run({ pixel_values: new ort.Tensor("float32", values, [1, 3, height, width]) })
  }

  const sidecar = await startSidecar("bench-eric", {})
  const eric = await startExecutor([
    "--kind",
    "eric",
    "--model",
    model,
    "--devices",
    "cpu:0,cpu:1",
    "--threads-per-device",
    "1",
    "--max-batch-size",
    "4",
    "--sidecar-socket",
    sidecar.socket
  ])
  const receiver = await SidecarClient.connect(sidecar.socket)
  let next = 0
  const throughEric = async (index: number) => {
    const id = `bench-${next++}`
    const response = await fetch(`${eric.url}/embeddings`, {
      method: "POST",
      headers: executorHeaders({ "content-type": "application/json" }),
      body: JSON.stringify({ items: [{ id, modality: "image", url: urls[index % urls.length] }] })
    })
    if (response.status !== 200) throw new Error(`Eric answered ${response.status}: ${await response.text()}`)
    await response.arrayBuffer()
    await receiver.recv(id, 0, { timeoutMs: 10_000 })
    await receiver.markDone(id)
  }

  try {
    process.stderr.write("warming up\n")
    await Promise.all([throughEric(0), throughEric(1), direct(sessions[0]!, 0), direct(sessions[1]!, 1)])

    process.stderr.write("low load: one request at a time\n")
    const latencies = await alternatingLatencies(latencyRequests, (index) => direct(sessions[0]!, index), throughEric)
    const directLatency = latencies.first
    const ericLatency = latencies.second

    // Alternating rounds, so that noise from the rest of the machine falls on both alike.
    process.stderr.write(
      `saturation: ${concurrency} clients, ${rounds} alternating rounds of ${seconds / rounds} s each\n`
    )
    let directThroughput = 0
    let ericThroughput = 0
    for (let round = 0; round < rounds; round++) {
      directThroughput +=
        (await closedLoop(2, (seconds * 1000) / rounds, (client) => direct(sessions[client]!, client))) / rounds
      ericThroughput += (await closedLoop(concurrency, (seconds * 1000) / rounds, throughEric)) / rounds
    }

    const result = {
      bench: "eric",
      model,
      devices: 2,
      threadsPerDevice: 1,
      lowLoad: {
        directP50Ms: round(percentile(directLatency, 50)),
        ericP50Ms: round(percentile(ericLatency, 50)),
        p50Ratio: round(percentile(ericLatency, 50) / percentile(directLatency, 50), 3)
      },
      saturation: {
        directImagesPerSecond: round(directThroughput),
        ericImagesPerSecond: round(ericThroughput),
        throughputRatio: round(ericThroughput / directThroughput, 3)
      },
      targets: { throughputRatio: 0.9, p50Ratio: 1.1 }
    }
    console.log("eric bench: bench/vit-b16 on 2 CPU devices, 1 thread each")
    console.log("phase        direct          eric            ratio   target")
    console.log(
      `low load     p50 ${String(result.lowLoad.directP50Ms).padEnd(8)} ms p50 ${String(result.lowLoad.ericP50Ms).padEnd(8)} ms ${String(result.lowLoad.p50Ratio).padEnd(7)} ≤ 1.1`
    )
    console.log(
      `saturation   ${String(result.saturation.directImagesPerSecond).padEnd(7)} img/s   ${String(result.saturation.ericImagesPerSecond).padEnd(7)} img/s   ${String(result.saturation.throughputRatio).padEnd(7)} ≥ 0.9`
    )
    console.log(JSON.stringify(result))
  } finally {
    await receiver.close()
    await eric.stop()
    await sidecar.stop()
    await Promise.all(sessions.map((session) => session.release()))
  }
}
