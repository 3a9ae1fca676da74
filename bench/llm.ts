/**
 * The LLM executor against a plain ONNX Runtime generation loop, on the `bench/decoder-125m` preset
 * (OPT-125m-sized, random weights): decode tokens/s and time to first token of streamed chat
 * completions through the executor's HTTP API (router, engine, one CPU worker), and of the same
 * prompts run directly in this process with the same thread count, in the same run.
 *
 * - 1 request: one streamed request at a time vs one direct generation at a time.
 * - 8 concurrent: 8 streamed requests at once (continuously batched) vs the same 8 generated
 *   directly one after another; the figure is aggregate tokens/s, and time to first token counts
 *   from when all 8 arrive.
 *
 * - Constrained decoding: the same requests held to a JSON schema (`response_format`) against the
 *   same requests unconstrained, through the executor, 1 at a time and 8 at once: the cost per
 *   token of masking the logits at each step (decode tokens/s ratio; target ≥ 0.9).
 *
 * Direct and API runs alternate so that the machine's drift hits both; the ratios are medians of
 * per-pair (1 request) and per-round (8 requests) ratios. Greedy outputs through the API are
 * checked against the direct ones. Prints a table, then (as the last line) one JSON object.
 *
 * Env: BENCH_TOKENS (tokens per request, default 64), BENCH_ROUNDS (default 3; medians are
 * reported), BENCH_THREADS (ONNX Runtime threads, default 2).
 */
import { benchPrompts, figuresOf, mean, median, printTable, round, streamed } from "./support/chat-stream.js"
import { loadModelDirectory } from "../src/models/ModelDirectory.js"
import { resolveModel } from "../src/models/ModelStore.js"
import { ChatTokenizer } from "../src/models/Tokenizer.js"
import { startExecutor } from "../test/support/executors.js"
import { DirectGenerator } from "./support/llm-direct.js"

const tokens = Number(process.env.BENCH_TOKENS ?? 64)
const rounds = Number(process.env.BENCH_ROUNDS ?? 3)
const pairsPerRound = 2
const threads = Number(process.env.BENCH_THREADS ?? 2)
const concurrency = 8
const model = "bench/decoder-125m"
const targets = { singleDecodeRatio: 0.9, concurrentOverSequential: 1, constrainedRatio: 0.9 }
const noFormat: Readonly<Record<string, unknown>> = {}

const isJson = (text: string) => {
  try {
    JSON.parse(text)
    return true
  } catch {
    return false
  }
}

const prompts = benchPrompts

