/**
 * How each unit-task operation becomes a request to its executor's HTTP API (the executors' own
 * api.ts schemas encode it and decode the answer) and how the answer becomes the invocation's
 * output; how a request is posted and its answer read is ExecutorRequest.ts's. Forwarded data
 * never passes through here: only its ids, which name what the executors send and take through the
 * sidecar.
 */
import { randomUUID } from "node:crypto"
import * as Arr from "effect/Array"
import * as Schema from "effect/Schema"
import { EncoderConfig, EncoderInput } from "../../app-runtime/tasks/EncoderTask.js"
import { AudioGeneratorInput, ImageGeneratorInput } from "../../app-runtime/tasks/GeneratorTask.js"
import type { EmbeddingResponse } from "../../app-runtime/schemas/Embeddings.js"
import { embeddingInputs, TextEmbeddingConfig, TextEmbeddingInput } from "../../app-runtime/tasks/TextEmbeddingTask.js"
import {
  SpeechRecognitionConfig,
  SpeechRecognitionInput,
  wantsSegments
} from "../../app-runtime/tasks/SpeechRecognitionTask.js"
import { SpeechSynthesisConfig, SpeechSynthesisInput } from "../../app-runtime/tasks/SpeechSynthesisTask.js"
import { CodecDecoderConfig, CodecDecoderInput } from "../../app-runtime/tasks/CodecDecoderTask.js"
import type { Transcription } from "../../app-runtime/schemas/Transcriptions.js"
import type { TaskInvocationWire } from "../../app-runtime/tasks/TaskGraph.js"
import { ErrorBody } from "../../executors/common/errors.js"
import {
  EmbeddingsRequest,
  EmbeddingsResponse,
  TextEmbeddingsRequest,
  TextEmbeddingsResponse,
  TranscriptionsRequest,
  TranscriptionsResponse
} from "../../executors/eric/api.js"
import {
  AudioChunkLine,
  AudioDoneLine,
  GenerateRequest,
  ImageAnswer,
  SynthesisRequest,
  CodesRequest
} from "../../executors/geri/api.js"
import type { Modality } from "../../executors/llm/api.js"
import { InvalidTaskGraph } from "../errors.js"
import { fromExecutor, remoteError } from "../RemoteError.js"
import { responseLines } from "../ResponseLines.js"
import { cachedEmbedding, embeddingKey } from "./EmbeddingCache.js"
import { llmCalls } from "./LlmCalls.js"
import type { ExecutorAnswer } from "./ExecutorHttp.js"
import {
  type CallContext,
  type CallResult,
  decodeAnswer,
  decodeInvocation,
  type EmbeddingCaching,
  ForwardedId,
  post
} from "./ExecutorRequest.js"

export type { CallContext, CallResult, EmbeddingCaching } from "./ExecutorRequest.js"

/**
 * The cache keys of an encoder invocation's items (undefined for an item that has none), computed
 * once per invocation: the dispatcher looks them up before leasing, the call again for the misses,
 * and a key hashes the item's whole media with how the encoder reads it.
 */
const itemKeys = new WeakMap<TaskInvocationWire, ReadonlyArray<string | undefined>>()
const cacheKeysOf = (invocation: TaskInvocationWire): ReadonlyArray<string | undefined> => {
  let keys = itemKeys.get(invocation)
  if (keys === undefined) {
    const { config, input } = decodeEncoderCall(invocation)
    // How the call asks the encoder to read its items, exactly as `embed` sends it.
    const reading = { modality: config.modality, processor: input.processor, model: input.model ?? config.model }
    keys = input.urls.map((itemUrl) => embeddingKey(invocation.taskId, reading, itemUrl))
    itemKeys.set(invocation, keys)
  }
  return keys
}

/**
 * An encoder invocation whose items are all in the cache, served from it: the cached chunks are
 * forwarded under the invocation's ids and no encoder is called. Undefined when one is not there.
 */
export const embedFromCache = (
  invocation: TaskInvocationWire,
  caching: EmbeddingCaching
): ((context: CallContext) => Promise<CallResult>) | undefined => {
  if (invocation.operation !== "embed") return undefined
  const { input, output } = decodeEncoderCall(invocation)
  if (input.urls.length !== output.embeddings.length) return undefined
  const keys = cacheKeysOf(invocation)
  if (!keys.every((key) => key !== undefined && caching.cache.has(key))) return undefined
  const hits = keys.map((key) => caching.cache.get(key!)!)
  for (const _ of hits) caching.observe(invocation.taskId, "hit")
  return async (context) => {
    await Promise.all(
      hits.map((hit, index) =>
        caching.forward(output.embeddings[index]!, hit.chunks, receiversOf(context, output.embeddings[index]!))
      )
    )
    return { output: invocation.output }
  }
}

const decodeEncoderCall = decodeInvocation(
  Schema.Struct({
    config: EncoderConfig,
    input: EncoderInput,
    output: Schema.Struct({ embeddings: Schema.NonEmptyArray(ForwardedId) })
  })
)

