/**
 * A community-layout decoder-only model at SmolLM2-135M's geometry (`bench/smollm2-135m`: hidden
 * 576, 30 layers, 9 heads on 3 KV heads, vocabulary 49152, random weights, onnx/model.onnx in
 * fp32) through the LLM executor's HTTP API and through transformers.js in this process, with the
 * same ONNX Runtime thread count, in the same run.
 *
 * - 1 request: one streamed chat completion at a time vs one transformers.js generate() at a time:
 *   decode tokens/s and time to first token.
 * - 8 concurrent: 8 streamed requests at once (continuously batched) vs the same 8 prompts through
 *   transformers.js one after another: aggregate tokens/s, and time to first token from when all 8
 *   arrive.
 *
 * Each workload runs once untimed first, and every run starts after a full collection of this
 * process's heap. Runs alternate between the two so that the machine's drift hits both; the ratios
 * are medians.
 * Greedy tokens through the API are checked against transformers.js's. Prints a table, then (as
 * the last line) one JSON object.
 *
 * Env: BENCH_TOKENS (tokens per request, default 64), BENCH_ROUNDS (default 5), BENCH_THREADS
 * (ONNX Runtime threads, default 2).
 */
import { benchPrompts, figuresOf, mean, median, printTable, type Run, round, streamed } from "./support/chat-stream.js"
import { AutoModelForCausalLM, env, Tensor } from "@huggingface/transformers"
import { basename, dirname } from "node:path"
import { setFlagsFromString } from "node:v8"
import { runInNewContext } from "node:vm"
import { loadModelDirectory } from "../src/models/ModelDirectory.js"
import { resolveModel } from "../src/models/ModelStore.js"
import { ChatTokenizer } from "../src/models/Tokenizer.js"
import { startExecutor } from "../test/support/executors.js"

const tokens = Number(process.env.BENCH_TOKENS ?? 64)
const rounds = Number(process.env.BENCH_ROUNDS ?? 5)
const threads = Number(process.env.BENCH_THREADS ?? 2)
const concurrency = 8
const model = "bench/smollm2-135m"
const targets = { singleDecodeRatio: 1.0, concurrentOverSequential: 3 }

const prompts = benchPrompts

setFlagsFromString("--expose-gc")
/**
 * A full collection of this process's heap. transformers.js runs in this process and leaves tens of
 * MB of tensors behind; without it they would be collected (on this process's GC threads) during
 * whatever runs next, the executor's turn included.
 */
const collect = runInNewContext("gc") as () => void

const decodeRate = (run: Run) => (run.tokens - 1) / (run.decodeMs / 1000)

