/**
 * A neural audio codec's decoder on Geri: Mimi (transformers.js's MimiDecoderModel, the
 * community's onnx-community/kyutai-mimi-ONNX), codes in, audio out, streamed in chunks as it
 * decodes. The export is one stateless graph over a whole sequence; a chunk is decoded from a
 * window of codes that starts `contextFrames` before it, and only the chunk's samples are kept.
 * Mimi is causal (a sample depends on the codes before it alone), so the window needs context on
 * the left only, and with the decoder's whole reach (mimiExactContextFrames) a chunk's samples are
 * those of one run over the whole sequence, up to float rounding. The reach of kyutai/mimi is
 * about 1,000 frames (its transformer's 8 layers each see 10 s back), so by default the context is
 * the smaller of that reach and 25 frames (2 s), as Qwen3-Omni's code2wav streams its codes: a
 * chunk then differs from whole decoding where the transformer would have looked further back.
 */
import { readFile } from "node:fs/promises"
import * as ort from "onnxruntime-node"
import { rewriteConvTransposes } from "../../models/onnx/ConvTransposeRewrite.js"
import { type MimiSize, mimiExactContextFrames, mimiHop } from "../../models/architectures/Mimi.js"
import { type ModelDirectory, loadModelDirectory, onnxPath } from "../../models/ModelDirectory.js"
import { createSession } from "../common/Sessions.js"
import type { WorkerContext, WorkerModel } from "../common/WorkerModel.js"
import { type ChunkPlan, nextChunkFrames, pcm16 } from "./SpeechSynthesizer.js"

/** A Mimi model directory: config.json's model_type says so. */
export const isMimi = (model: ModelDirectory): boolean => model.rawConfig.model_type === "mimi"

export interface CodecSpec {
  /** Codebooks a frame has at most, and at least (the semantic ones). */
  readonly maxQuantizers: number
  readonly minQuantizers: number
  readonly codebookSize: number
  readonly sampleRate: number
  readonly frameRate: number
  /** Samples per code frame. */
  readonly hop: number
  /** The code frames before a frame that can change its samples. */
  readonly exactContextFrames: number
  /** The longest window the decoder's positions allow, in code frames. */
  readonly maxWindowFrames: number
}

const positive = (value: unknown, name: string, model: string, fallback?: number): number => {
  const chosen = value ?? fallback
  if (typeof chosen !== "number" || !Number.isFinite(chosen) || chosen <= 0)
    throw new Error(`${model}'s config.json: ${name} must be a positive number`)
  return chosen
}

/** Mimi's sizes from its config.json (MimiConfig's names and defaults). */
export const mimiSize = (model: ModelDirectory): MimiSize => {
  const c = model.rawConfig as Record<string, unknown>
  const at = (name: string, fallback?: number) => positive(c[name], name, model.path, fallback)
  const ratios = c.upsampling_ratios ?? [8, 6, 5, 4]
  if (!Array.isArray(ratios) || !ratios.every((r) => Number.isInteger(r) && r > 0))
    throw new Error(`${model.path}'s config.json: upsampling_ratios must be a list of positive integers`)
  const hidden = at("hidden_size", 512)
  const heads = at("num_attention_heads", 8)
  return {
    hidden,
    numFilters: at("num_filters", 64),
    upsamplingRatios: ratios as ReadonlyArray<number>,
    kernelSize: at("kernel_size", 7),
    lastKernelSize: at("last_kernel_size", 3),
    residualKernelSize: at("residual_kernel_size", 3),
    dilationGrowthRate: at("dilation_growth_rate", 2),
    numResidualLayers: at("num_residual_layers", 1),
    compress: at("compress", 2),
    codebookSize: at("codebook_size", 2048),
    codebookDim: at("vector_quantization_hidden_dimension", 256),
    numQuantizers: at("num_quantizers", 32),
    numSemanticQuantizers: at("num_semantic_quantizers", 1),
    layers: at("num_hidden_layers", 8),
    heads,
    headDim: at("head_dim", hidden / heads),
    intermediate: at("intermediate_size", 2048),
    slidingWindow: at("sliding_window", 250),
    ropeTheta: at("rope_theta", 10000),
    normEps: at("norm_eps", 1e-5),
    maxPositions: at("max_position_embeddings", 8000),
    samplingRate: at("sampling_rate", 24000),
    frameRate: at("frame_rate", 12.5)
  }
}

export const mimiSpec = (model: ModelDirectory): CodecSpec => {
  const size = mimiSize(model)
  return {
    maxQuantizers: size.numQuantizers,
    minQuantizers: size.numSemanticQuantizers,
    codebookSize: size.codebookSize,
    sampleRate: size.samplingRate,
    frameRate: size.frameRate,
    hop: mimiHop(size),
    exactContextFrames: mimiExactContextFrames(size),
    maxWindowFrames: Math.floor(size.maxPositions / 2)
  }
}

/** How a sequence of codes is cut into chunks: the chunk sizes, and the left context of each window. */
export interface CodecPlan extends ChunkPlan {
  readonly contextFrames: number
  /** Frames before this one are context only: no audio of theirs is answered (0 when left out). */
  readonly startFrame?: number
}

/** The context a window gets by default: the decoder's whole reach, at most 25 frames. */
export const defaultContextFrames = (spec: CodecSpec): number => Math.min(spec.exactContextFrames, 25)

