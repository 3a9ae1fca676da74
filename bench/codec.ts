/**
 * Mimi codes to audio: a random-weight Mimi decoder at kyutai/mimi's geometry (32 codebooks of
 * 2,048, hidden 512, 8 transformer layers with a 250-step window, a 64-filter SEANet with ratios 8,
 * 6, 5, 4) in the community's layout (onnx-community/kyutai-mimi-ONNX's decoder_model), through
 * Geri's `POST /codes`, against transformers.js's MimiDecoderModel on the same files in this
 * process, with the same ONNX Runtime thread count, in the same run.
 *
 * - 1 request: one sequence at a time, streamed (NDJSON chunks of PCM16, the default plan: 5
 *   frames, then 40 doubling to 200, each window with 25 frames of left context) vs one
 *   MimiDecoderModel call over the whole sequence: real-time factor (processing seconds ÷ audio
 *   seconds, lower is better) and time to first audio (ours: to the first chunk line;
 *   transformers.js: the whole call, as it hands the audio over only at the end).
 * - Whole: ours with one chunk larger than the sequence (`stream: false`), the same work as
 *   transformers.js's: the cost of the platform around the model.
 * - 4 concurrent: 4 sequences sent at once vs 4 calls started together: audio seconds per wall second.
 * - Accuracy: kyutai/mimi's decoder reaches about 1,000 frames back, so 25 frames of context is not
 *   exact: the streamed samples against whole decoding, as the largest difference and the
 *   signal-to-difference ratio. (On the test fixture, whose reach fits in the context, the chunks
 *   equal the whole within 1e-5.)
 *
 * Sequences of 4, 8, 15 and 30 s (50 to 375 frames) of seeded random codes. Runs alternate which side
 * goes first; the ratios are medians. Prints a table, then (as the last line) one JSON object.
 *
 * Env: BENCH_ROUNDS (default 3), BENCH_THREADS (ONNX Runtime threads, default 2), BENCH_SMALL=1 (a
 * small decoder for a quick try).
 */
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { MimiDecoderModel, Tensor } from "@huggingface/transformers"
import type { CodesRequest } from "../src/executors/geri/api.js"
import { mimiExactContextFrames } from "../src/models/architectures/Mimi.js"
import { mimiGeometry, randomMimiFiles, tinyMimiGeometry } from "../src/models/recipes/RandomMimi.js"
import { writeModelFiles } from "../test/models/support/SmolVlmFixture.js"
import { offline } from "../test/models/support/TransformersJs.js"
import { executorHeaders, startExecutor } from "../test/support/executors.js"
import { readAudioLines } from "./support/audio-lines.js"
import { median, round } from "./support/chat-stream.js"

const rounds = Number(process.env.BENCH_ROUNDS ?? 3)
const threads = Number(process.env.BENCH_THREADS ?? 2)
const small = process.env.BENCH_SMALL === "1"
const concurrency = 4
const sampleRate = 24000
const seconds = [4, 8, 15, 30]
const targets = { single: 1, concurrent: 1 }

const size = small ? { ...tinyMimiGeometry, hidden: 128, numFilters: 16, numQuantizers: 16 } : mimiGeometry

/** Seeded codes, one row per codebook. */
const codesFor = (frames: number, seed: number) =>
  Array.from({ length: size.numQuantizers }, (_, q) =>
    Array.from({ length: frames }, (_, t) => (t * 7919 + q * 104729 + seed * 15485863) % size.codebookSize)
  )

interface Decoded {
  readonly samples: Float32Array
  readonly seconds: number
  readonly ttfaSeconds: number
  readonly chunks: number
}