export default async function main(): Promise<void> {
  console.error(
    `models bench: ${model} (building it on first use), ${tokens} tokens per request, ${threads} threads, ${rounds} rounds`
  )
  const modelDir = await resolveModel(model)
  const tokenizer = new ChatTokenizer(await loadModelDirectory(modelDir))
  const promptIds = prompts.map((prompt) =>
    tokenizer.encode(tokenizer.applyChatTemplate([{ role: "user", content: prompt }]))
  )

  env.allowRemoteModels = false
  env.localModelPath = dirname(modelDir)
  const reference = await AutoModelForCausalLM.from_pretrained(basename(modelDir), {
    dtype: "fp32",
    session_options: { intraOpNumThreads: threads, interOpNumThreads: 1 }
  })
  /** transformers.js's generate(), greedy, timed through its streamer. */
  const generate = async (ids: ReadonlyArray<number>, origin = performance.now()): Promise<Run> => {
    const times: Array<number> = []
    const output = (await reference.generate({
      input_ids: new Tensor("int64", BigInt64Array.from(ids, BigInt), [1, ids.length]),
      attention_mask: new Tensor("int64", new BigInt64Array(ids.length).fill(1n), [1, ids.length]),
      max_new_tokens: tokens,
      min_new_tokens: tokens,
      do_sample: false,
      streamer: { put: () => void times.push(performance.now()), end: () => {} } as never
    })) as Tensor
    // The first put is the prompt; each later one a generated token.
    const first = times[1]!
    const last = times[times.length - 1]!
    const generated = Array.from(output.data as BigInt64Array, Number).slice(ids.length)
    return {
      text: tokenizer.decode(generated, { skipSpecialTokens: true }),
      tokens: generated.length,
      firstTokenMs: first - origin,
      decodeMs: last - first,
      endMs: last - origin
    }
  }

  const executor = await startExecutor([
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
  ])
  const stopExecutor = () => void executor.process.kill("SIGTERM")
  process.once("SIGINT", stopExecutor)
  try {
    const samples = {
      transformersSingle: { rate: [] as Array<number>, ttft: [] as Array<number> },
      apiSingle: { rate: [] as Array<number>, ttft: [] as Array<number> },
      transformersSequential: { rate: [] as Array<number>, ttft: [] as Array<number> },
      apiConcurrent: { rate: [] as Array<number>, ttft: [] as Array<number> }
    }
    let mismatches = 0
    const expected = new Map<number, string>()
    const check = (index: number, run: Run) => {
      if (run.text !== expected.get(index) || run.tokens !== tokens) mismatches++
    }
    const expect = (index: number, run: Run) => expected.set(index, run.text)

    // Warm-up, one run of each workload that is measured: first runs pay for allocations, caches
    // and compilation (transformers.js at batch 1, the executor at every batch size it meets).
    for (const ids of promptIds) await generate(ids)
    await streamed(executor.url, model, prompts[0]!, tokens, performance.now())
    await Promise.all(prompts.map((prompt) => streamed(executor.url, model, prompt, tokens, performance.now())))

    const singleRatios: Array<number> = []
    const concurrentRatios: Array<number> = []
    for (let r = 0; r < rounds; r++) {
      for (let pair = 0; pair < 2; pair++) {
        const which = (r * 2 + pair) % prompts.length
        const runReference = async () => {
          collect()
          const run = await generate(promptIds[which]!)
          expect(which, run)
          return run
        }
        const runApi = () => {
          collect()
          return streamed(executor.url, model, prompts[which]!, tokens, performance.now())
        }
        const [referenceRun, apiRun] =
          pair % 2 === 0
            ? [await runReference(), await runApi()]
            : await runApi().then(async (api) => [await runReference(), api] as const)
        samples.transformersSingle.rate.push(decodeRate(referenceRun))
        samples.transformersSingle.ttft.push(referenceRun.firstTokenMs)
        samples.apiSingle.rate.push(decodeRate(apiRun))
        samples.apiSingle.ttft.push(apiRun.firstTokenMs)
        singleRatios.push(decodeRate(apiRun) / decodeRate(referenceRun))
        check(which, apiRun)
      }

      const runSequential = async () => {
        collect()
        const start = performance.now()
        const ttft: Array<number> = []
        for (const [index, ids] of promptIds.entries()) {
          const run = await generate(ids, start)
          ttft.push(run.firstTokenMs)
          expect(index, run)
        }
        return { rate: (concurrency * tokens) / ((performance.now() - start) / 1000), ttft: mean(ttft) }
      }
      const runConcurrent = async () => {
        collect()
        const start = performance.now()
        const runs = await Promise.all(prompts.map((prompt) => streamed(executor.url, model, prompt, tokens, start)))
        return {
          runs,
          rate: (concurrency * tokens) / (Math.max(...runs.map((run) => run.endMs)) / 1000),
          ttft: mean(runs.map((run) => run.firstTokenMs))
        }
      }
      const [sequential, concurrent] =
        r % 2 === 0
          ? [await runSequential(), await runConcurrent()]
          : await runConcurrent().then(async (api) => [await runSequential(), api] as const)
      samples.transformersSequential.rate.push(sequential.rate)
      samples.transformersSequential.ttft.push(sequential.ttft)
      samples.apiConcurrent.rate.push(concurrent.rate)
      samples.apiConcurrent.ttft.push(concurrent.ttft)
      concurrentRatios.push(concurrent.rate / sequential.rate)
      concurrent.runs.forEach((run, index) => check(index, run))
      console.error(
        `  round ${r + 1}: 1 request: transformers.js ${round(samples.transformersSingle.rate.at(-1)!, 1)} tok/s, api ${round(samples.apiSingle.rate.at(-1)!, 1)} tok/s; ` +
          `8 requests: transformers.js one after another ${round(sequential.rate, 1)} tok/s, api concurrent ${round(concurrent.rate, 1)} tok/s`
      )
    }

    const figures = figuresOf(samples)
    const singleDecodeRatio = round(median(singleRatios), 3)
    const concurrentOverSequential = round(median(concurrentRatios), 3)
    const rows = [
      ["1 request", "transformers.js generate()", figures.transformersSingle, "decode"],
      ["1 request", "executor API", figures.apiSingle, "decode"],
      ["8 requests", "transformers.js, one after another", figures.transformersSequential, "aggregate"],
      ["8 requests", "executor API, concurrent", figures.apiConcurrent, "aggregate"]
    ] as const
    printTable(
      `models bench: ${model} (decoder-only, fp32), ${tokens} tokens per request (greedy, streamed), ${threads} ORT threads, medians over ${rounds} rounds`,
      rows
    )
    console.log(
      `1 request: API decode ${singleDecodeRatio} × transformers.js (target ≥ ${targets.singleDecodeRatio}); ` +
        `8 concurrent: ${concurrentOverSequential} × transformers.js one after another (target ≥ ${targets.concurrentOverSequential}); ` +
        `greedy outputs ${mismatches === 0 ? "identical to transformers.js" : `differ from transformers.js in ${mismatches} requests`}`
    )
    console.log(
      JSON.stringify({
        bench: "models",
        model,
        tokensPerRequest: tokens,
        threads,
        rounds,
        ...figures,
        singleDecodeRatio,
        concurrentOverSequential,
        outputMismatches: mismatches,
        targetsMet:
          singleDecodeRatio >= targets.singleDecodeRatio &&
          concurrentOverSequential >= targets.concurrentOverSequential &&
          mismatches === 0
      })
    )
  } finally {
    process.off("SIGINT", stopExecutor)
    await executor.stop()
    await reference.dispose()
  }
}