/** One window: decode frames `from` … `keepTo`, keep the samples of `keepFrom` … `keepTo`. */
export interface CodecWindow {
  readonly from: number
  readonly keepFrom: number
  readonly keepTo: number
}

/**
 * The windows that decode `frames` code frames in the plan's chunks, in order. A chunk that would
 * leave fewer frames than its context after it takes them too: a last window of a few frames
 * would decode its whole context again for them.
 */
export const codecWindows = (frames: number, plan: CodecPlan): ReadonlyArray<CodecWindow> => {
  const windows: Array<CodecWindow> = []
  for (let keepFrom = plan.startFrame ?? 0, chunk = 0; keepFrom < frames; chunk++) {
    let keepTo = Math.min(frames, keepFrom + nextChunkFrames(plan, chunk))
    if (frames - keepTo < plan.contextFrames) keepTo = frames
    windows.push({ from: Math.max(0, keepFrom - plan.contextFrames), keepFrom, keepTo })
    keepFrom = keepTo
  }
  return windows
}

export interface CodecDecodeOptions {
  readonly plan: CodecPlan
  readonly cancelled?: () => boolean
}

export class CodecDecoder {
  private constructor(
    readonly spec: CodecSpec,
    private readonly session: ort.InferenceSession,
    /** The codebooks the graph takes, when its input fixes them. */
    readonly fixedQuantizers: number | undefined
  ) {}

  static async load(modelDir: string, device: string, threads: number): Promise<CodecDecoder> {
    const model = await loadModelDirectory(modelDir)
    const spec = mimiSpec(model)
    // The SEANet's upsamplers as polyphase Convs: ONNX Runtime's ConvTranspose is its slowest part.
    const { bytes } = rewriteConvTransposes(await readFile(onnxPath(model, "decoder_model")))
    const session = await createSession(bytes, device, threads)
    const input = session.inputMetadata.find((metadata) => metadata.name === "audio_codes")
    if (input === undefined || !input.isTensor || !session.outputNames.includes("audio_values"))
      throw new Error(`${modelDir}'s decoder_model takes no audio_codes or answers no audio_values`)
    const quantizers = input.shape[1]
    return new CodecDecoder(spec, session, typeof quantizers === "number" ? quantizers : undefined)
  }

  /** The samples of frames `from` … `to` of `codes` ([quantizers, frames], row after row). */
  async decodeWindow(codes: BigInt64Array, quantizers: number, frames: number, from: number, to: number) {
    const width = to - from
    const window = new BigInt64Array(quantizers * width)
    for (let q = 0; q < quantizers; q++) window.set(codes.subarray(q * frames + from, q * frames + to), q * width)
    const output = await this.session.run({ audio_codes: new ort.Tensor("int64", window, [1, quantizers, width]) })
    return output.audio_values!.data as Float32Array
  }

  /**
   * Decodes `codes` ([quantizers, frames], row after row) window after window, handing each
   * chunk's samples to `onChunk` as soon as they are decoded. Answers the samples sent.
   */
  async decode(
    codes: BigInt64Array,
    quantizers: number,
    options: CodecDecodeOptions,
    onChunk: (samples: Float32Array, chunk: number) => void
  ): Promise<number> {
    const frames = codes.length / quantizers
    const hop = this.spec.hop
    let samples = 0
    let chunk = 0
    for (const window of codecWindows(frames, options.plan)) {
      if (options.cancelled?.() === true) break
      const decoded = await this.decodeWindow(codes, quantizers, frames, window.from, window.keepTo)
      const part = decoded.subarray((window.keepFrom - window.from) * hop, (window.keepTo - window.from) * hop)
      onChunk(part, chunk++)
      samples += part.length
    }
    return samples
  }

  async release(): Promise<void> {
    await this.session.release()
  }
}

/** What the router attaches to a decoding work item; its codes are the item's rows of `audio_codes` ([frames, quantizers]). */
export interface CodecItemMeta {
  readonly modality: "codes"
  readonly plan: CodecPlan
}

/**
 * Geri's worker on a codec: each item of a batch is one sequence of codes; their windows
 * interleave, and each streams its chunks (GeriAudioPiece) as they are decoded.
 */
export const codecWorkerModel = async ({ config, device }: WorkerContext): Promise<WorkerModel<CodecItemMeta>> => {
  const decoder = await CodecDecoder.load(config.modelDir, device, config.threadsPerDevice)
  return {
    async run({ inputs, items, emit, cancelled }) {
      const codes = inputs.audio_codes!
      const quantizers = codes.shape[1]!
      const all = codes.data as BigInt64Array
      return Promise.all(
        items.map(async (item, index) => {
          const meta = item.meta
          const [start, end] = item.rows
          const frames = end - start
          // [frames, quantizers] rows → [quantizers, frames], the graph's layout.
          const byQuantizer = new BigInt64Array(frames * quantizers)
          for (let t = 0; t < frames; t++)
            for (let q = 0; q < quantizers; q++) byQuantizer[q * frames + t] = all[(start + t) * quantizers + q]!
          const samples = await decoder.decode(
            byQuantizer,
            quantizers,
            { plan: meta.plan, cancelled: () => cancelled(index) },
            (part, chunk) => emit(index, { chunk, pcm: pcm16(part) })
          )
          return { frames, samples }
        })
      )
    },
    close: () => decoder.release(),
    // A long sequence's batch lasts as long as it plays out: a request arriving meanwhile starts at once.
    concurrentBatches: true
  }
}