export default async function codecBench(): Promise<void> {
  const root = await mkdtemp(join(tmpdir(), "cornserve-bench-codec-"))
  const model = join(root, "mimi-bench")
  await writeModelFiles(model, randomMimiFiles({ seed: 9, ...size }).files)
  console.error(`codec bench: ${small ? "small" : "kyutai/mimi"} geometry, ${threads} threads, ${rounds} rounds`)
  const reference = (await MimiDecoderModel.from_pretrained(offline(model), {
    dtype: "fp32",
    session_options: { intraOpNumThreads: threads, interOpNumThreads: 1 }
  })) as MimiDecoderModel
  const geri = await startExecutor(
    ["--kind", "geri", "--model", model, "--devices", "cpu:0", "--threads-per-device", String(threads)],
    { CORNSERVE_MODEL_ROOTS: root }
  )
  const stop = () => geri.process.kill("SIGTERM")
  process.once("SIGINT", stop)
  try {
    const theirs = async (codes: ReadonlyArray<ReadonlyArray<number>>): Promise<Decoded> => {
      const start = performance.now()
      const frames = codes[0]!.length
      const output = (await reference({
        audio_codes: new Tensor("int64", BigInt64Array.from(codes.flat(), BigInt), [1, codes.length, frames])
      })) as { audio_values: Tensor }
      const elapsed = (performance.now() - start) / 1000
      return { samples: output.audio_values.data as Float32Array, seconds: elapsed, ttfaSeconds: elapsed, chunks: 1 }
    }

    const ours = async (codes: ReadonlyArray<ReadonlyArray<number>>, whole: boolean): Promise<Decoded> => {
      const start = performance.now()
      const body: CodesRequest = whole
        ? { codes, stream: false, firstChunkFrames: 4096, maxChunkFrames: 4096 }
        : { codes, stream: true }
      const response = await fetch(`${geri.url}/codes`, {
        method: "POST",
        headers: executorHeaders({ "content-type": "application/json" }),
        body: JSON.stringify(body)
      })
      if (response.status !== 200 || response.body === null)
        throw new Error(`Geri answered ${response.status}: ${await response.text()}`)
      if (whole) {
        const wav = new Uint8Array(await response.arrayBuffer())
        const pcm = new Int16Array(wav.buffer.slice(wav.byteOffset + 44, wav.byteOffset + wav.byteLength))
        const elapsed = (performance.now() - start) / 1000
        return { samples: Float32Array.from(pcm, (s) => s / 32767), seconds: elapsed, ttfaSeconds: elapsed, chunks: 1 }
      }
      const { parts, ttfaSeconds: ttfa } = await readAudioLines(response, start, sampleRate)
      const samples = new Float32Array(parts.reduce((sum, part) => sum + part.length, 0))
      let at = 0
      for (const part of parts) {
        for (let i = 0; i < part.length; i++) samples[at + i] = part[i]! / 32767
        at += part.length
      }
      return { samples, seconds: (performance.now() - start) / 1000, ttfaSeconds: ttfa, chunks: parts.length }
    }

    /** Ours (PCM16 back to floats) against theirs, clamped as PCM16 is: largest difference and SNR in dB. */
    const accuracy = { worst: 0, snr: [] as Array<number> }
    const compare = (expected: Float32Array, got: Float32Array) => {
      if (expected.length !== got.length)
        throw new Error(`${got.length} samples; transformers.js wrote ${expected.length}`)
      let signal = 0
      let noise = 0
      for (let i = 0; i < expected.length; i++) {
        const e = Math.max(-1, Math.min(1, expected[i]!))
        const difference = e - got[i]!
        accuracy.worst = Math.max(accuracy.worst, Math.abs(difference))
        signal += e * e
        noise += difference * difference
      }
      accuracy.snr.push(10 * Math.log10(signal / Math.max(noise, 1e-20)))
    }

    const single = {
      refRtf: [] as Array<number>,
      apiRtf: [] as Array<number>,
      wholeRtf: [] as Array<number>,
      ratio: [] as Array<number>,
      wholeRatio: [] as Array<number>,
      refTtfa: [] as Array<number>,
      apiTtfa: [] as Array<number>,
      ttfaRatio: [] as Array<number>
    }
    const concurrent = { ref: [] as Array<number>, api: [] as Array<number>, ratio: [] as Array<number> }

    const measureSingle = async (length: number, seed: number, turn: number, record: boolean) => {
      const codes = codesFor(Math.round(length * 12.5), seed)
      const runs = [() => theirs(codes), () => ours(codes, false), () => ours(codes, true)]
      const results: Array<Decoded | undefined> = [undefined, undefined, undefined]
      for (let k = 0; k < runs.length; k++) {
        const index = (turn + k) % runs.length
        results[index] = await runs[index]!()
      }
      const [ref, api, once] = results as [Decoded, Decoded, Decoded]
      compare(ref.samples, api.samples)
      if (!record) return
      const audio = ref.samples.length / sampleRate
      single.refRtf.push(ref.seconds / audio)
      single.apiRtf.push(api.seconds / audio)
      single.wholeRtf.push(once.seconds / audio)
      single.ratio.push(ref.seconds / api.seconds)
      single.wholeRatio.push(ref.seconds / once.seconds)
      single.refTtfa.push(ref.ttfaSeconds * 1000)
      single.apiTtfa.push(api.ttfaSeconds * 1000)
      single.ttfaRatio.push(ref.ttfaSeconds / api.ttfaSeconds)
    }

    const measureConcurrent = async (seed: number, refFirst: boolean) => {
      const batch = seconds.map((length, index) => codesFor(Math.round(length * 12.5), seed + index))
      const side = async (run: (codes: ReadonlyArray<ReadonlyArray<number>>) => Promise<Decoded>) => {
        const start = performance.now()
        const decoded = await Promise.all(batch.map(run))
        return { seconds: (performance.now() - start) / 1000, decoded }
      }
      const runRef = () => side(theirs)
      const runApi = () => side((codes) => ours(codes, false))
      const [ref, api] = refFirst
        ? [await runRef(), await runApi()]
        : await runApi().then(async (first) => [await runRef(), first] as const)
      batch.forEach((_, index) => compare(ref.decoded[index]!.samples, api.decoded[index]!.samples))
      const audio = ref.decoded.reduce((sum, decoded) => sum + decoded.samples.length / sampleRate, 0)
      concurrent.ref.push(audio / ref.seconds)
      concurrent.api.push(audio / api.seconds)
      concurrent.ratio.push(ref.seconds / api.seconds)
    }

    await measureSingle(seconds[0]!, 0, 0, false)
    for (let r = 0; r < rounds; r++) {
      for (const [index, length] of seconds.entries()) await measureSingle(length, r * 10 + index + 1, r + index, true)
      await measureConcurrent(100 + r * 10, r % 2 === 0)
    }

    const row = (name: string, theirsValue: string, oursValue: string, ratio: string) =>
      `| ${name} | ${theirsValue} | ${oursValue} | ${ratio} |`
    const exact = mimiExactContextFrames(size)
    console.log(
      `Mimi decoder (${small ? "small" : "kyutai/mimi geometry"}), ${threads} threads, ${rounds} rounds; sequences ${seconds.join(", ")} s; context ${Math.min(exact, 25)} frames (the decoder's reach: ${exact})`
    )
    console.log("| measure | transformers.js | cornserve | ratio (median) |")
    console.log("|---|---|---|---|")
    console.log(
      row(
        "RTF, 1 request, streamed",
        `${round(median(single.refRtf), 3)}`,
        `${round(median(single.apiRtf), 3)}`,
        `${round(median(single.ratio), 2)}×`
      )
    )
    console.log(
      row(
        "RTF, 1 request, whole (one window)",
        `${round(median(single.refRtf), 3)}`,
        `${round(median(single.wholeRtf), 3)}`,
        `${round(median(single.wholeRatio), 2)}×`
      )
    )
    console.log(
      row(
        "time to first audio (ms)",
        `${round(median(single.refTtfa), 0)}`,
        `${round(median(single.apiTtfa), 0)}`,
        `${round(median(single.ttfaRatio), 1)}×`
      )
    )
    console.log(
      row(
        `audio s per s, ${concurrency} concurrent`,
        `${round(median(concurrent.ref), 1)}`,
        `${round(median(concurrent.api), 1)}`,
        `${round(median(concurrent.ratio), 2)}×`
      )
    )
    console.log(
      `streamed vs whole decoding: largest difference ${round(accuracy.worst, 4)}, SNR median ${round(median(accuracy.snr), 1)} dB (min ${round(Math.min(...accuracy.snr), 1)} dB)`
    )
    console.log(
      JSON.stringify({
        bench: "codec",
        geometry: small ? "small" : "kyutai/mimi",
        threads,
        rounds,
        rtf: { transformersJs: median(single.refRtf), streamed: median(single.apiRtf), whole: median(single.wholeRtf) },
        singleRatio: median(single.ratio),
        wholeRatio: median(single.wholeRatio),
        ttfaMs: { transformersJs: median(single.refTtfa), streamed: median(single.apiTtfa) },
        ttfaRatio: median(single.ttfaRatio),
        concurrentRatio: median(concurrent.ratio),
        snrDb: median(accuracy.snr),
        largestDifference: accuracy.worst,
        targets,
        met: median(single.ratio) >= targets.single && median(concurrent.ratio) >= targets.concurrent
      })
    )
  } finally {
    stop()
    await reference.dispose()
    await rm(root, { recursive: true, force: true })
  }
}
