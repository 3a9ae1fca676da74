/**
 * SpeechT5 text to speech: a random-weight SpeechT5 at microsoft/speecht5_tts's geometry (hidden
 * 768, 12 heads, 12 encoder and 6 decoder layers, ffn 3072, 512-wide speaker embeddings, prenet 256)
 * with a random HiFi-GAN at speecht5_hifigan's (512 initial channels, resblock kernels 3, 7, 11) in
 * the community's layout (Xenova/speecht5_tts with its vocoder in vocoder/), through Geri's
 * `POST /speech`, against transformers.js's `generate_speech` (SpeechT5ForTextToSpeech with
 * SpeechT5HifiGan) on the same files in this process, with the same ONNX Runtime thread count, in the
 * same run.
 *
 * - 1 request: one utterance at a time, streamed (NDJSON chunks of PCM16 as the decoder writes them)
 *   vs one generate_speech call at a time: the real-time factor (processing seconds ÷ audio
 *   seconds, lower is better) and the time to first audio (ours: from sending the request to its
 *   first chunk line; transformers.js: the whole call, as it hands the audio over only at the end).
 * - 4 concurrent: 4 utterances sent at once vs 4 generate_speech calls started together: audio
 *   seconds produced per wall second.
 * - Whole utterance: ours with `stream: false` and chunks larger than any utterance, so that the
 *   vocoder runs once over the whole spectrogram as transformers.js's does; against the 1-request
 *   reference runs. Its gap to the streamed figure is the cost of streaming's overlapping vocoder
 *   windows.
 *
 * The texts are English sentences of 40 to 160 characters (the random model speaks about 64 ms a
 * character), in the voice alloy (voices/alloy.bin). Every utterance of ours is checked against
 * transformers.js's waveform of the same text: its PCM16 equal to round(clamp(sample) × 32767) within
 * 1 at every sample. Runs alternate which side goes first in rounds; the ratios are medians. Prints a
 * table, then (as the last line) one JSON object.
 *
 * Env: BENCH_ROUNDS (default 3), BENCH_THREADS (ONNX Runtime threads, default 2), BENCH_SMALL=1 (a
 * smaller model for a quick try: hidden 256, 4+2 layers, a 128-channel vocoder).
 */
