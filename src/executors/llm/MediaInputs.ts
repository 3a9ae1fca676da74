/**
 * The router's side of a prompt's media: each media part becomes the model's input for it, either
 * preprocessed here for the model's own encoder (read, decoded and normalized in the router's
 * thread pool) or, when the request names sidecar embeddings, the rows an encoder executor sent.
 */
import { decodeAudioProcessorConfig } from "../../models/AudioProcessor.js"
import { expandGemma3Prompt, Gemma3ImageMarkerMismatch } from "../../models/Gemma3Processor.js"
import { expandIdefics3Prompt } from "../../models/Idefics3Processor.js"
import type { ModelDirectory } from "../../models/ModelDirectory.js"
import { mropePositions, VisionTokenMismatch } from "../../models/MRope.js"
import type { MediaProcessorOptions } from "../../app-runtime/schemas/OpenAI.js"
import {
  type GridThw,
  type Qwen2VLRequestSettings,
  qwen2VLRequestSettings,
  qwen2VLVideoTokenBudget,
  visionTokenCount
} from "../../models/Qwen2VLProcessor.js"
import { ultravoxAudioOf } from "../../models/UltravoxProcessor.js"
import { visionProcessorOf } from "../../models/VisionProcessor.js"
import { voxtralRowsPerChunk } from "../../models/VoxtralProcessor.js"
import { RecvTimeout } from "../../sidecar/errors.js"
import type { Payload, SidecarClient } from "../../sidecar/SidecarClient.js"
import { Tensor } from "../../sidecar/Tensor.js"
import type { ExecutorConfig } from "../common/ExecutorConfig.js"
import { allOrNone, type ThreadPool } from "../common/ThreadPool.js"
import { mediaSourceOptionsOf, readMedia } from "../common/media/MediaSource.js"
import { EmbeddingMissing } from "../common/errors.js"
import { mediaLimitsOf } from "../common/media/MediaLimits.js"
import type { Preprocessed, TileGrid } from "../common/media/preprocess.js"
import { ultravoxAudioJob } from "../common/media/UltravoxAudioJob.js"
import type { EmbeddingRef, Modality } from "./api.js"
import { expandPlaceholders, type MediaPart, PromptError, scatterPlaceholders } from "./Prompt.js"
import type { MediaInput, MediaSpan, RopePositions } from "./protocol.js"

export interface ResolvedMedia {
  readonly modality: Modality
  readonly rows: number
  readonly input: MediaInput
  /** Idefics3 images: the tile grid the prompt spells out. */
  readonly grid?: TileGrid
  /** Qwen2-VL images and videos: the patch grid, which gives the prompt's M-RoPE positions. */
  readonly thw?: GridThw
}

export interface MediaInputs {
  /** The modalities the model has placeholders for: what sidecar embeddings may stand for. */
  readonly accepted: ReadonlyArray<Modality>
  /** The modalities the model can embed itself. */
  readonly encodable: ReadonlyArray<Modality>
  /** Placeholder token id → modality. */
  readonly placeholders: ReadonlyMap<number, Modality>
  /** The text a media part is in the prompt, for models whose templates read text only (Ultravox's <|audio|>). */
  readonly mediaText: Partial<Record<Modality, string>>
  /**
   * Each media part's input; `processor` is the request's processor settings (mm_processor_kwargs);
   * `signal` ends the decoding when the request ends.
   */
  resolve(
    parts: ReadonlyArray<MediaPart>,
    refs: ReadonlyArray<EmbeddingRef> | undefined,
    processor?: MediaProcessorOptions,
    signal?: AbortSignal
  ): Promise<Array<ResolvedMedia>>
  /** The rendered prompt with each media item spelled out as the model's processor does (Idefics3), else as it is. */
  promptText(text: string, media: ReadonlyArray<ResolvedMedia>): string
  /** The tokenized prompt's ids, where each media item's rows go, and (Qwen2-VL) the prompt's M-RoPE positions. */
  layout(
    ids: ReadonlyArray<number>,
    media: ReadonlyArray<ResolvedMedia>
  ): { readonly inputIds: Int32Array; readonly spans: ReadonlyArray<MediaSpan>; readonly rope?: RopePositions }
}

