/**
 * Whisper speech recognition: a random-weight Whisper at whisper-tiny's geometry (d_model 384, 6
 * heads, 4 encoder and 4 decoder layers, Whisper's 51865-token vocabulary; or BENCH_SIZE=base:
 * whisper-base's, d_model 512, 8 heads, 6 and 6 layers) in the community's
 * layout (encoder_model.onnx, decoder_model_merged.onnx) through Eric's `POST /transcriptions`,
 * against transformers.js's automatic-speech-recognition pipeline on the same files in this
 * process, with the same ONNX Runtime thread count, in the same run.
 *
 * - 1 request: one transcription at a time vs one pipeline call at a time.
 * - 8 concurrent: 8 transcriptions sent at once (their passes batched by the engine and decoded in
 *   lockstep) vs the same 8 through the pipeline called together (which runs them one after
 *   another).
 * - Long form: one 70 s clip in 30 s windows (`chunkSeconds` vs `chunk_length_s`).
 *
 * Each measures transcriptions per second and the real-time factor (processing seconds ÷ audio
 * seconds, lower is better). The clips are speech-like (a tone changing every second over noise),
 * each its own, sent as 16 kHz mono 16-bit WAV data: URLs to the executor and as the same samples
 * to the pipeline. Every clip's text through the API is checked against the pipeline's. Runs
 * alternate between the two sides in rounds; the ratios are medians. Prints a table, then (as the
 * last line) one JSON object.
 *
 * Env: BENCH_SIZE (tiny, the default, or base), BENCH_ROUNDS (default 3), BENCH_THREADS (ONNX Runtime threads, default 2), BENCH_SECONDS
 * (a clip's length, default 10), BENCH_MAX_LENGTH (generation_config's max_length, prompt
 * included, default 64; both sides stop at the end of text or there).
 */
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { type AutomaticSpeechRecognitionPipeline, pipeline } from "@huggingface/transformers"
import { Schema } from "effect"
import { TranscriptionsRequest, TranscriptionsResponse } from "../src/executors/eric/api.js"
import { wavFile } from "../src/executors/geri/router.js"
import { Random } from "../src/models/Random.js"
import { randomWhisperFiles } from "../src/models/recipes/RandomWhisper.js"
import { writeModelFiles } from "../test/models/support/SmolVlmFixture.js"
import { offline } from "../test/models/support/TransformersJs.js"
import { executorHeaders, startExecutor } from "../test/support/executors.js"
import { median, round } from "./support/chat-stream.js"

/** Whisper's geometries: the community's whisper-tiny and whisper-base. */
const sizes = {
  tiny: { dModel: 384, heads: 6, encoderLayers: 4, decoderLayers: 4 },
  base: { dModel: 512, heads: 8, encoderLayers: 6, decoderLayers: 6 }
} as const
const size = (process.env.BENCH_SIZE ?? "tiny") as keyof typeof sizes
if (sizes[size] === undefined) throw new Error(`BENCH_SIZE=${size}: one of ${Object.keys(sizes).join(", ")}`)
const rounds = Number(process.env.BENCH_ROUNDS ?? 3)
const threads = Number(process.env.BENCH_THREADS ?? 2)
const clipSeconds = Number(process.env.BENCH_SECONDS ?? 10)
const maxLength = Number(process.env.BENCH_MAX_LENGTH ?? 64)
const concurrency = 8
/** Clips a round transcribes one at a time on each side. */
const singleClips = 4
const longSeconds = 70
const chunkSeconds = 30
const language = "en"
const samplingRate = 16000
const targets = { single: 1, concurrent: 2 }

/** A clip as both sides take it: the WAV data: URL the executor reads, and the samples it decodes from it. */
interface Clip {
  readonly url: string
  readonly samples: Float32Array
  readonly seconds: number
}

/**
 * Tones that change every second, over noise: content the random model answers differently to.
 * Quantized to 16 bits, so that the pipeline gets exactly the samples the executor reads from the WAV.
 */
const speechLike = (seconds: number, seed: number): Clip => {
  const random = new Random(seed)
  const pitches = Array.from({ length: Math.ceil(seconds) + 1 }, () => 120 + random.below(600))
  const pcm = Int16Array.from(random.normals(Math.round(seconds * samplingRate), 0.05), (noise, i) => {
    const t = i / samplingRate
    const value = noise + 0.4 * Math.sin(2 * Math.PI * pitches[Math.floor(t)]! * t)
    return Math.max(-32768, Math.min(32767, Math.round(value * 32768)))
  })
  const wav = wavFile([pcm], samplingRate)
  return {
    url: `data:audio/wav;base64,${wav.toString("base64")}`,
    samples: Float32Array.from(pcm, (sample) => sample / 32768),
    seconds: pcm.length / samplingRate
  }
}

const encodeRequest = Schema.encodeSync(TranscriptionsRequest)
const decodeResponse = Schema.decodeUnknownSync(TranscriptionsResponse)

/** Samples of one load: transcriptions per second and real-time factor, each side, and the ratio. */
const load = () => ({
  ref: [] as Array<number>,
  api: [] as Array<number>,
  refRtf: [] as Array<number>,
  apiRtf: [] as Array<number>,
  ratio: [] as Array<number>
})

