/**
 * SpeechT5 text-to-speech on ONNX Runtime, as transformers.js's `generate_speech` runs the
 * community's exports (Xenova/speecht5_tts with the HiFi-GAN of Xenova/speecht5_hifigan), streamed:
 * the encoder reads the tokens once, the merged decoder writes `reduction_factor` spectrogram frames
 * a step until a stop probability reaches the threshold (or the length reaches 20 frames per two
 * tokens, `maxlenratio`), and the vocoder turns the frames into samples in windows while the
 * decoder goes on. HiFi-GAN is not causal: a window holds the frames of its span and, on each side,
 * the frames its convolutions reach (hifiGanContextFrames), so its samples equal those of one run
 * over the whole spectrogram, up to float rounding.
 *
 * After the first step only the outputs the next step needs are fetched: the cross-attention keys
 * and values repeat the ones given, and fetching them copied them out at every step (transformers.js
 * does).
 */
import { readdir, readFile, stat } from "node:fs/promises"
import { basename, join } from "node:path"
import * as ort from "onnxruntime-node"
import { rewriteConvTransposes } from "../../models/onnx/ConvTransposeRewrite.js"
import { type HifiGanSize, hifiGanContextFrames, hifiGanHop } from "../../models/architectures/SpeechT5.js"
import { type ModelDirectory, loadModelDirectory, onnxPath } from "../../models/ModelDirectory.js"
import { createSession } from "../common/Sessions.js"
import type { WorkerContext, WorkerModel } from "../common/WorkerModel.js"

export interface SpeechT5Spec {
  readonly melBins: number
  readonly reductionFactor: number
  readonly speakerDim: number
  readonly decoderLayers: number
  readonly heads: number
  readonly headDim: number
  readonly maxTextPositions: number
}

const positiveInt = (value: unknown, name: string, model: string): number => {
  if (typeof value !== "number" || !Number.isInteger(value) || value <= 0)
    throw new Error(`${model}'s config.json: ${name} must be a positive integer`)
  return value
}

/** What the decoder's inputs and the stop rule need, from SpeechT5's config.json. */
export const speechT5Spec = (model: ModelDirectory): SpeechT5Spec => {
  const config = model.rawConfig
  const hidden = positiveInt(config.hidden_size, "hidden_size", model.path)
  const heads = positiveInt(config.decoder_attention_heads, "decoder_attention_heads", model.path)
  return {
    melBins: positiveInt(config.num_mel_bins ?? 80, "num_mel_bins", model.path),
    reductionFactor: positiveInt(config.reduction_factor ?? 2, "reduction_factor", model.path),
    speakerDim: positiveInt(config.speaker_embedding_dim ?? 512, "speaker_embedding_dim", model.path),
    decoderLayers: positiveInt(config.decoder_layers, "decoder_layers", model.path),
    heads,
    headDim: hidden / heads,
    maxTextPositions: positiveInt(config.max_text_positions ?? 600, "max_text_positions", model.path)
  }
}

/** A SpeechT5 model directory: config.json's model_type says so. */
export const isSpeechT5 = (model: ModelDirectory): boolean => model.rawConfig.model_type === "speecht5"

/** HiFi-GAN's sizes from its config.json (SpeechT5HifiGanConfig's names and defaults). */
export const hifiGanSpec = (vocoder: ModelDirectory): HifiGanSize & { readonly sampleRate: number } => {
  const config = vocoder.rawConfig as Record<string, unknown>
  const numbers = (name: string, fallback: ReadonlyArray<number>) => {
    const value = config[name] ?? fallback
    if (!Array.isArray(value) || !value.every((n) => typeof n === "number" && n > 0))
      throw new Error(`${vocoder.path}'s config.json: ${name} must be a list of positive numbers`)
    return value as ReadonlyArray<number>
  }
  return {
    melBins: positiveInt(config.model_in_dim ?? 80, "model_in_dim", vocoder.path),
    sampleRate: positiveInt(config.sampling_rate ?? 16000, "sampling_rate", vocoder.path),
    upsampleInitialChannel: positiveInt(
      config.upsample_initial_channel ?? 512,
      "upsample_initial_channel",
      vocoder.path
    ),
    upsampleRates: numbers("upsample_rates", [4, 4, 4, 4]),
    upsampleKernelSizes: numbers("upsample_kernel_sizes", [8, 8, 8, 8]),
    resblockKernelSizes: numbers("resblock_kernel_sizes", [3, 7, 11]),
    resblockDilationSizes: ((config.resblock_dilation_sizes as ReadonlyArray<ReadonlyArray<number>> | undefined) ?? [
      [1, 3, 5],
      [1, 3, 5],
      [1, 3, 5]
    ]) as ReadonlyArray<ReadonlyArray<number>>,
    leakyReluSlope: typeof config.leaky_relu_slope === "number" ? config.leaky_relu_slope : 0.1
  }
}