export default async function main(): Promise<void> {
  console.error(
    `llm bench: ${model} (building it on first use), ${tokens} tokens per request, ${threads} threads, ${rounds} rounds`
  )
  const modelDir = await resolveModel(model)
  const directory = await loadModelDirectory(modelDir)
  const tokenizer = new ChatTokenizer(directory)
  const promptIds = prompts.map((prompt) =>
    tokenizer.encode(tokenizer.applyChatTemplate([{ role: "user", content: prompt }]))
  )
  const direct = await DirectGenerator.open(directory, threads)
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
    const decodeRate = (run: { readonly tokens: number; readonly decodeMs: number }) =>
      (run.tokens - 1) / (run.decodeMs / 1000)
    const samples = {
      directSingle: { rate: [] as Array<number>, ttft: [] as Array<number> },
      apiSingle: { rate: [] as Array<number>, ttft: [] as Array<number> },
      directSequential: { rate: [] as Array<number>, ttft: [] as Array<number> },
      apiConcurrent: { rate: [] as Array<number>, ttft: [] as Array<number> }
    }
    let mismatches = 0
    const expected = new Map<number, string>()

    // Warm-up: first runs pay for allocations and caches.
    await direct.generate(promptIds[0]!, 4)
    await streamed(executor.url, model, prompts[0]!, tokens, performance.now())

    const singleRatios: Array<number> = []
    const concurrentRatios: Array<number> = []
    for (let round = 0; round < rounds; round++) {
      // Direct and API runs alternate, first one then the other, so that drift in the machine's
      // speed hits both; each pair gives a ratio and the medians are reported.
      for (let pair = 0; pair < pairsPerRound; pair++) {
        const which = (round * pairsPerRound + pair) % prompts.length
        const runDirect = async () => {
          const run = await direct.generate(promptIds[which]!, tokens)
          expected.set(which, tokenizer.decode(run.tokens, { skipSpecialTokens: true }))
          return { tokens: run.tokens.length, firstTokenMs: run.firstTokenMs, decodeMs: run.decodeMs }
        }
        const runApi = () => streamed(executor.url, model, prompts[which]!, tokens, performance.now())
        const [directRun, apiRun] =
          pair % 2 === 0
            ? [await runDirect(), await runApi()]
            : await runApi().then(async (api) => [await runDirect(), api] as const)
        samples.directSingle.rate.push(decodeRate(directRun))
        samples.directSingle.ttft.push(directRun.firstTokenMs)
        samples.apiSingle.rate.push(decodeRate(apiRun))
        samples.apiSingle.ttft.push(apiRun.firstTokenMs)
        singleRatios.push(decodeRate(apiRun) / decodeRate(directRun))
        if (apiRun.text !== expected.get(which) || apiRun.tokens !== tokens) mismatches++
      }

      const runSequential = async () => {
        const start = performance.now()
        // Time to first token as 8 clients arriving together see it: each waits for those before it.
        const ttft: Array<number> = []
        for (const [index, ids] of promptIds.entries()) {
          const startedAt = performance.now() - start
          const run = await direct.generate(ids, tokens)
          ttft.push(startedAt + run.firstTokenMs)
          expected.set(index, tokenizer.decode(run.tokens, { skipSpecialTokens: true }))
        }
        return { rate: (concurrency * tokens) / ((performance.now() - start) / 1000), ttft: mean(ttft) }
      }
      const runConcurrent = async () => {
        const start = performance.now()
        const runs = await Promise.all(prompts.map((prompt) => streamed(executor.url, model, prompt, tokens, start)))
        return {
          runs,
          rate: runs.reduce((sum, run) => sum + run.tokens, 0) / (Math.max(...runs.map((run) => run.endMs)) / 1000),
          ttft: mean(runs.map((run) => run.firstTokenMs))
        }
      }
      const [sequential, concurrent] =
        round % 2 === 0
          ? [await runSequential(), await runConcurrent()]
          : await runConcurrent().then(async (api) => [await runSequential(), api] as const)
      samples.directSequential.rate.push(sequential.rate)
      samples.directSequential.ttft.push(sequential.ttft)
      samples.apiConcurrent.rate.push(concurrent.rate)
      samples.apiConcurrent.ttft.push(concurrent.ttft)
      concurrentRatios.push(concurrent.rate / sequential.rate)
      concurrent.runs.forEach((run, index) => {
        if (run.text !== expected.get(index) || run.tokens !== tokens) mismatches++
      })
      console.error(
        `  round ${round + 1}: 1 request: direct ${round2(samples.directSingle.rate.at(-1)!)} tok/s, api ${round2(samples.apiSingle.rate.at(-1)!)} tok/s; ` +
          `8 requests: one after another ${round2(sequential.rate)} tok/s, concurrent ${round2(concurrent.rate)} tok/s`
      )
    }

    // Constrained decoding against unconstrained, same executor, same prompts, alternating.
    const format = {
      response_format: {
        type: "json_schema",
        json_schema: {
          name: "notes",
          strict: true,
          schema: {
            type: "object",
            properties: {
              title: { type: "string" },
              points: { type: "array", items: { type: "string" } },
              score: { type: "number" },
              done: { type: "boolean" }
            },
            required: ["title", "points", "score", "done"],
            additionalProperties: false
          }
        }
      }
    }
    // Warm-up: the first constrained request builds the tokenizer's index and compiles the schema.
    await streamed(executor.url, model, prompts[0]!, tokens, performance.now(), format)
    const constrained = {
      free1: [] as Array<number>,
      held1: [] as Array<number>,
      free8: [] as Array<number>,
      held8: [] as Array<number>,
      firstHeldMs: [] as Array<number>
    }
    const constrainedSingle: Array<number> = []
    const constrainedConcurrent: Array<number> = []
    let invalid = 0
    for (let round = 0; round < rounds; round++) {
      for (let pair = 0; pair < pairsPerRound; pair++) {
        const which = (round * pairsPerRound + pair) % prompts.length
        const free = () => streamed(executor.url, model, prompts[which]!, tokens, performance.now())
        const held = () => streamed(executor.url, model, prompts[which]!, tokens, performance.now(), format)
        const [freeRun, heldRun] =
          pair % 2 === 0 ? [await free(), await held()] : await held().then(async (run) => [await free(), run] as const)
        constrained.free1.push(decodeRate(freeRun))
        constrained.held1.push(decodeRate(heldRun))
        constrained.firstHeldMs.push(heldRun.firstTokenMs)
        constrainedSingle.push(decodeRate(heldRun) / decodeRate(freeRun))
        if (!isJson(heldRun.text)) invalid++
      }
      const batch = async (extra: Readonly<Record<string, unknown>>) => {
        const start = performance.now()
        const runs = await Promise.all(
          prompts.map((prompt) => streamed(executor.url, model, prompt, tokens, start, extra))
        )
        for (const run of runs) if (extra !== noFormat && !isJson(run.text)) invalid++
        // Per-token rate of the batch's decode: tokens after each first over the time after the first.
        const first = Math.min(...runs.map((run) => run.firstTokenMs))
        const decoded = runs.reduce((sum, run) => sum + run.tokens - 1, 0)
        return decoded / ((Math.max(...runs.map((run) => run.endMs)) - first) / 1000)
      }
      const [freeRate, heldRate] =
        round % 2 === 0
          ? [await batch(noFormat), await batch(format)]
          : await batch(format).then(async (rate) => [await batch(noFormat), rate] as const)
      constrained.free8.push(freeRate)
      constrained.held8.push(heldRate)
      constrainedConcurrent.push(heldRate / freeRate)
    }
    const constrainedSingleRatio = round(median(constrainedSingle), 3)
    const constrainedConcurrentRatio = round(median(constrainedConcurrent), 3)
    console.log(
      [
        `constrained decoding (response_format json_schema) against unconstrained, executor API, medians over ${rounds} rounds:`,
        `  1 request:  unconstrained ${round2(median(constrained.free1))} tok/s, constrained ${round2(median(constrained.held1))} tok/s, ratio ${constrainedSingleRatio} (target ≥ ${targets.constrainedRatio})`,
        `  8 requests: unconstrained ${round2(median(constrained.free8))} tok/s, constrained ${round2(median(constrained.held8))} tok/s, ratio ${constrainedConcurrentRatio} (target ≥ ${targets.constrainedRatio})`,
        `  constrained answers that are not JSON: ${invalid}`
      ].join("\n")
    )

    const figures = figuresOf(samples)
    const singleDecodeRatio = round(median(singleRatios), 3)
    const concurrentOverSequential = round(median(concurrentRatios), 3)

    const rows = [
      ["1 request", "direct ORT loop", figures.directSingle, "decode"],
      ["1 request", "executor API", figures.apiSingle, "decode"],
      ["8 requests", "direct, one after another", figures.directSequential, "aggregate"],
      ["8 requests", "executor API, concurrent", figures.apiConcurrent, "aggregate"]
    ] as const
    printTable(
      `llm bench: ${model}, ${tokens} tokens per request (greedy, streamed), ${threads} ORT threads, medians over ${rounds} rounds`,
      rows
    )
    console.log(
      `1 request: API decode ${singleDecodeRatio} × direct (target ≥ ${targets.singleDecodeRatio}); ` +
        `8 concurrent: ${concurrentOverSequential} × 8 one after another (target > ${targets.concurrentOverSequential}); ` +
        `greedy outputs ${mismatches === 0 ? "identical to direct" : `differ from direct in ${mismatches} requests`}`
    )
    console.log(
      JSON.stringify({
        bench: "llm",
        model,
        tokensPerRequest: tokens,
        threads,
        rounds,
        ...figures,
        singleDecodeRatio,
        concurrentOverSequential,
        outputMismatches: mismatches,
        constrainedSingleRatio,
        constrainedConcurrentRatio,
        constrainedInvalid: invalid,
        targetsMet:
          singleDecodeRatio >= targets.singleDecodeRatio &&
          concurrentOverSequential > targets.concurrentOverSequential &&
          mismatches === 0 &&
          constrainedSingleRatio >= targets.constrainedRatio &&
          constrainedConcurrentRatio >= targets.constrainedRatio &&
          invalid === 0
      })
    )
  } finally {
    process.off("SIGINT", stopExecutor)
    await executor.stop()
    await direct.close()
  }
}

const round2 = (value: number) => round(value, 1)
