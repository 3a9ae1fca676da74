/**
 * A community-layout decoder-only model with random weights, by BENCH_SIZE: 135m (the default,
 * `bench/smollm2-135m`: SmolLM2-135M's geometry, hidden 576, 30 layers, 9 heads on 3 KV heads,
 * vocabulary 49152, fp32 and q8) or 1b (`bench/llama-3.2-1b`: Llama-3.2-1B's geometry and Llama 3's
 * tokenizer, fp32, fp16, q8 and q4; 13 GB, built on first use in about 5 minutes), through the LLM
 * executor's HTTP API, through transformers.js in this process, and through llama.cpp
 * (node-llama-cpp's prebuilt CPU binary) on the same weights written as GGUF (F32; F16; Q8_0 with
 * the q8 export's codes and scale; Q4_0 with the q4 export's codes and its scales rounded to fp16),
 * all with the same thread count, in the same run.
 *
 * Decode, for each dtype (BENCH_DTYPES, default fp32,q8):
 * - 1 request: one streamed chat completion at a time, one transformers.js generate() at a time,
 *   one llama.cpp sequence at a time: decode tokens/s and time to first token;
 * - 8 concurrent: 8 streamed requests at once (continuously batched), the same 8 prompts through
 *   transformers.js one after another, and as 8 parallel llama.cpp sequences: aggregate tokens/s;
 * - the memory-bandwidth limit: the weights read per token over the read bandwidth of a
 *   two-thread scan of a buffer of the weights' size, measured in the same run.
 * KV cache (fp32, BENCH_PARTS includes kv): the executor on its shared cache (the decoder's
 * attention rewritten at load time to read the executor's buffers in place; the default) against
 * the same executor with --kv-cache-mode copies (the decoder as exported: each step concatenates
 * and hands out the whole cache), both up at once and run in turns, prompts prefilled whole and
 * no prefix cache, so that decode alone is timed: 1 request and 8 concurrent with short prompts,
 * 4 concurrent with ~1,000-token prompts, 1 request with a ~2,000-token prompt.
 * Prefill (fp32, BENCH_PARTS includes prefill):
 * - TTFT with a repeated ~1,000-token system prompt, cold and cached (prefix cache);
 * - inter-token latency p99 of 4 running streams, alone and while a ~2,000-token prompt joins,
 *   with chunked prefill (the default) and without (--prefill-chunk-tokens 0).
 *
 * Each workload runs once untimed first, and every run starts after a full collection of this
 * process's heap. Runs alternate between the engines so that the machine's drift hits them all;
 * ratios are medians. Greedy tokens through the API are checked against transformers.js's (and
 * llama.cpp's against ours, which for Q8_0 differ: llama.cpp quantises activations in blocks).
 * Prints tables, then (as the last line) one JSON object.
 *
 * Load (BENCH_PARTS includes load): each engine from its start to ready and to a first token, and
 * the peak resident memory of the process that holds the weights; the executor three times: as it
 * loads by default (its weights packed as it loads), then with a packed-weights folder
 * (`serve --packed-weights-dir`), whose first load writes the decoder's packed copy and whose
 * second maps it.
 *
 * Prepack (BENCH_PARTS includes prepack): ONNX Runtime alone, for each dtype, loading the export
 * as the executor does (its MatMul weights packed into fresh memory as it loads) against loading a
 * copy saved once with its packed weights beside the originals, which it maps from the file: the
 * session's time, peak memory, a one-token step, and the copy's size on disk.
 *
 * Ops (BENCH_PARTS includes ops): where a decode step's time goes, for each dtype at 1 row and at 8:
 * the executor's runner in this process (its decoder as the executor makes it: the same rewrites
 * and options), ONNX Runtime profiling each node of its runs, summed by op type per decode step
 * (16 tokens a request at most), and what the run spent between its kernels (ONNX Runtime's own
 * work, the profiler's included).
 * Profiling adds a little to each node, so its step times are a touch slower than the decode part's.
 * BENCH_OPS_DIR keeps the profiles (Chrome's trace format) in that folder.
 *
 * Env: BENCH_SIZE (135m or 1b), BENCH_TOKENS (tokens per request, default 64), BENCH_ROUNDS
 * (default 3), BENCH_THREADS (threads, default 2), BENCH_DTYPES, BENCH_PARTS (decode,kv,prefill;
 * and load, prepack, ops), BENCH_QUANTIZED_ROWS (the q8 executor's --quantized-rows: apart, the default, or
 * per-row), BENCH_Q4_ACTIVATIONS (the q4 executor's --q4-activations: exported, the default, or int8).
 */