/**
 * The voices a model ships: voices/NAME.bin, each a speaker embedding of `dim` little-endian
 * float32 values, by name (sorted, so that the first is the default the same everywhere).
 */
export const readVoices = async (modelDir: string, dim: number): Promise<ReadonlyMap<string, Float32Array>> => {
  const folder = join(modelDir, "voices")
  const files = await readdir(folder).catch(() => [] as Array<string>)
  const voices = new Map<string, Float32Array>()
  for (const file of files.filter((name) => name.endsWith(".bin")).sort()) {
    const bytes = await readFile(join(folder, file))
    if (bytes.length !== dim * 4)
      throw new Error(`voices/${file} holds ${bytes.length} bytes; a speaker embedding of this model is ${dim * 4}`)
    voices.set(
      basename(file, ".bin"),
      new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length))
    )
  }
  return voices
}

/** The vocoder transformers.js's text-to-speech pipeline uses when none is given. */
export const defaultVocoder = "Xenova/speecht5_hifigan"

/** The vocoder of a SpeechT5 model: its vocoder/ folder, or else the default one (fetched like a model). */
export const vocoderDirectory = async (modelDir: string, resolve: (id: string) => Promise<string>): Promise<string> => {
  const folder = join(modelDir, "vocoder")
  const info = await stat(folder).catch(() => undefined)
  return info?.isDirectory() === true ? folder : resolve(defaultVocoder)
}

/** One stretch of frames to vocode: `from` … `to` with its context, keeping the samples of `keepFrom` … `keepTo`. */
export interface VocoderWindow {
  readonly from: number
  readonly to: number
  readonly keepFrom: number
  readonly keepTo: number
}

export interface ChunkPlan {
  /** Frames in the first chunk: the time to the first audio follows it. */
  readonly firstChunkFrames: number
  /** Frames in the second chunk; each next one doubles, up to maxChunkFrames. */
  readonly chunkFrames: number
  readonly maxChunkFrames: number
}

/**
 * The frames of chunk `chunk`. Every window but the last vocodes its context again (the frames on
 * each side its convolutions reach), so a few large chunks after a small first one cost less than
 * many small ones: the first makes the audio start early, the later ones keep the vocoder's work
 * close to one run over the whole.
 */
export const nextChunkFrames = (plan: ChunkPlan, chunk: number): number =>
  chunk === 0 ? plan.firstChunkFrames : Math.min(plan.maxChunkFrames, plan.chunkFrames * 2 ** (chunk - 1))

/**
 * The window that vocodes frames `keepFrom` … `keepTo` of `available` frames: `context` frames on
 * each side where there are some. With `final`, the spectrogram ends at `available`.
 */
export const vocoderWindow = (keepFrom: number, keepTo: number, available: number, context: number): VocoderWindow => ({
  from: Math.max(0, keepFrom - context),
  to: Math.min(available, keepTo + context),
  keepFrom,
  keepTo
})

export interface SynthesisOptions {
  /** Stop when a stop probability reaches it (transformers.js's default 0.5). */
  readonly threshold?: number
  /** At most this many frames per two tokens… as transformers.js's maxlenratio (20). */
  readonly maxLengthRatio?: number
  readonly minLengthRatio?: number
  readonly plan: ChunkPlan
  /** Whether to stop early (the request was cancelled). */
  readonly cancelled?: () => boolean
}

export interface SynthesisResult {
  /** [frames, mel bins], as transformers.js's `spectrogram`. */
  readonly spectrogram: Float32Array
  readonly frames: number
  readonly samples: number
}