/** The modality of each datum the graph's encoder calls produce, by id. */
export const producedModalities = (invocations: ReadonlyArray<TaskInvocationWire>): ReadonlyMap<string, Modality> =>
  new Map(
    invocations
      .filter((invocation) => invocation.operation === "embed")
      .flatMap((invocation) => {
        const { config, output } = decodeEncoderCall(invocation)
        return output.embeddings.map((id) => [id, config.modality] as const)
      })
  )

/** Where datum `id` goes: its own receivers when the call knows them, else the call's. */
const receiversOf = (context: CallContext, id: string): ReadonlyArray<string> => {
  const own = context.receiversOf?.(id)
  return own === undefined || own.length === 0 ? context.receivers : own
}

/**
 * An encoder call. With the cache: items in it are forwarded from it; the others go to the encoder,
 * those with a key (a `data:` URL) sent to this node to be cached and forwarded from here.
 */
const embed = async (url: string, invocation: TaskInvocationWire, context: CallContext): Promise<CallResult> => {
  const { config, input, output } = decodeEncoderCall(invocation)
  if (input.urls.length !== output.embeddings.length) {
    throw new InvalidTaskGraph({
      message: `task ${invocation.taskId} embeds ${input.urls.length} media into ${output.embeddings.length} embeddings`
    })
  }
  const caching = context.embeddings
  const keys = caching === undefined ? [] : cacheKeysOf(invocation)
  const items = output.embeddings.map((id, index) => {
    const itemUrl = input.urls[index]!
    const key = keys[index]
    const hit = key === undefined ? undefined : caching!.cache.get(key)
    if (key !== undefined) caching!.observe(invocation.taskId, hit === undefined ? "miss" : "hit")
    return { id, url: itemUrl, key, hit, capture: key === undefined || hit !== undefined ? undefined : randomId() }
  })
  const forwarded = items.flatMap((item) =>
    item.hit === undefined ? [] : [caching!.forward(item.id, item.hit.chunks, receiversOf(context, item.id))]
  )
  const missing = items.filter((item) => item.hit === undefined)
  if (missing.length > 0) {
    const requested = missing.map((item) => ({
      id: item.capture ?? item.id,
      modality: config.modality,
      url: item.url,
      receivers: item.capture === undefined ? receiversOf(context, item.id) : [caching!.node],
      ...(input.model === undefined ? {} : { model: input.model })
    }))
    if (!Arr.isNonEmptyArray(requested)) throw new InvalidTaskGraph({ message: "an encoder call with no items" })
    const body: EmbeddingsRequest = {
      items: requested,
      receivers: context.receivers,
      return: "sidecar",
      ...(input.processor === undefined ? {} : { processor: input.processor })
    }
    const captures = missing.flatMap((item) => (item.capture === undefined ? [] : [item.capture]))
    try {
      decodeAnswer(EmbeddingsResponse)(await (await post(`${url}/embeddings`, EmbeddingsRequest, body, context)).json())
      for (const item of missing) {
        if (item.capture === undefined) continue
        const chunks = await caching!.take(item.capture)
        caching!.cache.set(item.key!, cachedEmbedding(chunks))
        forwarded.push(caching!.forward(item.id, chunks, receiversOf(context, item.id)))
      }
    } catch (error) {
      // What the encoder sent here for the cache would otherwise stay in the sidecar until its TTL.
      if (captures.length > 0) caching!.discard(captures)
      throw error
    }
  }
  await Promise.all(forwarded)
  return { output: invocation.output }
}

const randomId = () => randomUUID().replaceAll("-", "")

const decodeTextEmbeddingCall = decodeInvocation(
  Schema.Struct({ config: TextEmbeddingConfig, input: TextEmbeddingInput })
)

/** A vector the executor answers (little-endian float32, base64) as JSON numbers. */
const floatsOf = (base64: string): ReadonlyArray<number> => {
  const bytes = Buffer.from(base64, "base64")
  return Array.from(new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4))
}

/**
 * A text-embedding call: the request's inputs to the executor, its vectors back as OpenAI answers
 * them (numbers, or the executor's base64 as it is), under the model the task serves.
 */
const embedText = async (url: string, invocation: TaskInvocationWire, context: CallContext): Promise<CallResult> => {
  const { config, input } = decodeTextEmbeddingCall(invocation)
  const inputs = embeddingInputs(input.input)
  if (!Arr.isNonEmptyReadonlyArray(inputs))
    throw new InvalidTaskGraph({ message: "a text-embedding call with no input" })
  const body: TextEmbeddingsRequest = {
    inputs,
    ...(input.truncate_prompt_tokens == null ? {} : { truncate: input.truncate_prompt_tokens }),
    ...(input.dimensions == null ? {} : { dimensions: input.dimensions }),
    ...(config.pooling === undefined ? {} : { pooling: config.pooling }),
    ...(config.normalize === undefined ? {} : { normalize: config.normalize })
  }
  const response = await post(`${url}/text-embeddings`, TextEmbeddingsRequest, body, context)
  const answer = decodeAnswer(TextEmbeddingsResponse)(await response.json())
  const base64 = input.encoding_format === "base64"
  const output: EmbeddingResponse = {
    object: "list",
    data: answer.embeddings.map((vector, index) => ({
      object: "embedding",
      index,
      embedding: base64 ? vector : floatsOf(vector)
    })),
    model: config.model,
    usage: { prompt_tokens: answer.promptTokens, total_tokens: answer.promptTokens }
  }
  return { output }
}