export const makeMediaInputs = (options: {
  readonly config: ExecutorConfig
  readonly model: ModelDirectory
  readonly pool: ThreadPool
  readonly sidecar: SidecarClient | undefined
}): MediaInputs => {
  const { config, model, pool, sidecar } = options
  const hidden = model.decoder!.hiddenSize
  const placeholders = new Map<number, Modality>()
  if (model.config.image_token_id !== undefined) placeholders.set(model.config.image_token_id, "image")
  if (model.config.audio_token_id !== undefined) placeholders.set(model.config.audio_token_id, "audio")
  if (model.config.video_token_id !== undefined) placeholders.set(model.config.video_token_id, "video")
  const accepted = [...placeholders.values()]
  // The model embeds a modality itself when it has the encoder and knows how many rows it gives.
  const vision = model.onnx.has("vision_encoder") ? visionProcessorOf(model) : undefined
  const imageConfig =
    vision?.kind === "fixed" && model.config.image_seq_length !== undefined ? vision.config : undefined
  const idefics3 = vision?.kind === "idefics3" ? vision.processor : undefined
  const qwen2VL = vision?.kind === "qwen2vl" ? vision.processor : undefined
  const gemma3 = vision?.kind === "gemma3" ? vision.processor : undefined
  const llavaOnevision = vision?.kind === "llavaOnevision" ? vision.processor : undefined
  const mergeSize = qwen2VL?.config.merge_size ?? 1
  const ultravox = ultravoxAudioOf(model)
  const audioConfig =
    ultravox === undefined && model.onnx.has("audio_encoder") && model.config.audio_seq_length !== undefined
      ? decodeAudioProcessorConfig(model.preprocessorConfig)
      : undefined
  const encodable = accepted.filter(
    (modality) =>
      (modality === "image"
        ? (imageConfig ?? idefics3 ?? qwen2VL ?? gemma3 ?? llavaOnevision)
        : modality === "video"
          ? qwen2VL
          : (audioConfig ?? ultravox)) !== undefined
  )
  const mediaOptions = mediaSourceOptionsOf(config)
  const limits = mediaLimitsOf(config)

  const encode = async (
    part: MediaPart,
    settings: Qwen2VLRequestSettings | undefined,
    signal: AbortSignal
  ): Promise<ResolvedMedia> => {
    if (!encodable.includes(part.modality)) {
      throw new PromptError(
        `model ${config.model} cannot take ${part.modality}${accepted.includes(part.modality) ? " without embeddings from an encoder (cornserve_embeddings)" : ""}`
      )
    }
    // Qwen3-VL's videos are refused before their bytes are read (VisionProcessor.ts says why).
    if (part.modality === "video" && qwen2VL?.videoRefusal !== undefined) throw new PromptError(qwen2VL.videoRefusal)
    const media = await readMedia(part.url, mediaOptions)
    const bytes = new Uint8Array(media.bytes.buffer, media.bytes.byteOffset, media.bytes.byteLength)
    const run = (task: string, input: unknown) => pool.run<Preprocessed>(task, input, { signal })
    if (qwen2VL !== undefined && part.modality !== "audio") {
      const { inputs, thw } =
        part.modality === "image"
          ? await run("qwen2VLImage", {
              bytes,
              processor: qwen2VL,
              limits,
              ...(settings === undefined ? {} : { bounds: settings.bounds })
            })
          : await run("qwen2VLVideo", {
              bytes,
              processor: qwen2VL,
              maxTokens: qwen2VLVideoTokenBudget(model.decoder?.maxPositions),
              limits,
              ...settings
            })
      const pixels = inputs.pixel_values!
      return {
        modality: part.modality,
        rows: visionTokenCount(thw!, mergeSize),
        input: { kind: "pixel_values", data: pixels.data as Float32Array, shape: pixels.shape, thw: thw! },
        thw: thw!
      }
    }
    if (part.modality === "image" && idefics3 !== undefined) {
      const { inputs, grid } = await run("idefics3Image", { bytes, config: idefics3.image, limits })
      const pixels = inputs.pixel_values!
      return {
        modality: "image",
        rows: pixels.shape[0]! * idefics3.imageSeqLen,
        input: { kind: "pixel_values", data: pixels.data as Float32Array, shape: pixels.shape },
        grid: grid!
      }
    }
    const fixedSize = gemma3 ?? llavaOnevision
    if (part.modality === "image" && fixedSize !== undefined) {
      const { inputs } = await run("fixedSizeImage", { bytes, config: fixedSize, limits })
      const pixels = inputs.pixel_values!
      return {
        modality: "image",
        rows: gemma3?.imageSeqLength ?? llavaOnevision!.imageTokens,
        input: { kind: "pixel_values", data: pixels.data as Float32Array, shape: pixels.shape }
      }
    }
    if (part.modality === "image") {
      const { inputs } = await run("image", { bytes, config: imageConfig, limits })
      const pixels = inputs.pixel_values!
      return {
        modality: "image",
        rows: model.config.image_seq_length!,
        input: { kind: "pixel_values", data: pixels.data as Float32Array, shape: pixels.shape }
      }
    }
    if (ultravox !== undefined) {
      const { inputs, rows } = await ultravoxAudioJob(pool, {
        bytes,
        mimeType: media.mimeType,
        preprocessorConfig: model.preprocessorConfig,
        ultravox,
        limits,
        signal
      })
      const values = inputs.audio_values!
      return {
        modality: "audio",
        rows: rows!,
        input: { kind: "audio_values", data: values.data as Float32Array, shape: values.shape }
      }
    }
    const { inputs } = await run("audio", {
      bytes,
      mimeType: media.mimeType,
      config: audioConfig,
      limits
    })
    const values = inputs.input_values!
    return {
      modality: "audio",
      rows: model.config.audio_seq_length!,
      input: { kind: "input_values", data: values.data as Float32Array, shape: values.shape }
    }
  }

  /**
   * Every chunk of embedding `id`, in order, as [rows, hidden]; the chunks are then released. An
   * Idefics3 image's transfer starts with its tile grid, int32 [rows, cols]; a Qwen2-VL image's or
   * video's with its patch grid, int32 [t, h, w].
   */
  const receive = async (client: SidecarClient, ref: EmbeddingRef): Promise<ResolvedMedia> => {
    const parts: Array<Float32Array> = []
    let grid: TileGrid | undefined
    let thw: GridThw | undefined
    for (let chunk = 0; ; chunk++) {
      let payload: Payload | undefined
      try {
        payload = await client.recv(ref.id, chunk, { timeoutMs: config.embeddingWaitMs })
      } catch (error) {
        if (chunk === 0 && error instanceof RecvTimeout)
          throw new EmbeddingMissing({
            message: `embedding ${ref.id} did not arrive within ${config.embeddingWaitMs} ms`
          })
        throw error
      }
      if (payload === undefined) break
      if (chunk === 0 && payload instanceof Tensor && payload.dtype === "int32" && payload.shape.join() === "2") {
        grid = { rows: payload.data[0] as number, cols: payload.data[1] as number }
        await client.markDone(ref.id, chunk)
        continue
      }
      if (chunk === 0 && payload instanceof Tensor && payload.dtype === "int32" && payload.shape.join() === "3") {
        const [t, h, w] = Array.from(payload.data as Int32Array)
        thw = [t!, h!, w!]
        await client.markDone(ref.id, chunk)
        continue
      }
      if (
        !(payload instanceof Tensor) ||
        payload.dtype !== "float32" ||
        payload.shape.length !== 2 ||
        payload.shape[1] !== hidden
      ) {
        throw new PromptError(`embedding ${ref.id} chunk ${chunk} is not a float32 [rows, ${hidden}] tensor`)
      }
      parts.push((payload.data as Float32Array).slice())
      await client.markDone(ref.id, chunk)
    }
    const data = new Float32Array(parts.reduce((sum, part) => sum + part.length, 0))
    let at = 0
    for (const part of parts) {
      data.set(part, at)
      at += part.length
    }
    const rows = data.length / hidden
    if (rows === 0) throw new PromptError(`embedding ${ref.id} is empty`)
    if (idefics3 !== undefined && ref.modality === "image" && grid === undefined) {
      throw new PromptError(`embedding ${ref.id} has no tile grid: it is not an Idefics3 image encoding`)
    }
    if (gemma3 !== undefined && ref.modality === "image" && rows !== gemma3.imageSeqLength) {
      throw new PromptError(
        `embedding ${ref.id} has ${rows} rows: this model's images are ${gemma3.imageSeqLength} soft tokens each`
      )
    }
    if (llavaOnevision !== undefined && ref.modality === "image" && rows !== llavaOnevision.imageTokens) {
      throw new PromptError(
        `embedding ${ref.id} has ${rows} rows: this model's images are ${llavaOnevision.imageTokens} <image> tokens each`
      )
    }
    if (ultravox?.kind === "voxtral" && ref.modality === "audio" && rows % voxtralRowsPerChunk !== 0) {
      throw new PromptError(
        `embedding ${ref.id} has ${rows} rows: this model's clips are ${voxtralRowsPerChunk} rows a ${ultravox.extractor.nSamples / ultravox.extractor.samplingRate} s chunk`
      )
    }
    if (qwen2VL !== undefined && ref.modality !== "audio") {
      if (thw === undefined || thw.some((n) => !(n > 0)) || visionTokenCount(thw, mergeSize) !== rows) {
        throw new PromptError(
          `embedding ${ref.id} has ${thw === undefined ? "no patch grid" : `${rows} rows for the patch grid ${thw.join("×")}`}: it is not a Qwen2-VL ${ref.modality} encoding of this model`
        )
      }
    }
    return {
      modality: ref.modality,
      rows,
      input: {
        kind: "embedding",
        data,
        shape: [rows, hidden],
        ...(grid === undefined ? {} : { grid: [grid.rows, grid.cols] as const }),
        ...(thw === undefined ? {} : { grid: thw })
      },
      ...(grid === undefined ? {} : { grid }),
      ...(thw === undefined ? {} : { thw })
    }
  }

  const promptText = (text: string, media: ReadonlyArray<ResolvedMedia>): string => {
    const images = media.filter((item) => item.modality === "image")
    // Gemma 3: each image's marker the chat template wrote, spelled out as its soft tokens.
    if (gemma3 !== undefined) {
      try {
        return expandGemma3Prompt(text, gemma3, images.length)
      } catch (error) {
        if (error instanceof Gemma3ImageMarkerMismatch) throw new PromptError(error.message)
        throw error
      }
    }
    if (idefics3 === undefined) return text
    try {
      return expandIdefics3Prompt(
        text,
        images.map((item) => item.grid!),
        idefics3.imageSeqLen
      )
    } catch (error) {
      throw new PromptError((error as Error).message)
    }
  }

  const layout = (ids: ReadonlyArray<number>, media: ReadonlyArray<ResolvedMedia>) => {
    if (idefics3 === undefined && gemma3 === undefined) {
      const { inputIds, starts } = expandPlaceholders(
        ids,
        placeholders,
        media,
        ultravox?.kind === "voxtral" ? { audio: [ultravox.beginAudioId] } : {}
      )
      const spans = media.map((item, index) => ({ start: starts[index]!, rows: item.rows, input: item.input }))
      if (qwen2VL === undefined) return { inputIds, spans }
      try {
        const rope = mropePositions(
          inputIds,
          { imagePad: model.config.image_token_id ?? -1, videoPad: model.config.video_token_id ?? -1 },
          {
            images: media.flatMap((item) => (item.modality === "image" ? [item.thw!] : [])),
            videos: media.flatMap((item) => (item.modality === "video" ? [item.thw!] : []))
          },
          mergeSize
        )
        return { inputIds, spans, rope }
      } catch (error) {
        if (error instanceof VisionTokenMismatch) throw new PromptError(error.message)
        throw error
      }
    }
    // Idefics3's and Gemma 3's prompts spell their images' tokens out: each image's rows go to its own.
    const positions = scatterPlaceholders(ids, gemma3?.image.id ?? model.config.image_token_id!, media)
    return {
      inputIds: Int32Array.from(ids),
      spans: media.map((item, index) => ({
        start: positions[index]![0]!,
        rows: item.rows,
        input: item.input,
        positions: positions[index]!
      }))
    }
  }

  return {
    accepted,
    encodable,
    placeholders,
    mediaText: ultravox?.kind === "ultravox" ? { audio: ultravox.placeholder } : {},
    promptText,
    layout,
    resolve: async (parts, refs, processor, signal) => {
      for (const part of parts) {
        if (!accepted.includes(part.modality))
          throw new PromptError(
            `model ${config.model} cannot take ${part.modality}; it takes ${accepted.join(", ") || "text only"}`
          )
      }
      if (refs === undefined) {
        let settings: Qwen2VLRequestSettings | undefined
        if (processor !== undefined && parts.some((part) => part.modality !== "audio")) {
          if (qwen2VL === undefined) {
            throw new PromptError(
              `model ${config.model} takes no processor settings (mm_processor_kwargs): only Qwen2-VL models do`
            )
          }
          const checked = qwen2VLRequestSettings(qwen2VL, processor)
          if (typeof checked === "string") throw new PromptError(checked)
          settings = checked
        }
        return allOrNone(parts, signal, (part, partSignal) => encode(part, settings, partSignal))
      }
      if (refs.length !== parts.length)
        throw new PromptError(`cornserve_embeddings names ${refs.length} embeddings for ${parts.length} media parts`)
      refs.forEach((ref, index) => {
        if (ref.modality !== parts[index]!.modality)
          throw new PromptError(
            `cornserve_embeddings[${index}] is ${ref.modality}, but media part ${index} is ${parts[index]!.modality}`
          )
      })
      if (sidecar === undefined) throw new PromptError("this executor has no sidecar to take cornserve_embeddings from")
      return Promise.all(refs.map((ref) => receive(sidecar, ref)))
    }
  }
}