export class SpeechSynthesizer {
  private constructor(
    readonly spec: SpeechT5Spec,
    readonly vocoderSpec: HifiGanSize & { readonly sampleRate: number },
    private readonly encoder: ort.InferenceSession,
    private readonly decoder: ort.InferenceSession,
    private readonly vocoder: ort.InferenceSession,
    /** Frames of context on each side of a vocoded span. */
    readonly contextFrames: number
  ) {}

  static async load(modelDir: string, vocoderDir: string, device: string, threads: number): Promise<SpeechSynthesizer> {
    const model = await loadModelDirectory(modelDir)
    const vocoderModel = await loadModelDirectory(vocoderDir)
    const spec = speechT5Spec(model)
    const vocoderSpec = hifiGanSpec(vocoderModel)
    if (vocoderSpec.melBins !== spec.melBins)
      throw new Error(`the vocoder takes ${vocoderSpec.melBins} mel bins; the model writes ${spec.melBins}`)
    const [encoder, decoder, vocoder] = await Promise.all([
      createSession(onnxPath(model, "encoder_model"), device, threads),
      createSession(onnxPath(model, "decoder_model_merged"), device, threads),
      // HiFi-GAN's upsamplers as polyphase Convs: ONNX Runtime's ConvTranspose is its slowest part.
      readFile(onnxPath(vocoderModel, "model")).then((bytes) =>
        createSession(rewriteConvTransposes(bytes).bytes, device, threads)
      )
    ])
    return new SpeechSynthesizer(spec, vocoderSpec, encoder, decoder, vocoder, hifiGanContextFrames(vocoderSpec))
  }

  get hop(): number {
    return hifiGanHop(this.vocoderSpec)
  }

  /** The samples of `frames` [n, mel bins] from the vocoder. */
  async vocode(frames: Float32Array, count: number): Promise<Float32Array> {
    const output = await this.vocoder.run({
      spectrogram: new ort.Tensor("float32", frames, [count, this.spec.melBins])
    })
    return output.waveform!.data as Float32Array
  }

  /**
   * Speaks `tokens` (the tokenizer's ids, </s> included) in the voice `speaker` ([speaker dim]),
   * handing each chunk's samples to `onChunk` as soon as the frames it needs are written.
   */
  async synthesize(
    tokens: ReadonlyArray<number>,
    speaker: Float32Array,
    options: SynthesisOptions,
    onChunk: (samples: Float32Array, chunk: number) => void
  ): Promise<SynthesisResult> {
    const { melBins, reductionFactor, heads, headDim } = this.spec
    const inputIds = new ort.Tensor("int64", BigInt64Array.from(tokens, BigInt), [1, tokens.length])
    const encoded = await this.encoder.run({ input_ids: inputIds })
    const encoderStates = encoded.encoder_outputs!
    const encoderMask = encoded.encoder_attention_mask!
    const steps = encoderStates.dims[1]! / reductionFactor
    const maxSteps = Math.floor(steps * (options.maxLengthRatio ?? 20))
    const minSteps = Math.floor(steps * (options.minLengthRatio ?? 0))
    const threshold = options.threshold ?? 0.5
    const speakerTensor = new ort.Tensor("float32", speaker, [1, speaker.length])

    const empty = new ort.Tensor("float32", new Float32Array(0), [1, heads, 0, headDim])
    const past: Record<string, ort.Tensor> = {}
    for (let layer = 0; layer < this.spec.decoderLayers; layer++) {
      for (const kind of ["decoder", "encoder"])
        for (const part of ["key", "value"]) past[`past_key_values.${layer}.${kind}.${part}`] = empty
    }
    const selfCacheOutputs = Object.keys(past)
      .filter((name) => name.includes(".decoder."))
      .map((name) => name.replace("past_key_values", "present"))
    const laterFetches = ["output_sequence_out", "spectrum", "prob", ...selfCacheOutputs]

    // The spectrogram grows as the decoder writes; windows of it go to the vocoder.
    let spectrogram = new Float32Array(64 * melBins)
    let frames = 0
    let chunk = 0
    let vocodedTo = 0
    let samples = 0
    let outputSequence: ort.Tensor = new ort.Tensor("float32", new Float32Array(melBins), [1, 1, melBins])
    const emitThrough = async (available: number, final: boolean) => {
      for (;;) {
        const keepTo = final ? available : vocodedTo + nextChunkFrames(options.plan, chunk)
        if (keepTo <= vocodedTo) return
        if (!final && keepTo + this.contextFrames > available) return
        const window = vocoderWindow(vocodedTo, Math.min(keepTo, available), available, this.contextFrames)
        const waveform = await this.vocode(
          spectrogram.subarray(window.from * melBins, window.to * melBins),
          window.to - window.from
        )
        const hop = this.hop
        const part = waveform.subarray((window.keepFrom - window.from) * hop, (window.keepTo - window.from) * hop)
        onChunk(part, chunk++)
        samples += part.length
        vocodedTo = window.keepTo
        if (final) return
      }
    }

    let stopped = false
    for (let step = 1; ; step++) {
      if (options.cancelled?.() === true) {
        stopped = true
        break
      }
      const feeds: Record<string, ort.Tensor> = {
        use_cache_branch: new ort.Tensor("bool", [step > 1], [1]),
        output_sequence: outputSequence,
        encoder_attention_mask: encoderMask,
        speaker_embeddings: speakerTensor,
        encoder_hidden_states: encoderStates,
        ...past
      }
      const out = step === 1 ? await this.decoder.run(feeds) : await this.decoder.run(feeds, laterFetches)
      for (const name of step === 1
        ? Object.keys(past)
        : selfCacheOutputs.map((n) => n.replace("present", "past_key_values")))
        past[name] = out[name.replace("past_key_values", "present")]!
      outputSequence = out.output_sequence_out!
      const spectrum = out.spectrum!.data as Float32Array
      if ((frames + reductionFactor) * melBins > spectrogram.length) {
        const grown = new Float32Array(spectrogram.length * 2)
        grown.set(spectrogram)
        spectrogram = grown
      }
      spectrogram.set(spectrum, frames * melBins)
      frames += reductionFactor
      const prob = out.prob!.data as Float32Array
      if (step >= minSteps && (prob.some((p) => p >= threshold) || step >= maxSteps)) break
      await emitThrough(frames, false)
    }
    if (!stopped && frames > vocodedTo) await emitThrough(frames, true)
    return { spectrogram: spectrogram.slice(0, frames * melBins), frames, samples }
  }