const decodeTranscriptionCall = decodeInvocation(
  Schema.Struct({ config: SpeechRecognitionConfig, input: SpeechRecognitionInput })
)

/** A transcription call: the request's audio and settings to the executor, its transcript back as OpenAI's verbose answer. */
const transcribe = async (url: string, invocation: TaskInvocationWire, context: CallContext): Promise<CallResult> => {
  const { input } = decodeTranscriptionCall(invocation)
  const body: TranscriptionsRequest = {
    url: input.file,
    timestamps: wantsSegments(input),
    ...(input.language == null ? {} : { language: input.language }),
    ...(input.task == null ? {} : { task: input.task }),
    ...(input.chunk_length_s == null ? {} : { chunkSeconds: input.chunk_length_s }),
    ...(input.stride_length_s == null ? {} : { strideSeconds: input.stride_length_s })
  }
  const response = await post(`${url}/transcriptions`, TranscriptionsRequest, body, context)
  const answer = decodeAnswer(TranscriptionsResponse)(await response.json())
  const output: Transcription = {
    task: answer.task,
    language: answer.language,
    duration: answer.duration,
    text: answer.text,
    ...(answer.segments === undefined ? {} : { segments: answer.segments.map((segment, id) => ({ id, ...segment })) })
  }
  return { output }
}

const decodeImageInput = decodeInvocation(
  Schema.Struct({ input: Schema.Struct({ ...ImageGeneratorInput.fields, embeddings: ForwardedId }) })
)

const generateImage = async (
  url: string,
  invocation: TaskInvocationWire,
  context: CallContext
): Promise<CallResult> => {
  const { input } = decodeImageInput(invocation)
  const body: GenerateRequest = { ...input, skipTokens: input.skipTokens ?? 0, stream: false }
  const response = await post(`${url}/generate`, GenerateRequest, body, context)
  const answer = decodeAnswer(ImageAnswer)(await response.json())
  return { output: { image: answer.image } }
}

const decodeAudioInput = decodeInvocation(
  Schema.Struct({ input: Schema.Struct({ ...AudioGeneratorInput.fields, embeddings: ForwardedId }) })
)

const decodeAudioLine = decodeAnswer(Schema.parseJson(Schema.Union(AudioChunkLine, AudioDoneLine, ErrorBody)))

async function* audioChunks(response: ExecutorAnswer): AsyncIterable<unknown> {
  for await (const line of responseLines(response)) {
    if (line.trim().length === 0) continue
    const parsed = decodeAudioLine(line)
    if ("error" in parsed) throw remoteError(parsed.error, fromExecutor)
    if ("done" in parsed) return
    yield { audio: parsed.audio, sampleRate: parsed.sampleRate }
  }
}

const generateAudio = async (
  url: string,
  invocation: TaskInvocationWire,
  context: CallContext
): Promise<CallResult> => {
  const { input } = decodeAudioInput(invocation)
  const body: GenerateRequest = { ...input, skipTokens: input.skipTokens ?? 0, stream: true }
  const response = await post(`${url}/generate`, GenerateRequest, body, context)
  return { output: {}, stream: audioChunks(response) }
}

const decodeSynthesisCall = decodeInvocation(
  Schema.Struct({ config: SpeechSynthesisConfig, input: SpeechSynthesisInput })
)

/** A speech call: the text and voice to Geri, its audio chunks streamed back as they are spoken. */
const synthesize = async (url: string, invocation: TaskInvocationWire, context: CallContext): Promise<CallResult> => {
  const { input } = decodeSynthesisCall(invocation)
  const body: SynthesisRequest = {
    text: input.input,
    stream: true,
    ...(input.voice == null ? {} : { voice: input.voice }),
    ...(input.speaker_embedding == null ? {} : { speakerEmbedding: input.speaker_embedding })
  }
  const response = await post(`${url}/speech`, SynthesisRequest, body, context)
  return { output: {}, stream: audioChunks(response) }
}

const decodeCodesCall = decodeInvocation(Schema.Struct({ config: CodecDecoderConfig, input: CodecDecoderInput }))

/** A codec call: the codes to Geri, the audio chunks streamed back as they are decoded. */
const decodeCodes = async (url: string, invocation: TaskInvocationWire, context: CallContext): Promise<CallResult> => {
  const { input } = decodeCodesCall(invocation)
  const response = await post(`${url}/codes`, CodesRequest, { ...input, stream: true }, context)
  return { output: {}, stream: audioChunks(response) }
}

export const executorCalls: Readonly<
  Record<string, (url: string, invocation: TaskInvocationWire, context: CallContext) => Promise<CallResult>>
> = {
  embed,
  "embed-text": embedText,
  transcribe,
  ...llmCalls,
  "generate-image": generateImage,
  "generate-audio": generateAudio,
  synthesize,
  "decode-codes": decodeCodes
}
