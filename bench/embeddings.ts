/**
 * Text embeddings: `bench/minilm-l6` (all-MiniLM-L6-v2's geometry: 6 layers, hidden 384, random
 * weights, onnx/model.onnx in fp32, mean pooling, normalized) through Eric's `/text-embeddings` and
 * through transformers.js's `feature-extraction` pipeline in this process, with the same ONNX Runtime
 * thread count, in the same run. Texts are sentences of 8 to 96 words of the model's vocabulary.
 *
 * - 1 input: one request of one text at a time vs one pipeline call of one text at a time.
 * - 32 inputs in one request vs one pipeline call of the same 32 texts.
 * - 8 concurrent requests of one text each, from 8 clients, vs 8 callers of the pipeline at once.
 *
 * Each workload runs once untimed first; runs alternate between the two in rounds, each after a
 * full collection of this process's heap, and the ratios are medians. The vectors through the API
 * are checked against transformers.js's. Prints a table, then (as the last line) one JSON object.
 *
 * Env: BENCH_ROUNDS (default 5), BENCH_THREADS (ONNX Runtime threads, default 2).
 */
import { basename, dirname } from "node:path"
import { setFlagsFromString } from "node:v8"
import { runInNewContext } from "node:vm"
import { env, pipeline } from "@huggingface/transformers"
import { resolveModel } from "../src/models/ModelStore.js"
import { Random } from "../src/models/Random.js"
import { wordPieceVocabulary } from "../src/models/recipes/WordPieceVocabulary.js"
import { executorHeaders, startExecutor } from "../test/support/executors.js"

const rounds = Number(process.env.BENCH_ROUNDS ?? 5)
const threads = Number(process.env.BENCH_THREADS ?? 2)
const model = "bench/minilm-l6"
const batchSize = 32
const concurrency = 8
/** Texts per client and round in the concurrent workload, and one-at-a-time texts per round. */
const perClient = 4
const singles = 24
const targets = { single: 1, batched: 3 }

setFlagsFromString("--expose-gc")
const collect = runInNewContext("gc") as () => void

const median = (values: ReadonlyArray<number>) => {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.floor((sorted.length - 1) / 2)]!
}
const round = (value: number, digits = 2) => Number(value.toFixed(digits))

const sentences = (count: number, seed: number): Array<string> => {
  const words = wordPieceVocabulary().filter((token) => /^[a-z]{2,}$/.test(token))
  const random = new Random(seed)
  return Array.from({ length: count }, () => {
    const length = 8 + random.below(89)
    const text = Array.from({ length }, () => words[random.below(words.length)]!).join(" ")
    return `${text[0]!.toUpperCase()}${text.slice(1)}.`
  })
}

const vectorOf = (base64: string): Float32Array => {
  const bytes = Buffer.from(base64, "base64")
  return new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength))
}

/** Embeddings per second of `work`, which embeds `count` texts. */
const rate = async (count: number, work: () => Promise<unknown>) => {
  collect()
  const began = performance.now()
  await work()
  return count / ((performance.now() - began) / 1000)
}