export default async function asrBench(): Promise<void> {
  const built = performance.now()
  const fixture = randomWhisperFiles({ seed: 5, ...sizes[size], maxLength, vocabSize: 51865 })
  const root = await mkdtemp(join(tmpdir(), "cornserve-bench-asr-"))
  const model = join(root, `whisper-${size}-bench`)
  await writeModelFiles(model, fixture.files)
  console.error(
    `asr bench: ${model} (built in ${((performance.now() - built) / 1000).toFixed(1)} s), ${clipSeconds} s clips, max_length ${maxLength}, ${threads} threads, ${rounds} rounds`
  )

  const asr = (await pipeline("automatic-speech-recognition", offline(model), {
    dtype: "fp32",
    session_options: { intraOpNumThreads: threads, interOpNumThreads: 1 }
  })) as AutomaticSpeechRecognitionPipeline
  // transformers.js fails on decoding no ids (a transcript with no text, which a random model
  // writes); Python transformers, and the platform, read it as "".
  const decode = asr.tokenizer.decode.bind(asr.tokenizer)
  asr.tokenizer.decode = ((ids: Array<number>, args?: object) => (ids.length === 0 ? "" : decode(ids, args))) as never

  // The model is a directory of the bench's own: the executor is allowed its root.
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
      // As the control plane starts a speech recognizer: passes batch with whatever is queued, without waiting.
      "--max-batch-size",
      String(concurrency),
      "--max-batch-delay-ms",
      "0"
    ],
    { CORNSERVE_MODEL_ROOTS: root }
  )
  const stop = () => eric.process.kill("SIGTERM")
  process.once("SIGINT", stop)
  try {
    const reference = async (clip: Clip, chunked: boolean) => {
      const output = (await asr(clip.samples, {
        language,
        ...(chunked ? { chunk_length_s: chunkSeconds } : {})
      })) as { readonly text: string }
      return output.text
    }
    const api = async (clip: Clip, chunked: boolean) => {
      const response = await fetch(`${eric.url}/transcriptions`, {
        method: "POST",
        headers: executorHeaders({ "content-type": "application/json" }),
        body: JSON.stringify(
          encodeRequest({ url: clip.url, language, timestamps: false, ...(chunked ? { chunkSeconds } : {}) })
        )
      })
      if (response.status !== 200) throw new Error(`Eric answered ${response.status}: ${await response.text()}`)
      return decodeResponse(await response.json())
    }

    let compared = 0
    const mismatches: Array<{ readonly clip: string; readonly transformersJs: string; readonly api: string }> = []
    const compare = (name: string, expected: string, answered: string) => {
      compared++
      if (expected === answered) return
      mismatches.push({ clip: name, transformersJs: expected, api: answered })
      console.error(`  ${name} differs: transformers.js ${JSON.stringify(expected)}, API ${JSON.stringify(answered)}`)
    }
    const generatedTokens: Array<number> = []

    let serial = 0
    const fresh = (count: number, seconds = clipSeconds) =>
      Array.from({ length: count }, () => ({ name: `clip ${serial}`, clip: speechLike(seconds, 100 + serial++) }))

    /** Both sides on the same clips, `refFirst` choosing the order; `together` sends them all at once. */
    const measure = async (
      clips: ReadonlyArray<{ readonly name: string; readonly clip: Clip }>,
      options: { readonly together: boolean; readonly chunked: boolean; readonly refFirst: boolean }
    ) => {
      const side = async <A>(run: (clip: Clip) => Promise<A>) => {
        const start = performance.now()
        const answers: Array<A> = []
        if (options.together) answers.push(...(await Promise.all(clips.map(({ clip }) => run(clip)))))
        else for (const { clip } of clips) answers.push(await run(clip))
        return { seconds: (performance.now() - start) / 1000, answers }
      }
      const runRef = () => side((clip) => reference(clip, options.chunked))
      const runApi = () => side((clip) => api(clip, options.chunked))
      const [ref, ours] = options.refFirst
        ? [await runRef(), await runApi()]
        : await runApi().then(async (first) => [await runRef(), first] as const)
      clips.forEach(({ name }, index) => compare(name, ref.answers[index]!, ours.answers[index]!.text))
      if (!options.chunked) generatedTokens.push(...ours.answers.map((answer) => answer.tokens))
      return { refSeconds: ref.seconds, apiSeconds: ours.seconds }
    }
    const record = (
      samples: ReturnType<typeof load>,
      count: number,
      audioSeconds: number,
      run: { readonly refSeconds: number; readonly apiSeconds: number }
    ) => {
      samples.ref.push(count / run.refSeconds)
      samples.api.push(count / run.apiSeconds)
      samples.refRtf.push(run.refSeconds / audioSeconds)
      samples.apiRtf.push(run.apiSeconds / audioSeconds)
      samples.ratio.push(run.refSeconds / run.apiSeconds)
    }

    // Warm-up of both sides (a short clip, and the windows of a long one); their texts are checked too.
    await measure(fresh(2), { together: false, chunked: false, refFirst: true })
    await measure(fresh(1, longSeconds), { together: false, chunked: true, refFirst: true })
    compared = 0
    mismatches.length = 0
    generatedTokens.length = 0

    const single = load()
    const concurrent = load()
    const long = load()
    for (let r = 0; r < rounds; r++) {
      // 1 request: each clip alone, clips alternating which side goes first.
      for (let index = 0; index < singleClips; index++) {
        const clips = fresh(1)
        const run = await measure(clips, { together: false, chunked: false, refFirst: (r + index) % 2 === 0 })
        record(single, 1, clipSeconds, run)
      }
      // 8 at once.
      {
        const clips = fresh(concurrency)
        const run = await measure(clips, { together: true, chunked: false, refFirst: r % 2 === 0 })
        record(concurrent, concurrency, concurrency * clipSeconds, run)
      }
      // Long form: one clip in 30 s windows.
      {
        const clips = fresh(1, longSeconds)
        const run = await measure(clips, { together: false, chunked: true, refFirst: r % 2 === 1 })
        record(long, 1, longSeconds, run)
      }
      console.error(
        `  round ${r + 1}: 1 request ${round(median(single.ratio.slice(-singleClips)))}×, 8 concurrent ${round(concurrent.ratio.at(-1)!)}×, long form ${round(long.ratio.at(-1)!)}×`
      )
    }

    const figure = (values: ReadonlyArray<number>, digits = 2) => round(median(values), digits)
    const realtime = (rtf: ReadonlyArray<number>) => `${round(1 / median(rtf), 1)}×`
    const loadRows = (name: string, samples: ReturnType<typeof load>, rate: string, target: string) => [
      [name, rate, figure(samples.ref), figure(samples.api), figure(samples.ratio, 3), target],
      ["", "RTF (lower is better)", figure(samples.refRtf, 4), figure(samples.apiRtf, 4), "", ""],
      ["", "x realtime", realtime(samples.refRtf), realtime(samples.apiRtf), "", ""]
    ]
    const longRows = [
      [
        `long form ${longSeconds} s`,
        "s per clip",
        round(1 / median(long.ref), 2),
        round(1 / median(long.api), 2),
        figure(long.ratio, 3),
        ""
      ],
      ["", "RTF (lower is better)", figure(long.refRtf, 4), figure(long.apiRtf, 4), "", ""],
      ["", "x realtime", realtime(long.refRtf), realtime(long.apiRtf), "", ""]
    ]
    const table = [
      ["load", "measure", "baseline", "cornserve", "ratio", "target"],
      ...[
        ...loadRows("1 request", single, "transcriptions/s", `≥ ${targets.single}`),
        ...loadRows("8 concurrent", concurrent, "transcriptions/s", `≥ ${targets.concurrent}`),
        ...longRows
      ].map((row) => row.map(String))
    ]
    const widths = table[0]!.map((_, column) => Math.max(...table.map((row) => row[column]!.length)))
    console.log(
      `asr bench: random Whisper (whisper-${size} geometry: d_model ${sizes[size].dModel}, ${sizes[size].heads} heads, ${sizes[size].encoderLayers}+${sizes[size].decoderLayers} layers, 51865 tokens), ${clipSeconds} s clips (long form ${longSeconds} s in ${chunkSeconds} s windows), greedy up to max_length ${maxLength}, ${threads} ORT threads each side, medians over ${rounds} rounds`
    )
    console.log(
      `baseline: transformers.js automatic-speech-recognition pipeline; texts differing from it: ${mismatches.length} of ${compared}; tokens a short clip's transcript (median): ${figure(generatedTokens, 1)}`
    )
    for (const row of table) console.log(row.map((cell, column) => cell.padEnd(widths[column]!)).join("  "))
    const loadJson = (samples: ReturnType<typeof load>) => ({
      transformersJsPerSecond: figure(samples.ref),
      apiPerSecond: figure(samples.api),
      transformersJsRtf: figure(samples.refRtf, 4),
      apiRtf: figure(samples.apiRtf, 4)
    })
    console.log(
      JSON.stringify({
        bench: "asr",
        size,
        threads,
        rounds,
        clipSeconds,
        maxLength,
        longSeconds,
        chunkSeconds,
        textsCompared: compared,
        textsDifferingFromTransformersJs: mismatches.length,
        mismatches,
        medianGeneratedTokens: figure(generatedTokens, 1),
        single: loadJson(single),
        concurrent: loadJson(concurrent),
        long: {
          transformersJsSecondsPerClip: round(1 / median(long.ref), 3),
          apiSecondsPerClip: round(1 / median(long.api), 3),
          transformersJsRtf: figure(long.refRtf, 4),
          apiRtf: figure(long.apiRtf, 4)
        },
        ratios: {
          single: figure(single.ratio, 3),
          concurrent: figure(concurrent.ratio, 3),
          long: figure(long.ratio, 3)
        },
        targets
      })
    )
  } finally {
    process.off("SIGINT", stop)
    await eric.stop()
    await asr.dispose()
    await rm(root, { recursive: true, force: true })
  }
}