  async release(): Promise<void> {
    await Promise.all([this.encoder.release(), this.decoder.release(), this.vocoder.release()])
  }
}

/** What the router attaches to a synthesis work item; its speaker embedding is the item's input row. */
export interface SynthesisItemMeta {
  readonly modality: "speech"
  readonly tokens: ReadonlyArray<number>
  readonly plan: ChunkPlan
}

/** Float samples in [-1, 1] as PCM16. */
export const pcm16 = (samples: Float32Array): Int16Array =>
  Int16Array.from(samples, (sample) => Math.round(Math.max(-1, Math.min(1, sample)) * 32767))

/**
 * Geri's worker on a SpeechT5 model: each item of a batch is one utterance; their decoding steps
 * interleave, and each streams its chunks (GeriAudioPiece) as they are vocoded.
 */
export const speechWorkerModel = async ({ config, device }: WorkerContext): Promise<WorkerModel<SynthesisItemMeta>> => {
  const { resolveModel } = await import("../../models/ModelStore.js")
  const vocoderDir = await vocoderDirectory(config.modelDir, (id) => resolveModel(id))
  const synthesizer = await SpeechSynthesizer.load(config.modelDir, vocoderDir, device, config.threadsPerDevice)
  return {
    async run({ inputs, items, emit, cancelled }) {
      const speakers = inputs.speaker_embeddings!
      const dim = speakers.shape[1]!
      return Promise.all(
        items.map(async (item, index) => {
          const meta = item.meta
          const speaker = (speakers.data as Float32Array).slice(item.rows[0] * dim, item.rows[1] * dim)
          // A request cancelled (its client gone) stops at its next step.
          const result = await synthesizer.synthesize(
            meta.tokens,
            speaker,
            { plan: meta.plan, cancelled: () => cancelled(index) },
            (samples, chunk) => emit(index, { chunk, pcm: pcm16(samples) })
          )
          return { frames: result.frames, samples: result.samples }
        })
      )
    },
    close: () => synthesizer.release(),
    // An utterance's batch lasts as long as it is spoken: a request arriving meanwhile starts at once.
    concurrentBatches: true
  }
}