import {
  benchPrompts,
  type Figure,
  figuresOf,
  mean,
  median,
  percentile,
  printTable,
  type Run,
  round,
  streamed
} from "./support/chat-stream.js"
import { AutoModelForCausalLM, env, Tensor } from "@huggingface/transformers"
import { execFileSync } from "node:child_process"
import { existsSync, statSync } from "node:fs"
import { mkdtemp, readdir, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { basename, dirname, join } from "node:path"
import { setFlagsFromString } from "node:v8"
import { runInNewContext } from "node:vm"
import type { LlmStats } from "../src/executors/llm/api.js"
import type { QuantizedRows } from "../src/executors/llm/DecoderPlan.js"
import type { SamplingParams } from "../src/executors/llm/protocol.js"
import { Runner } from "../src/executors/llm/Runner.js"
import { loadModelDirectory } from "../src/models/ModelDirectory.js"
import { resolveModel } from "../src/models/ModelStore.js"
import { llama32OneBGeometry, smolLm2Geometry } from "../src/models/recipes/RandomLlama.js"
import { ChatTokenizer } from "../src/models/Tokenizer.js"
import { drive } from "../test/support/driveRunner.js"
import { peakRssOf } from "./support/processes.js"
import { descendants, executorHeaders, startExecutor } from "../test/support/executors.js"
import { readBandwidth } from "./support/bandwidth.js"
import { LlamaCpp, type LlamaRun } from "./support/llamaCpp.js"
import { writeLlamaGguf } from "./support/llamaGguf.js"
import { decodeProfile, type OpProfile } from "./support/opProfile.js"
import { streamGaps, systemPromptTtft, textOfTokens } from "./support/llm-prefill.js"

const tokens = Number(process.env.BENCH_TOKENS ?? 64)
const rounds = Number(process.env.BENCH_ROUNDS ?? 3)
const threads = Number(process.env.BENCH_THREADS ?? 2)
type BenchDtype = "fp32" | "fp16" | "q8" | "q4"
const dtypes = (process.env.BENCH_DTYPES ?? "fp32,q8").split(",") as Array<BenchDtype>
const parts = (process.env.BENCH_PARTS ?? "decode,kv,prefill").split(",")
const sizes = {
  "135m": { model: "bench/smollm2-135m", geometry: smolLm2Geometry },
  "1b": { model: "bench/llama-3.2-1b", geometry: llama32OneBGeometry }
} as const
const size = (process.env.BENCH_SIZE ?? "135m") as keyof typeof sizes
if (sizes[size] === undefined) throw new Error(`BENCH_SIZE=${size}: one of ${Object.keys(sizes).join(", ")}`)
const { model, geometry } = sizes[size]
/** The GGUF type llama.cpp runs for each dtype: the same numbers where the format allows. */
const ggufTypes = { fp32: "F32", fp16: "F16", q8: "Q8_0", q4: "Q4_0" } as const
const onnxFiles = { fp32: "model.onnx", fp16: "model_fp16.onnx", q8: "model_quantized.onnx", q4: "model_q4.onnx" }
const quantizedRows = process.env.BENCH_QUANTIZED_ROWS ?? "apart"
const q4Activations = process.env.BENCH_Q4_ACTIVATIONS ?? "exported"
const concurrency = 8
const targets = {
  singleOverLlamaCpp: 1.0,
  concurrentOverLlamaCpp: 2,
  concurrentOverSequential: 3.5,
  cachedOverCold: 0.2,
  itlJoinOverAlone: 2
}

const prompts = benchPrompts

setFlagsFromString("--expose-gc")
/**
 * A full collection of this process's heap. transformers.js runs in this process and leaves tens of
 * MB of tensors behind; without it they would be collected (on this process's GC threads) during
 * whatever runs next, the executor's turn included.
 */
const collect = runInNewContext("gc") as () => void

const decodeRate = (run: { readonly tokens: number; readonly decodeMs: number }) =>
  (run.tokens - 1) / (run.decodeMs / 1000)

/** Bytes a weight takes at each dtype (q4: half a byte, and a 4-byte scale per block of 32). */
const bytesPerWeight = { fp32: 4, fp16: 2, q8: 1, q4: 0.5 + 4 / 32 }

/** Bytes of weights a decode step reads for one token: every linear layer (lm_head included), at the dtype's width. */
const weightBytesPerToken = (dtype: BenchDtype) => {
  const { hiddenSize: h, heads, kvHeads, headDim, layers, intermediateSize: ff, vocabSize } = geometry
  const perLayer = h * heads * headDim * 2 + h * kvHeads * headDim * 2 + 3 * h * ff
  return (layers * perLayer + h * vocabSize) * bytesPerWeight[dtype]
}

const startLlmExecutor = (
  dtype: string,
  extra: ReadonlyArray<string> = [],
  env: Readonly<Record<string, string>> = {}
) =>
  startExecutor(
    [
      "--kind",
      "llm",
      "--model",
      model,
      "--dtype",
      dtype,
      "--devices",
      "cpu:0",
      "--threads-per-device",
      String(threads),
      "--max-batch-size",
      String(concurrency),
      ...(dtype === "q8" ? ["--quantized-rows", quantizedRows] : []),
      ...(dtype === "q4" ? ["--q4-activations", q4Activations] : []),
      ...extra
    ],
    env
  )

export default async function main(): Promise<void> {
  console.error(
    `models bench: ${model} (building it on first use), ${tokens} tokens per request, ${threads} threads, ${rounds} rounds, ${dtypes.join(", ")}`
  )
  const modelDir = await resolveModel(model)
  const tokenizer = new ChatTokenizer(await loadModelDirectory(modelDir))
  const promptIds = prompts.map((prompt) =>
    tokenizer.encode(tokenizer.applyChatTemplate([{ role: "user", content: prompt }]))
  )
  env.allowRemoteModels = false
  env.localModelPath = dirname(modelDir)
  const summary: Record<string, unknown> = { bench: "models", model, tokensPerRequest: tokens, threads, rounds }
  let targetsMet = true

  if (parts.includes("decode")) {
    const bandwidth = await readBandwidth(weightBytesPerToken("fp32"), threads)
    console.error(
      `read bandwidth, ${threads} threads over ${round(Math.min(weightBytesPerToken("fp32"), 2 ** 30) / 1e6, 0)} MB: ${round(bandwidth / 1e9, 1)} GB/s`
    )
    summary.readBandwidthGBps = round(bandwidth / 1e9, 1)
    for (const dtype of dtypes) {
      const result = await decodeBench(dtype, modelDir, tokenizer, promptIds, bandwidth)
      summary[dtype] = result
      targetsMet &&= result.targetsMet
    }
  }
  if (parts.includes("load")) summary.load = await loadBench(modelDir)
  if (parts.includes("prepack")) summary.prepack = await prepackBench(modelDir)
  if (parts.includes("ops")) summary.ops = await opsBench(modelDir, promptIds)
  if (parts.includes("kv")) summary.kvCache = await kvCacheBench(tokenizer)
  if (parts.includes("prefill")) {
    const result = await prefillBench(tokenizer)
    summary.prefill = result
    targetsMet &&= result.targetsMet
  }
  console.log(JSON.stringify({ ...summary, targetsMet }))
}

/**
 * For each dtype, one request decoding alone and eight decoding together through the runner, its
 * decoder profiled: the time of a decode step by op type. Each in a runner of its own, so that a
 * profile holds one batch size.
 */
async function opsBench(modelDir: string, promptIds: ReadonlyArray<ReadonlyArray<number>>) {
  const model = await loadModelDirectory(modelDir)
  // BENCH_OPS_DIR keeps the profiles there (chrome://tracing or Perfetto reads them).
  const kept = process.env.BENCH_OPS_DIR
  const dir = kept ?? (await mkdtemp(join(tmpdir(), "cornserve-ops-")))
  // At most 16 tokens a request: a profile holds every node of every run (about 1 GB for eight
  // rows decoding 64 tokens apart at the 1B geometry), and a few steps tell where a step goes.
  const maxNewTokens = Math.min(tokens, 16)
  const sampling: SamplingParams = { temperature: 0, topP: 1, seed: 0, maxNewTokens, stopTokenIds: [] }
  const results: Record<string, Record<string, OpProfile>> = {}
  try {
    for (const dtype of dtypes) {
      results[dtype] = {}
      for (const rows of [1, concurrency]) {
        const prefix = join(dir, `${dtype}-${rows}`)
        const runner = await Runner.open(model, "cpu:0", threads, dtype, {
          profilePrefix: prefix,
          ...(dtype === "q8" ? { quantizedRows: quantizedRows as QuantizedRows } : {}),
          ...(dtype === "q4" ? { q4Activations: q4Activations as "exported" | "int8" } : {})
        })
        try {
          await drive(
            runner,
            Array.from({ length: rows }, (_, i) => ({
              id: `r${i}`,
              prompt: { inputIds: Int32Array.from(promptIds[i % promptIds.length]!), media: [] },
              sampling,
              joinAt: 0
            }))
          )
        } finally {
          await runner.close()
        }
        // A runner with a rows decoder (8-bit rows per row) writes a profile of each; the one that
        // ran the decode steps is the one with the most time in them.
        const files = (await readdir(dir)).filter((file) => file.startsWith(`${basename(prefix)}-`)).sort()
        const profiles = files.flatMap((file) => {
          const profile = decodeProfile(join(dir, file))
          return profile === undefined ? [] : [profile]
        })
        const profile = profiles.sort((a, b) => b.steps * b.stepMs - a.steps * a.stepMs)[0]
        if (profile === undefined) throw new Error(`no decode runs in the profiles of ${dtype} at ${rows} rows`)
        results[dtype][String(rows)] = profile
        if (kept === undefined) for (const file of files) await rm(join(dir, file))
      }
    }
  } finally {
    if (kept === undefined) await rm(dir, { recursive: true, force: true })
  }
  console.log(`\nops: where a decode step goes, ${model.path.split("/").slice(-2).join("/")}, ${threads} threads`)
  console.log("dtype | rows a run | rows in the batch | step ms | ms per row | op: ms per step (share)")
  console.log("---|---|---|---|---|---")
  for (const [dtype, byRows] of Object.entries(results)) {
    for (const [rows, profile] of Object.entries(byRows)) {
      const outside = profile.ops.find((op) => op.op === "(between kernels)")!
      const top = [...profile.ops.filter((op) => op !== outside).slice(0, 5), outside]
        .map((op) => `${op.op} ${round(op.ms, 2)} (${round(op.share * 100, 0)}%)`)
        .join(", ")
      console.log(
        `${dtype} | ${profile.rows} | ${rows} | ${round(profile.stepMs, 2)} | ${round(profile.stepMs / profile.rows, 2)} | ${top}`
      )
    }
  }
  return Object.fromEntries(
    Object.entries(results).map(([dtype, byRows]) => [
      dtype,
      Object.fromEntries(
        Object.entries(byRows).map(([rows, profile]) => [
          rows,
          {
            runRows: profile.rows,
            stepMs: round(profile.stepMs, 2),
            ops: Object.fromEntries(profile.ops.slice(0, 8).map((op) => [op.op, round(op.ms, 3)]))
          }
        ])
      )
    ])
  )
}

/** `modelDir`'s export at `dtype` as GGUF (written on first use), for llama.cpp. */
async function ggufOf(modelDir: string, dtype: BenchDtype): Promise<string> {
  const gguf = join(modelDir, `bench-${ggufTypes[dtype].toLowerCase()}.gguf`)
  if (!existsSync(gguf)) {
    const start = performance.now()
    await writeLlamaGguf(modelDir, geometry, dtype, gguf)
    console.error(`wrote ${basename(gguf)} for llama.cpp in ${round((performance.now() - start) / 1000, 1)} s`)
  }
  return gguf
}

/** The bytes of weights of `dtype`'s export: its .onnx file and its external data, if any. */
const weightFileBytes = (modelDir: string, dtype: BenchDtype): number => {
  const file = join(modelDir, "onnx", onnxFiles[dtype])
  return statSync(file).size + (existsSync(`${file}_data`) ? statSync(`${file}_data`).size : 0)
}

/**
 * ONNX Runtime's load with its MatMul weights packed as it loads (what the executor does now)
 * against a load of the same model saved once with its packed weights beside the originals, which
 * ONNX Runtime then maps from the file instead of packing into fresh memory. Each load in a process
 * of its own (bench/support/ortPrepackLoad.mjs): the session's creation, its peak memory, and a
 * one-token step, first and steady. The saved copy goes to a temporary folder on the model's disk
 * and is removed after.
 */
async function prepackBench(modelDir: string) {
  const rows: Array<Record<string, number | string>> = []
  const load = (mode: string, onnx: string, out: string, dtype: BenchDtype) =>
    JSON.parse(
      execFileSync(
        process.execPath,
        [
          "bench/support/ortPrepackLoad.mjs",
          mode,
          onnx,
          out,
          String(threads),
          String(geometry.kvHeads),
          String(geometry.headDim),
          dtype === "fp16" ? "float16" : "float32"
        ],
        // The worker's allocator (src/executors/common/EarlySpawn.ts): huge pages for malloc.
        { env: { ...process.env, GLIBC_TUNABLES: process.env.GLIBC_TUNABLES ?? "glibc.malloc.hugetlb=1" } }
      )
        .toString()
        .trim()
        .split("\n")
        .at(-1)!
    ) as {
      createMs: number
      peakRssBytes: number
      rssBytes: number
      firstStepMs: number
      stepMs: number
      savedBytes: number
    }
  for (const dtype of dtypes) {
    const onnx = join(modelDir, "onnx", onnxFiles[dtype])
    const weights = weightFileBytes(modelDir, dtype)
    const dir = await mkdtemp(join(dirname(modelDir), ".prepack-bench-"))
    const out = join(dir, onnxFiles[dtype])
    try {
      execFileSync("sh", ["-c", 'cat "$@" > /dev/null', "sh", ...[onnx, `${onnx}_data`].filter((f) => existsSync(f))])
      const runs: Array<[string, ReturnType<typeof load>]> = []
      runs.push(["packed at load", load("plain", onnx, out, dtype)])
      runs.push(["packed and saved", load("save", onnx, out, dtype)])
      runs.push(["saved, mapped", load("saved", onnx, out, dtype)])
      runs.push(["saved, mapped (again)", load("saved", onnx, out, dtype)])
      runs.push(["packed at load (again)", load("plain", onnx, out, dtype)])
      const saved = runs[1]![1].savedBytes
      for (const [how, run] of runs)
        rows.push({
          dtype,
          how,
          weightsGB: round(weights / 1e9, 2),
          sessionS: round(run.createMs / 1000, 1),
          peakGB: round(run.peakRssBytes / 1e9, 2),
          rssAfterLoadGB: round(run.rssBytes / 1e9, 2),
          firstStepMs: Math.round(run.firstStepMs),
          stepMs: Math.round(run.stepMs),
          onDiskGB:
            how.startsWith("saved") || how === "packed and saved" ? round(saved / 1e9, 2) : round(weights / 1e9, 2)
        })
      const median = (a: number, b: number) => (a + b) / 2
      const plain = median(runs[0]![1].createMs, runs[4]![1].createMs)
      const mapped = median(runs[2]![1].createMs, runs[3]![1].createMs)
      console.error(
        `  prepack ${dtype}: session ${round(plain / 1000, 1)} s packed at load, ${round(mapped / 1000, 1)} s mapped`
      )
    } finally {
      await rm(dir, { recursive: true, force: true })
    }
  }
  console.log(`\nprepack: ${model}, ${threads} threads, ONNX Runtime alone; files in the page cache; peak = VmHWM`)
  console.log(
    "dtype | how | weights GB | session s | peak GB | RSS after load GB | first step ms | step ms | on disk GB"
  )
  for (const row of rows)
    console.log(
      [
        row.dtype,
        row.how,
        row.weightsGB,
        row.sessionS,
        row.peakGB,
        row.rssAfterLoadGB,
        row.firstStepMs,
        row.stepMs,
        row.onDiskGB
      ].join(" | ")
    )
  return rows
}

/**
 * Loading, for each dtype: the executor from its start to ready, then to the first token of one
 * request, with the peak resident memory of its worker (which holds the weights) and its router;
 * and llama.cpp on the same weights, in a process of its own (bench/support/llamaLoad.mjs). Both
 * read the files from the page cache (each is read once untimed first).
 */
async function loadBench(modelDir: string) {
  const rows: Array<Record<string, number | string>> = []
  /** One executor load: to ready, to the first token of a request, and the peaks of its worker and router. */
  const executorLoad = async (dtype: BenchDtype, env: Readonly<Record<string, string>>) => {
    collect()
    const start = performance.now()
    const executor = await startLlmExecutor(dtype, [], env)
    const readyMs = performance.now() - start
    try {
      await streamed(executor.url, model, prompts[0]!, 1, performance.now())
      const firstTokenMs = performance.now() - start
      const pids = descendants(executor.process.pid!).map((entry) => entry.pid)
      return {
        readyMs,
        firstTokenMs,
        workerPeak: Math.max(...pids.map(peakRssOf)),
        routerPeak: peakRssOf(executor.process.pid!)
      }
    } finally {
      await executor.stop()
    }
  }
  for (const dtype of dtypes) {
    const weights = weightFileBytes(modelDir, dtype)
    const gguf = await ggufOf(modelDir, dtype)
    const onnx = join(modelDir, "onnx", onnxFiles[dtype])
    const files = [onnx, `${onnx}_data`, gguf].filter((file) => existsSync(file))
    execFileSync("sh", ["-c", 'cat "$@" > /dev/null', "sh", ...files])
    const llama = JSON.parse(
      execFileSync(process.execPath, ["bench/support/llamaLoad.mjs", gguf, String(threads), String(concurrency), "256"])
        .toString()
        .trim()
        .split("\n")
        .at(-1)!
    ) as { loadedMs: number; firstTokenMs: number; peakRssBytes: number }
    // As the executor loads by default (its weights packed as it loads), then with a packed-weights
    // folder (serve --packed-weights-dir): the first load writes the copy, the next one maps it.
    const packedDir = await mkdtemp(join(dirname(modelDir), ".packed-weights-bench-"))
    const packedEnv = { CORNSERVE_PACKED_WEIGHTS_DIR: packedDir }
    try {
      for (const [how, env] of [
        ["packed at load", {}],
        ["packed, copy written", packedEnv],
        ["copy mapped", packedEnv]
      ] as const) {
        const load = await executorLoad(dtype, env)
        rows.push({
          dtype,
          how,
          weightsGB: round(weights / 1e9, 2),
          executorReadyS: round(load.readyMs / 1000, 1),
          executorFirstTokenS: round(load.firstTokenMs / 1000, 1),
          workerPeakGB: round(load.workerPeak / 1e9, 2),
          workerPeakOverWeights: round(load.workerPeak / weights, 2),
          routerPeakGB: round(load.routerPeak / 1e9, 2),
          llamaCppLoadS: round(llama.loadedMs / 1000, 1),
          llamaCppFirstTokenS: round(llama.firstTokenMs / 1000, 1),
          llamaCppPeakGB: round(llama.peakRssBytes / 1e9, 2),
          firstTokenOverLlamaCpp: round(load.firstTokenMs / llama.firstTokenMs, 2)
        })
        console.error(`  load ${dtype}: ${JSON.stringify(rows.at(-1))}`)
      }
    } finally {
      await rm(packedDir, { recursive: true, force: true })
    }
  }
  console.log(
    `load: ${model}, ${threads} threads, files in the page cache; peak = VmHWM of the process holding the weights`
  )
  console.log(
    "dtype | how | weights GB | executor ready s | executor first token s | worker peak GB | peak / weights | router peak GB | llama.cpp loaded s | llama.cpp first token s | llama.cpp peak GB | first token / llama.cpp's"
  )
  for (const row of rows)
    console.log(
      [
        row.dtype,
        row.how,
        row.weightsGB,
        row.executorReadyS,
        row.executorFirstTokenS,
        row.workerPeakGB,
        row.workerPeakOverWeights,
        row.routerPeakGB,
        row.llamaCppLoadS,
        row.llamaCppFirstTokenS,
        row.llamaCppPeakGB,
        row.firstTokenOverLlamaCpp
      ].join(" | ")
    )
  return rows
}

async function decodeBench(
  dtype: BenchDtype,
  modelDir: string,
  tokenizer: ChatTokenizer,
  promptIds: ReadonlyArray<ReadonlyArray<number>>,
  bandwidth: number
) {
  const reference = await AutoModelForCausalLM.from_pretrained(basename(modelDir), {
    dtype,
    session_options: { intraOpNumThreads: threads, interOpNumThreads: 1 }
  })
  /** transformers.js's generate(), greedy, timed through its streamer. */
  const generate = async (
    ids: ReadonlyArray<number>,
    origin = performance.now()
  ): Promise<Run & { readonly ids: ReadonlyArray<number> }> => {
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
      ids: generated,
      tokens: generated.length,
      firstTokenMs: first - origin,
      decodeMs: last - first,
      endMs: last - origin
    }
  }

  const gguf = await ggufOf(modelDir, dtype)
  const llama = await LlamaCpp.open(gguf, { threads, sequences: concurrency, positions: 256 })
  const executor = await startLlmExecutor(dtype)
  const stopExecutor = () => void executor.process.kill("SIGTERM")
  process.once("SIGINT", stopExecutor)
  try {
    const samples = {
      transformersSingle: { rate: [] as Array<number>, ttft: [] as Array<number> },
      llamaCppSingle: { rate: [] as Array<number>, ttft: [] as Array<number> },
      apiSingle: { rate: [] as Array<number>, ttft: [] as Array<number> },
      transformersSequential: { rate: [] as Array<number>, ttft: [] as Array<number> },
      llamaCppParallel: { rate: [] as Array<number>, ttft: [] as Array<number> },
      apiConcurrent: { rate: [] as Array<number>, ttft: [] as Array<number> }
    }
    /** Where the executor's time went, for its 1-request runs and its concurrent ones. */
    const clocks = { single: new TimeSplit(), concurrent: new TimeSplit() }
    let mismatches = 0
    /** How many leading greedy tokens llama.cpp's answers share with transformers.js's (near-ties part them later). */
    const llamaCppAgreement: Array<number> = []
    const expected = new Map<number, string>()
    const expectedIds = new Map<number, ReadonlyArray<number>>()
    const check = (index: number, run: Run) => {
      if (run.text !== expected.get(index) || run.tokens !== tokens) mismatches++
    }
    const checkLlama = (index: number, run: LlamaRun) => {
      const ids = expectedIds.get(index)!
      const first = run.tokens.findIndex((token, i) => token !== ids[i])
      llamaCppAgreement.push(first < 0 ? run.tokens.length : first)
    }
    const expect = (index: number, run: Run & { readonly ids: ReadonlyArray<number> }) => {
      expected.set(index, run.text)
      expectedIds.set(index, run.ids)
    }
    const llamaRun = (run: LlamaRun) => ({
      tokens: run.tokens.length,
      decodeMs: run.decodeMs,
      firstTokenMs: run.firstTokenMs
    })

    // Warm-up, one run of each workload that is measured.
    for (const [index, ids] of promptIds.entries()) expect(index, await generate(ids))
    await llama.generate([promptIds[0]!], tokens)
    await llama.generate(promptIds, tokens)
    await streamed(executor.url, model, prompts[0]!, tokens, performance.now())
    await Promise.all(prompts.map((prompt) => streamed(executor.url, model, prompt, tokens, performance.now())))

    const ratios = {
      singleOverTransformers: [] as Array<number>,
      singleOverLlamaCpp: [] as Array<number>,
      concurrentOverSequential: [] as Array<number>,
      concurrentOverLlamaCpp: [] as Array<number>
    }
    for (let r = 0; r < rounds; r++) {
      for (let pair = 0; pair < 2; pair++) {
        const which = (r * 2 + pair) % prompts.length
        const runs = {
          reference: async () => {
            collect()
            const run = await generate(promptIds[which]!)
            expect(which, run)
            return run
          },
          llama: async () => {
            collect()
            return (await llama.generate([promptIds[which]!], tokens))[0]!
          },
          api: async () => {
            collect()
            const before = await workerClock(executor.url)
            const run = await streamed(executor.url, model, prompts[which]!, tokens, performance.now())
            clocks.single.add(run.endMs, before, await workerClock(executor.url))
            return run
          }
        }
        // Rotate the order between pairs and rounds.
        const order = (["reference", "llama", "api"] as const).map((_, i, all) => all[(i + r + pair) % 3]!)
        const done: Partial<{ reference: Run; llama: LlamaRun; api: Run }> = {}
        for (const name of order) (done as Record<string, unknown>)[name] = await runs[name]()
        const { reference: referenceRun, llama: llamaCppRun, api: apiRun } = done as Required<typeof done>
        samples.transformersSingle.rate.push(decodeRate(referenceRun))
        samples.transformersSingle.ttft.push(referenceRun.firstTokenMs)
        samples.llamaCppSingle.rate.push(decodeRate(llamaRun(llamaCppRun)))
        samples.llamaCppSingle.ttft.push(llamaCppRun.firstTokenMs)
        samples.apiSingle.rate.push(decodeRate(apiRun))
        samples.apiSingle.ttft.push(apiRun.firstTokenMs)
        ratios.singleOverTransformers.push(decodeRate(apiRun) / decodeRate(referenceRun))
        ratios.singleOverLlamaCpp.push(decodeRate(apiRun) / decodeRate(llamaRun(llamaCppRun)))
        check(which, apiRun)
        checkLlama(which, llamaCppRun)
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
      const runParallel = async () => {
        collect()
        const start = performance.now()
        const runs = await llama.generate(promptIds, tokens, start)
        runs.forEach((run, index) => checkLlama(index, run))
        return {
          rate: (concurrency * tokens) / (Math.max(...runs.map((run) => run.endMs)) / 1000),
          ttft: mean(runs.map((run) => run.firstTokenMs))
        }
      }
      const runConcurrent = async () => {
        collect()
        const before = await workerClock(executor.url)
        const start = performance.now()
        const runs = await Promise.all(prompts.map((prompt) => streamed(executor.url, model, prompt, tokens, start)))
        clocks.concurrent.add(Math.max(...runs.map((run) => run.endMs)), before, await workerClock(executor.url))
        runs.forEach((run, index) => check(index, run))
        return {
          rate: (concurrency * tokens) / (Math.max(...runs.map((run) => run.endMs)) / 1000),
          ttft: mean(runs.map((run) => run.firstTokenMs))
        }
      }
      const loads = { sequential: runSequential, parallel: runParallel, concurrent: runConcurrent }
      const order = (["sequential", "parallel", "concurrent"] as const).map((_, i, all) => all[(i + r) % 3]!)
      const measured: Partial<Record<keyof typeof loads, { rate: number; ttft: number }>> = {}
      for (const name of order) measured[name] = await loads[name]()
      const { sequential, parallel, concurrent } = measured as Required<typeof measured>
      samples.transformersSequential.rate.push(sequential.rate)
      samples.transformersSequential.ttft.push(sequential.ttft)
      samples.llamaCppParallel.rate.push(parallel.rate)
      samples.llamaCppParallel.ttft.push(parallel.ttft)
      samples.apiConcurrent.rate.push(concurrent.rate)
      samples.apiConcurrent.ttft.push(concurrent.ttft)
      ratios.concurrentOverSequential.push(concurrent.rate / sequential.rate)
      ratios.concurrentOverLlamaCpp.push(concurrent.rate / parallel.rate)
      console.error(
        `  ${dtype} round ${r + 1}: 1 request: transformers.js ${round(samples.transformersSingle.rate.at(-1)!, 1)}, llama.cpp ${round(samples.llamaCppSingle.rate.at(-1)!, 1)}, api ${round(samples.apiSingle.rate.at(-1)!, 1)} tok/s; ` +
          `8 requests: transformers.js one after another ${round(sequential.rate, 1)}, llama.cpp parallel ${round(parallel.rate, 1)}, api concurrent ${round(concurrent.rate, 1)} tok/s`
      )
    }

    const figures = figuresOf(samples)
    const limit = bandwidth / weightBytesPerToken(dtype)
    const medians = Object.fromEntries(
      Object.entries(ratios).map(([name, values]) => [name, round(median(values), 3)])
    ) as Record<keyof typeof ratios, number>
    const rows: ReadonlyArray<readonly [string, string, Figure, string]> = [
      ["1 request", "transformers.js generate()", figures.transformersSingle, "decode"],
      ["1 request", "llama.cpp, one sequence", figures.llamaCppSingle, "decode"],
      ["1 request", "executor API", figures.apiSingle, "decode"],
      ["8 requests", "transformers.js, one after another", figures.transformersSequential, "aggregate"],
      ["8 requests", "llama.cpp, 8 parallel sequences", figures.llamaCppParallel, "aggregate"],
      ["8 requests", "executor API, concurrent", figures.apiConcurrent, "aggregate"]
    ]
    printTable(
      `models bench: ${model} (decoder-only, ${dtype}${dtype === "q8" ? `, --quantized-rows ${quantizedRows}` : ""}${dtype === "q4" ? `, --q4-activations ${q4Activations}` : ""}; llama.cpp ${ggufTypes[dtype]}), ${tokens} tokens per request (greedy, streamed), ${threads} threads, medians over ${rounds} rounds`,
      rows
    )
    console.log(
      `${dtype}: memory-bandwidth limit at 1 request ${round(limit, 1)} tok/s (${round(weightBytesPerToken(dtype) / 1e6, 0)} MB a token at ${round(bandwidth / 1e9, 1)} GB/s): ` +
        `llama.cpp at ${round(figures.llamaCppSingle.tokensPerSecond / limit, 2)} of it, the executor at ${round(figures.apiSingle.tokensPerSecond / limit, 2)}`
    )
    for (const [load, clock] of [
      ["1 request", clocks.single],
      ["8 concurrent", clocks.concurrent]
    ] as const)
      console.log(`${dtype}: where the executor's time went at ${load}: ${clock.describe()}`)
    console.log(
      `${dtype}: 1 request ${medians.singleOverLlamaCpp} × llama.cpp (target ≥ ${targets.singleOverLlamaCpp}), ${medians.singleOverTransformers} × transformers.js; ` +
        `8 concurrent ${medians.concurrentOverLlamaCpp} × llama.cpp's 8 parallel (target ≥ ${targets.concurrentOverLlamaCpp}), ${medians.concurrentOverSequential} × transformers.js one after another (target ≥ ${targets.concurrentOverSequential}); ` +
        `greedy outputs ${mismatches === 0 ? "identical to transformers.js" : `differ from transformers.js in ${mismatches} requests`}; ` +
        `llama.cpp's share their first ${median(llamaCppAgreement)} tokens with them (median; near-ties part them after)`
    )
    return {
      ...figures,
      ...medians,
      timeSplit: { single: clocks.single.shares(), concurrent: clocks.concurrent.shares() },
      bandwidthLimitTokensPerSecond: round(limit, 1),
      outputMismatches: mismatches,
      llamaCppAgreement: median(llamaCppAgreement),
      targetsMet:
        medians.singleOverLlamaCpp >= targets.singleOverLlamaCpp &&
        medians.concurrentOverLlamaCpp >= targets.concurrentOverLlamaCpp &&
        medians.concurrentOverSequential >= targets.concurrentOverSequential &&
        mismatches === 0
    }
  } finally {
    process.off("SIGINT", stopExecutor)
    await executor.stop()
    await llama.close()
    await reference.dispose()
  }
}

type StepClock = NonNullable<LlmStats["steps"]>

/** The executor's step clock (its stats' `steps`), summed over its workers. */
const workerClock = async (url: string): Promise<StepClock> => {
  const response = await fetch(new URL("/v1/cornserve/stats", url), { headers: executorHeaders() })
  const steps = ((await response.json()) as LlmStats).steps
  if (steps === undefined) throw new Error("the executor's stats have no step clock")
  return steps
}

/**
 * A load's wall time at the client (its request to its last token) beside the worker's step time
 * in it, and of that the decoder's runs in ONNX Runtime: how much of the time the API adds around
 * ONNX Runtime, and whether it is in the worker's steps or between them.
 */
class TimeSplit {
  private wallMs = 0
  private stepMs = 0
  private decoderMs = 0
  private steps = 0

  add(wallMs: number, before: StepClock, after: StepClock): void {
    this.wallMs += wallMs
    this.stepMs += (after.seconds - before.seconds) * 1000
    this.decoderMs += (after.decoderSeconds - before.decoderSeconds) * 1000
    this.steps += after.count - before.count
  }

  shares() {
    return {
      steps: this.steps,
      stepShare: round(this.stepMs / this.wallMs, 3),
      decoderShare: round(this.decoderMs / this.wallMs, 3),
      decoderMsPerStep: round(this.decoderMs / this.steps, 2),
      otherMsPerStep: round((this.wallMs - this.decoderMs) / this.steps, 2)
    }
  }

  describe(): string {
    const { steps, stepShare, decoderShare, decoderMsPerStep, otherMsPerStep } = this.shares()
    return (
      `${steps} steps; of the wall time, ${round(stepShare * 100, 1)}% in the worker's steps, ${round(decoderShare * 100, 1)}% in ONNX Runtime's decoder runs ` +
      `(${decoderMsPerStep} ms a step, and ${otherMsPerStep} ms a step besides: sampling, bookkeeping, messages, waits between steps)`
    )
  }
}

/**
 * Decode on the shared KV cache against the decoder as exported, in turns: aggregate decode
 * tokens/s over the time all of a load's streams decode together (prompts are prefilled whole, so
 * they start together).
 */
async function kvCacheBench(tokenizer: ChatTokenizer) {
  const common = ["--prefill-chunk-tokens", "0", "--prefix-cache-bytes", "0"]
  const shared = await startLlmExecutor("fp32", common)
  const copies = await startLlmExecutor("fp32", [...common, "--kv-cache-mode", "copies"])
  const loads = [
    { name: "1 request, chat prompt", prompts: [prompts[0]!] },
    { name: "8 concurrent, chat prompts", prompts },
    {
      name: "4 concurrent, ~1,000-token prompts",
      prompts: [0, 1, 2, 3].map((seed) => `${textOfTokens(tokenizer, 1000, 300 + seed)} Go on.`)
    },
    { name: "1 request, ~2,000-token prompt", prompts: [`${textOfTokens(tokenizer, 2000, 400)} Go on.`] }
  ]
  /** Aggregate decode tokens/s from the last first token to the last token, and the texts. */
  const run = async (url: string, load: (typeof loads)[number]) => {
    collect()
    const start = performance.now()
    const runs = await Promise.all(load.prompts.map((prompt) => streamed(url, model, prompt, tokens, start)))
    const from = Math.max(...runs.map((one) => one.firstTokenMs))
    const to = Math.max(...runs.map((one) => one.endMs))
    return { rate: (runs.length * (tokens - 1)) / ((to - from) / 1000), texts: runs.map((one) => one.text) }
  }
  try {
    for (const load of loads) for (const executor of [shared, copies]) await run(executor.url, load)
    const rates = loads.map(() => ({ shared: [] as Array<number>, copies: [] as Array<number> }))
    let same = 0
    let compared = 0
    for (let r = 0; r < rounds; r++) {
      for (const [index, load] of loads.entries()) {
        const order = r % 2 === 0 ? (["shared", "copies"] as const) : (["copies", "shared"] as const)
        const texts: Partial<Record<"shared" | "copies", ReadonlyArray<string>>> = {}
        for (const mode of order) {
          const result = await run((mode === "shared" ? shared : copies).url, load)
          rates[index]![mode].push(result.rate)
          texts[mode] = result.texts
        }
        texts.shared!.forEach((text, i) => {
          compared++
          if (text === texts.copies![i]) same++
        })
      }
      console.error(
        `  kv round ${r + 1}: ${loads.map((load, i) => `${load.name}: shared ${round(rates[i]!.shared.at(-1)!, 1)}, copies ${round(rates[i]!.copies.at(-1)!, 1)}`).join("; ")} tok/s`
      )
    }
    console.log(
      `KV cache: ${model}, fp32, ${tokens} tokens per request, ${threads} threads, medians over ${rounds} rounds`
    )
    console.log(
      "load                                  | shared cache (tok/s) | as exported, copies (tok/s) | shared ÷ copies"
    )
    const results = loads.map((load, i) => {
      const sharedRate = median(rates[i]!.shared)
      const copiesRate = median(rates[i]!.copies)
      const ratio = round(median(rates[i]!.shared.map((rate, k) => rate / rates[i]!.copies[k]!)), 2)
      console.log(
        `${load.name.padEnd(38)}| ${String(round(sharedRate, 1)).padEnd(21)}| ${String(round(copiesRate, 1)).padEnd(28)}| ${ratio}`
      )
      return {
        load: load.name,
        sharedTokensPerSecond: round(sharedRate, 1),
        copiesTokensPerSecond: round(copiesRate, 1),
        ratio
      }
    })
    console.log(
      `greedy answers: ${same} of ${compared} identical on both (attention sums in another order; near-ties of random weights can part them)`
    )
    return { loads: results, identicalAnswers: same, comparedAnswers: compared }
  } finally {
    await Promise.all([shared.stop(), copies.stop()])
  }
}

/** TTFT cold vs cached, and ITL p99 while a long prompt joins, with chunked prefill and without. */
async function prefillBench(tokenizer: ChatTokenizer) {
  const measure = async (extra: ReadonlyArray<string>, withTtft: boolean, seed: number) => {
    const executor = await startLlmExecutor("fp32", extra)
    try {
      // Warm-up: every batch size the streams meet, and a long prefill.
      await streamGaps(executor.url, model, tokenizer, { seed, aloneTokens: 16 })
      await streamGaps(executor.url, model, tokenizer, { seed: seed + 1, joinTokens: 300 })
      const ttft = withTtft ? await systemPromptTtft(executor.url, model, tokenizer, rounds) : undefined
      const alone: Array<number> = []
      const joined: Array<number> = []
      const joinTtft: Array<number> = []
      for (let r = 0; r < rounds; r++) {
        collect()
        alone.push(...(await streamGaps(executor.url, model, tokenizer, { seed: seed + 10 + r })).gaps)
        collect()
        const join = await streamGaps(executor.url, model, tokenizer, { seed: seed + 20 + r, joinTokens: 2000 })
        joined.push(...join.gaps)
        joinTtft.push(join.joinTtft!)
      }
      return { ttft, aloneP99: percentile(alone, 99), joinedP99: percentile(joined, 99), joinTtft: median(joinTtft) }
    } finally {
      await executor.stop()
    }
  }
  const chunked = await measure([], true, 100)
  const whole = await measure(["--prefill-chunk-tokens", "0"], false, 200)
  const ttft = chunked.ttft!
  const cachedOverCold = round(ttft.cached / ttft.cold, 3)
  const chunkedRatio = round(chunked.joinedP99 / chunked.aloneP99, 2)
  const wholeRatio = round(whole.joinedP99 / whole.aloneP99, 2)
  console.log(`prefill: ${model}, fp32, ${threads} threads, ${rounds} rounds`)
  console.log("measure                                              | value")
  console.log(
    `TTFT, ~1,000-token system prompt, cold (ms)           | ${round(ttft.cold, 1)} (rounds ${ttft.coldRounds.map((v) => round(v, 0)).join(", ")})`
  )
  console.log(
    `TTFT, same system prompt cached (ms)                  | ${round(ttft.cached, 1)} (rounds ${ttft.cachedRounds.map((v) => round(v, 0)).join(", ")})`
  )
  console.log(
    `cached / cold                                         | ${cachedOverCold} (target ≤ ${targets.cachedOverCold})`
  )
  console.log(
    `ITL p99, 4 streams alone (ms)                         | ${round(chunked.aloneP99, 1)} (without chunking: ${round(whole.aloneP99, 1)})`
  )
  console.log(
    `ITL p99, a 2,000-token prompt joining, chunked (ms)   | ${round(chunked.joinedP99, 1)}: ${chunkedRatio} × alone (target ≤ ${targets.itlJoinOverAlone})`
  )
  console.log(
    `ITL p99, a 2,000-token prompt joining, whole (ms)     | ${round(whole.joinedP99, 1)}: ${wholeRatio} × alone`
  )
  console.log(
    `the joining prompt's TTFT, chunked / whole (ms)       | ${round(chunked.joinTtft, 0)} / ${round(whole.joinTtft, 0)}`
  )
  return {
    ttftColdMs: round(ttft.cold, 1),
    ttftCachedMs: round(ttft.cached, 1),
    cachedOverCold,
    itlAloneP99Ms: round(chunked.aloneP99, 1),
    itlJoinChunkedP99Ms: round(chunked.joinedP99, 1),
    itlJoinWholeP99Ms: round(whole.joinedP99, 1),
    itlChunkedOverAlone: chunkedRatio,
    itlWholeOverAlone: wholeRatio,
    joinTtftChunkedMs: round(chunked.joinTtft, 0),
    joinTtftWholeMs: round(whole.joinTtft, 0),
    targetsMet: cachedOverCold <= targets.cachedOverCold && chunkedRatio <= targets.itlJoinOverAlone
  }
}