export default async function embeddingsBench(): Promise<void> {
  console.error(`embeddings bench: ${model} (building it on first use), ${threads} threads, ${rounds} rounds`)
  const modelDir = await resolveModel(model)
  env.allowRemoteModels = false
  env.localModelPath = dirname(modelDir)
  const extractor = await pipeline("feature-extraction", basename(modelDir), {
    dtype: "fp32",
    session_options: { intraOpNumThreads: threads, interOpNumThreads: 1 }
  })
  const reference = async (texts: ReadonlyArray<string>) => {
    const output = await extractor([...texts], { pooling: "mean", normalize: true })
    return output.data as Float32Array
  }

  const executor = await startExecutor([
    "--kind",
    "eric",
    "--model",
    model,
    "--devices",
    "cpu:0",
    "--threads-per-device",
    String(threads),
    "--max-batch-size",
    String(batchSize),
    "--max-batch-delay-ms",
    "0"
  ])
  const stopExecutor = () => void executor.process.kill("SIGTERM")
  process.once("SIGINT", stopExecutor)
  const api = async (texts: ReadonlyArray<string>): Promise<Array<Float32Array>> => {
    const response = await fetch(`${executor.url}/text-embeddings`, {
      method: "POST",
      headers: executorHeaders({ "content-type": "application/json" }),
      body: JSON.stringify({ inputs: texts })
    })
    if (response.status !== 200) throw new Error(`Eric answered ${response.status}: ${await response.text()}`)
    return ((await response.json()) as { embeddings: ReadonlyArray<string> }).embeddings.map(vectorOf)
  }

  try {
    const batch = sentences(batchSize, 1)
    const single = sentences(singles, 2)
    const concurrent = sentences(concurrency * perClient, 3)

    // The vectors through the API are transformers.js's.
    const expected = await reference(batch)
    const answered = await api(batch)
    let worst = 0
    answered.forEach((vector, row) => {
      vector.forEach((value, i) => (worst = Math.max(worst, Math.abs(value - expected[row * vector.length + i]!))))
    })
    if (worst > 1e-4) throw new Error(`the API's vectors differ from transformers.js's by ${worst}`)

    const workloads = {
      single: {
        count: singles,
        reference: async () => {
          for (const text of single) await reference([text])
        },
        api: async () => {
          for (const text of single) await api([text])
        }
      },
      batched: { count: batchSize, reference: () => reference(batch), api: () => api(batch) },
      concurrent: {
        count: concurrency * perClient,
        reference: () =>
          Promise.all(
            Array.from({ length: concurrency }, async (_, client) => {
              for (let i = 0; i < perClient; i++) await reference([concurrent[client * perClient + i]!])
            })
          ),
        api: () =>
          Promise.all(
            Array.from({ length: concurrency }, async (_, client) => {
              for (let i = 0; i < perClient; i++) await api([concurrent[client * perClient + i]!])
            })
          )
      }
    }
    type Name = keyof typeof workloads
    const names = Object.keys(workloads) as Array<Name>
    for (const name of names) {
      await workloads[name].reference()
      await workloads[name].api()
    }
    const samples = Object.fromEntries(
      names.map((name) => [
        name,
        { reference: [] as Array<number>, api: [] as Array<number>, ratio: [] as Array<number> }
      ])
    ) as Record<Name, { reference: Array<number>; api: Array<number>; ratio: Array<number> }>
    for (let r = 0; r < rounds; r++) {
      for (const name of names) {
        const { count, reference: runReference, api: runApi } = workloads[name]
        const [referenceRate, apiRate] =
          r % 2 === 0
            ? [await rate(count, runReference), await rate(count, runApi)]
            : await rate(count, runApi).then(async (apiFirst) => [await rate(count, runReference), apiFirst] as const)
        samples[name].reference.push(referenceRate)
        samples[name].api.push(apiRate)
        samples[name].ratio.push(apiRate / referenceRate)
      }
      console.error(
        `  round ${r + 1}: ${names.map((name) => `${name} ${round(samples[name].ratio.at(-1)!, 2)}×`).join(", ")}`
      )
    }

    const figures = Object.fromEntries(
      names.map((name) => [
        name,
        {
          transformersPerSecond: round(median(samples[name].reference), 1),
          apiPerSecond: round(median(samples[name].api), 1),
          ratio: round(median(samples[name].ratio), 3)
        }
      ])
    ) as Record<Name, { transformersPerSecond: number; apiPerSecond: number; ratio: number }>
    const labels: Record<Name, readonly [string, string, string]> = {
      single: ["1 input", "one call of 1 text at a time", "one request of 1 text at a time"],
      batched: ["32 inputs", "one call of 32 texts", "one request of 32 texts"],
      concurrent: ["8 concurrent", "8 callers, 1 text each", "8 clients, 1 text per request"]
    }
    const target: Record<Name, string> = {
      single: `≥ ${targets.single}`,
      batched: `≥ ${targets.batched}`,
      concurrent: `≥ ${targets.batched}`
    }
    console.log(
      `embeddings bench: ${model} (BERT, 6 layers, hidden 384, fp32, mean pooling), ${threads} ORT threads each side, medians over ${rounds} rounds`
    )
    console.log(
      `${"workload".padEnd(14)}${"transformers.js".padEnd(34)}${"emb/s".padEnd(9)}${"Eric /text-embeddings".padEnd(34)}${"emb/s".padEnd(9)}${"ratio".padEnd(8)}target`
    )
    for (const name of names) {
      const [label, baseline, ours] = labels[name]
      const figure = figures[name]
      console.log(
        `${label.padEnd(14)}${baseline.padEnd(34)}${String(figure.transformersPerSecond).padEnd(9)}${ours.padEnd(34)}${String(figure.apiPerSecond).padEnd(9)}${String(figure.ratio).padEnd(8)}${target[name]}`
      )
    }
    console.log(
      JSON.stringify({
        bench: "embeddings",
        model,
        threads,
        rounds,
        largestDifference: worst,
        ...figures,
        ratios: { single: figures.single.ratio, batched: figures.batched.ratio, concurrent: figures.concurrent.ratio },
        targets: { single: targets.single, batched: targets.batched, concurrent: targets.batched }
      })
    )
  } finally {
    process.off("SIGINT", stopExecutor)
    await executor.stop()
    await extractor.dispose()
  }
}