import { mkdtemp, readFile, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import {
  AutoTokenizer,
  type PreTrainedTokenizer,
  SpeechT5ForTextToSpeech,
  SpeechT5HifiGan,
  Tensor
} from "@huggingface/transformers"
import type { SynthesisRequest } from "../src/executors/geri/api.js"
import { type RandomSpeechT5Options, randomSpeechT5Files } from "../src/models/recipes/RandomSpeechT5.js"
import { writeModelFiles } from "../test/models/support/SmolVlmFixture.js"
import { offline } from "../test/models/support/TransformersJs.js"
import { executorHeaders, startExecutor } from "../test/support/executors.js"
import { readAudioLines } from "./support/audio-lines.js"
import { median, round } from "./support/chat-stream.js"

const rounds = Number(process.env.BENCH_ROUNDS ?? 3)
const threads = Number(process.env.BENCH_THREADS ?? 2)
const small = process.env.BENCH_SMALL === "1"
const concurrency = 4
const voice = "alloy"
const targets = { single: 1, concurrent: 1 }

/** SpeechT5's real geometry, or (BENCH_SMALL=1) one small enough to iterate on. */
const geometry: RandomSpeechT5Options = small
  ? {
      hidden: 256,
      heads: 4,
      encoderLayers: 4,
      decoderLayers: 2,
      ffn: 1024,
      speakerDim: 512,
      prenetUnits: 256,
      vocoder: {
        upsampleInitialChannel: 128,
        resblockKernelSizes: [3, 7, 11],
        resblockDilationSizes: [
          [1, 3, 5],
          [1, 3, 5],
          [1, 3, 5]
        ]
      }
    }
  : {
      hidden: 768,
      heads: 12,
      encoderLayers: 12,
      decoderLayers: 6,
      ffn: 3072,
      speakerDim: 512,
      prenetUnits: 256,
      vocoder: {
        upsampleInitialChannel: 512,
        resblockKernelSizes: [3, 7, 11],
        resblockDilationSizes: [
          [1, 3, 5],
          [1, 3, 5],
          [1, 3, 5]
        ]
      }
    }

const texts = [
  "The weather is lovely today, isn't it, Martha?",
  "Please remind me to call the dentist tomorrow morning before nine.",
  "Our train was delayed by forty minutes, so we missed the opening of the concert.",
  "She opened the old wooden box in the attic and found a bundle of letters, tied with a faded blue ribbon.",
  "When the storm finally passed, the villagers walked down to the harbour to count the boats, mend the nets, and thank the lighthouse keeper for his long night."
]

/**
 * Larger than any utterance's frames: the whole spectrogram is one chunk, vocoded once at the end
 * (firstChunkFrames' and maxChunkFrames' largest allowed values).
 */
const wholePlan = { firstChunkFrames: 4096, maxChunkFrames: 65536 }

/** One utterance spoken by one side: its PCM16, how long it took, and when its first audio came. */
interface Spoken {
  readonly pcm: Int16Array
  readonly seconds: number
  readonly ttfaSeconds: number
  readonly chunks: number
}

/** Float samples in [-1, 1] as PCM16, as Geri writes them. */
const pcm16 = (samples: Float32Array) =>
  Int16Array.from(samples, (sample) => Math.round(Math.max(-1, Math.min(1, sample)) * 32767))

const concat = (parts: ReadonlyArray<Int16Array>) => {
  const all = new Int16Array(parts.reduce((sum, part) => sum + part.length, 0))
  let at = 0
  for (const part of parts) {
    all.set(part, at)
    at += part.length
  }
  return all
}

export default async function ttsBench(): Promise<void> {
  const root = await mkdtemp(join(tmpdir(), "cornserve-bench-tts-"))
  const model = join(root, "speecht5-bench")
  const sampleRate = 16000
  {
    // In a block: the fixture's bytes (hundreds of MB at the real geometry) are garbage once written.
    const fixture = randomSpeechT5Files({ seed: 7, ...geometry })
    await writeModelFiles(model, fixture.files)
  }
  console.error(`tts bench: ${model}, ${small ? "small" : "SpeechT5"} geometry, ${threads} threads, ${rounds} rounds`)

  const sessionOptions = { session_options: { intraOpNumThreads: threads, interOpNumThreads: 1 } }
  // offline() points transformers.js at the parent of the folder it names: one load at a time.
  const tokenizer: PreTrainedTokenizer = await AutoTokenizer.from_pretrained(offline(model))
  const tts = (await SpeechT5ForTextToSpeech.from_pretrained(offline(model), {
    dtype: "fp32",
    ...sessionOptions
  })) as SpeechT5ForTextToSpeech
  const vocoder = (await SpeechT5HifiGan.from_pretrained(offline(join(model, "vocoder")), {
    dtype: "fp32",
    ...sessionOptions
  })) as SpeechT5HifiGan
  const voiceBytes = await readFile(join(model, "voices", `${voice}.bin`))
  const speaker = new Float32Array(
    voiceBytes.buffer.slice(voiceBytes.byteOffset, voiceBytes.byteOffset + voiceBytes.length)
  )
  const speakerTensor = new Tensor("float32", speaker, [1, speaker.length])

  // The model is a directory of the bench's own: the executor is allowed its root. A SpeechT5 model
  // needs no sidecar (its input is text, not another executor's embeddings).
  const geri = await startExecutor(
    ["--kind", "geri", "--model", model, "--devices", "cpu:0", "--threads-per-device", String(threads)],
    { CORNSERVE_MODEL_ROOTS: root }
  )
  const stop = () => geri.process.kill("SIGTERM")
  process.once("SIGINT", stop)
  try {
    const reference = async (text: string): Promise<Spoken> => {
      const start = performance.now()
      const { input_ids } = tokenizer(text)
      const out = (await tts.generate_speech(input_ids, speakerTensor, { vocoder })) as { waveform: Tensor }
      const seconds = (performance.now() - start) / 1000
      return { pcm: pcm16(out.waveform.data as Float32Array), seconds, ttfaSeconds: seconds, chunks: 1 }
    }

    const post = (body: SynthesisRequest) =>
      fetch(`${geri.url}/speech`, {
        method: "POST",
        headers: executorHeaders({ "content-type": "application/json" }),
        body: JSON.stringify(body)
      })

    /** Ours, streamed: NDJSON lines read as they come, the first chunk line's arrival timed. */
    const streamed = async (text: string): Promise<Spoken> => {
      const start = performance.now()
      const { parts, ttfaSeconds: ttfa } = await readAudioLines(
        await post({ text, voice, stream: true }),
        start,
        sampleRate
      )
      return {
        pcm: concat(parts),
        seconds: (performance.now() - start) / 1000,
        ttfaSeconds: ttfa,
        chunks: parts.length
      }
    }

    /** Ours, whole: one WAV file (a 44-byte header, then PCM16), the vocoder run once. */
    const whole = async (text: string): Promise<Spoken> => {
      const start = performance.now()
      const response = await post({ text, voice, stream: false, ...wholePlan })
      if (response.status !== 200) throw new Error(`Geri answered ${response.status}: ${await response.text()}`)
      const wav = new Uint8Array(await response.arrayBuffer())
      const seconds = (performance.now() - start) / 1000
      const pcm = new Int16Array(wav.buffer.slice(wav.byteOffset + 44, wav.byteOffset + wav.byteLength))
      return { pcm, seconds, ttfaSeconds: seconds, chunks: 1 }
    }

    let compared = 0
    let maxDifference = 0
    const mismatches: Array<{ readonly text: string; readonly mode: string; readonly detail: string }> = []
    /** Ours against transformers.js's waveform of the same text: the same length, within 1 at every sample. */
    const compare = (text: string, mode: string, expected: Int16Array, got: Int16Array) => {
      compared++
      let differing = 0
      let most = 0
      for (let i = 0; i < Math.min(expected.length, got.length); i++) {
        const difference = Math.abs(expected[i]! - got[i]!)
        most = Math.max(most, difference)
        if (difference > 1) differing++
      }
      maxDifference = Math.max(maxDifference, most)
      if (expected.length === got.length && differing === 0) return
      const detail = `${got.length} samples (transformers.js ${expected.length}), ${differing} differing by more than 1 (at most ${most})`
      mismatches.push({ text, mode, detail })
      console.error(`  ${mode} ${JSON.stringify(text.slice(0, 30))}… differs: ${detail}`)
    }

    const audioSeconds = (spoken: Spoken) => spoken.pcm.length / sampleRate
    const single = {
      refRtf: [] as Array<number>,
      apiRtf: [] as Array<number>,
      refTtfa: [] as Array<number>,
      apiTtfa: [] as Array<number>,
      ratio: [] as Array<number>,
      ttfaRatio: [] as Array<number>,
      wholeRtf: [] as Array<number>,
      wholeRatio: [] as Array<number>,
      chunks: [] as Array<number>,
      audio: [] as Array<number>
    }
    const concurrent = {
      ref: [] as Array<number>,
      api: [] as Array<number>,
      ratio: [] as Array<number>
    }

    /**
     * One text on each side, one at a time: the reference, ours streamed, ours whole, in an order
     * rotated by `turn` (each goes first, second and third as often).
     */
    const measureSingle = async (text: string, turn: number, record: boolean) => {
      const runs: Array<() => Promise<Spoken>> = [() => reference(text), () => streamed(text), () => whole(text)]
      const results: Array<Spoken | undefined> = [undefined, undefined, undefined]
      for (let k = 0; k < runs.length; k++) {
        const index = (turn + k) % runs.length
        results[index] = await runs[index]!()
      }
      const [ref, api, once] = results as [Spoken, Spoken, Spoken]
      compare(text, "streamed", ref.pcm, api.pcm)
      compare(text, "whole", ref.pcm, once.pcm)
      if (!record) return
      const audio = audioSeconds(ref)
      single.audio.push(audio)
      single.refRtf.push(ref.seconds / audio)
      single.apiRtf.push(api.seconds / audio)
      single.ratio.push(ref.seconds / api.seconds)
      single.refTtfa.push(ref.ttfaSeconds * 1000)
      single.apiTtfa.push(api.ttfaSeconds * 1000)
      single.ttfaRatio.push(ref.ttfaSeconds / api.ttfaSeconds)
      single.wholeRtf.push(once.seconds / audio)
      single.wholeRatio.push(ref.seconds / once.seconds)
      single.chunks.push(api.chunks)
    }

    /** `concurrency` texts at once on each side (ours all sent together; theirs generate_speech calls together). */
    const measureConcurrent = async (batch: ReadonlyArray<string>, refFirst: boolean) => {
      const side = async (run: (text: string) => Promise<Spoken>) => {
        const start = performance.now()
        const spoken = await Promise.all(batch.map(run))
        return { seconds: (performance.now() - start) / 1000, spoken }
      }
      const runRef = () => side(reference)
      const runApi = () => side(streamed)
      const [ref, api] = refFirst
        ? [await runRef(), await runApi()]
        : await runApi().then(async (first) => [await runRef(), first] as const)
      batch.forEach((text, index) => compare(text, "concurrent", ref.spoken[index]!.pcm, api.spoken[index]!.pcm))
      const audio = ref.spoken.reduce((sum, spoken) => sum + audioSeconds(spoken), 0)
      concurrent.ref.push(audio / ref.seconds)
      concurrent.api.push(audio / api.seconds)
      concurrent.ratio.push(ref.seconds / api.seconds)
    }

    // Warm-up of both sides on the shortest text (each mode); its audio is checked too.
    await measureSingle(texts[0]!, 0, false)
    await measureConcurrent(texts.slice(0, concurrency), true)

    for (let r = 0; r < rounds; r++) {
      for (let index = 0; index < texts.length; index++) await measureSingle(texts[index]!, r + index, true)
      // A different set of texts each round.
      const batch = Array.from({ length: concurrency }, (_, k) => texts[(r + k) % texts.length]!)
      await measureConcurrent(batch, r % 2 === 1)
      console.error(
        `  round ${r + 1}: 1 request ${round(median(single.ratio.slice(-texts.length)), 3)}×, TTFA ${round(median(single.ttfaRatio.slice(-texts.length)), 2)}×, ${concurrency} concurrent ${round(concurrent.ratio.at(-1)!, 3)}×, whole ${round(median(single.wholeRatio.slice(-texts.length)), 3)}×`
      )
    }

    const figure = (values: ReadonlyArray<number>, digits = 2) => round(median(values), digits)
    const realtime = (rtf: ReadonlyArray<number>) => `${round(1 / median(rtf), 1)}×`
    const table = [
      ["load", "measure", "baseline", "cornserve", "ratio", "target"],
      ...[
        [
          "1 request",
          "RTF (lower is better)",
          figure(single.refRtf, 4),
          figure(single.apiRtf, 4),
          figure(single.ratio, 3),
          `≥ ${targets.single}`
        ],
        ["", "x realtime", realtime(single.refRtf), realtime(single.apiRtf), "", ""],
        ["", "TTFA ms", figure(single.refTtfa, 1), figure(single.apiTtfa, 1), figure(single.ttfaRatio, 2), "reported"],
        [
          `${concurrency} concurrent`,
          "audio s per s",
          figure(concurrent.ref, 2),
          figure(concurrent.api, 2),
          figure(concurrent.ratio, 3),
          `≥ ${targets.concurrent}`
        ],
        [
          "whole utterance",
          "RTF (lower is better)",
          figure(single.refRtf, 4),
          figure(single.wholeRtf, 4),
          figure(single.wholeRatio, 3),
          ""
        ],
        ["", "x realtime", realtime(single.refRtf), realtime(single.wholeRtf), "", ""]
      ].map((row) => row.map(String))
    ]
    const widths = table[0]!.map((_, column) => Math.max(...table.map((row) => row[column]!.length)))
    const size = small
      ? "small geometry: hidden 256, 4 heads, 4+2 layers, 128-channel HiFi-GAN"
      : "speecht5_tts geometry: hidden 768, 12 heads, 12+6 layers, ffn 3072; speecht5_hifigan's vocoder"
    console.log(
      `tts bench: random SpeechT5 (${size}), ${texts.length} texts of ${Math.min(...texts.map((t) => t.length))}–${Math.max(...texts.map((t) => t.length))} characters (${figure(single.audio, 2)} s of audio each, median), voice ${voice}, ${threads} ORT threads each side, medians over ${rounds} rounds`
    )
    console.log(
      `baseline: transformers.js generate_speech (the audio at the end of the call); utterances differing from it: ${mismatches.length} of ${compared} (largest sample difference ${maxDifference}); streamed chunks an utterance (median): ${figure(single.chunks, 1)}`
    )
    for (const row of table) console.log(row.map((cell, column) => cell.padEnd(widths[column]!)).join("  "))
    console.log(
      JSON.stringify({
        bench: "tts",
        threads,
        rounds,
        small,
        geometry,
        texts: texts.length,
        voice,
        concurrency,
        medianAudioSeconds: figure(single.audio, 3),
        medianStreamedChunks: figure(single.chunks, 1),
        utterancesCompared: compared,
        utterancesDifferingFromTransformersJs: mismatches.length,
        maxSampleDifference: maxDifference,
        mismatches,
        single: {
          transformersJsRtf: figure(single.refRtf, 4),
          apiRtf: figure(single.apiRtf, 4),
          transformersJsTtfaMs: figure(single.refTtfa, 1),
          apiTtfaMs: figure(single.apiTtfa, 1)
        },
        concurrent: {
          transformersJsAudioSecondsPerSecond: figure(concurrent.ref, 3),
          apiAudioSecondsPerSecond: figure(concurrent.api, 3)
        },
        whole: { transformersJsRtf: figure(single.refRtf, 4), apiRtf: figure(single.wholeRtf, 4) },
        ratios: {
          single: figure(single.ratio, 3),
          ttfa: figure(single.ttfaRatio, 3),
          concurrent: figure(concurrent.ratio, 3),
          whole: figure(single.wholeRatio, 3)
        },
        targets
      })
    )
  } finally {
    process.off("SIGINT", stop)
    await geri.stop()
    await tts.dispose()
    await vocoder.dispose()
    await rm(root, { recursive: true, force: true })
  }
}
