/**
 * How each unit-task operation becomes a request to its executor's HTTP API (the executors' own
 * api.ts schemas) and how the answer becomes the invocation's output. Forwarded data never passes
 * through here: only its ids, which name what the executors send and take through the sidecar.
 */
import { dataForwardId, type EncodedDataForward } from "../../app-runtime/tasks/DataForward.js"
import type { TaskInvocationWire } from "../../app-runtime/tasks/TaskGraph.js"
import type { EmbeddingsRequest } from "../../executors/eric/api.js"
import type { GenerateRequest } from "../../executors/geri/api.js"
import type { ChatCompletionRequest, PromptEmbeddingsRequest } from "../../executors/llm/api.js"
import { responseLines } from "../ResponseLines.js"

/** An executor's answer that is not success; 503 means it could not take the request (retry elsewhere). */
export class ExecutorCallFailed extends Error {
  override readonly name = "ExecutorCallFailed"
  constructor(
    message: string,
    readonly status: number
  ) {
    super(message)
  }
}

export interface CallContext {
  /** The node whose executors consume forwarded data (one node for now). */
  readonly receivers: ReadonlyArray<string>
  /** The modality of each forwarded datum an encoder produces, by id. */
  readonly modalities: ReadonlyMap<string, string>
  readonly signal: AbortSignal
}

export interface CallResult {
  readonly output: unknown
  /** The streamed chunks of a streaming invocation. */
  readonly stream?: AsyncIterable<unknown>
}

const post = async (url: string, body: unknown, signal: AbortSignal): Promise<Response> => {
  const response = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
    signal
  })
  if (response.ok) return response
  const text = await response.text()
  let message = text
  try {
    message = (JSON.parse(text) as { error?: { message?: string } }).error?.message ?? text
  } catch {
    // not JSON: the text is the message
  }
  throw new ExecutorCallFailed(message, response.status)
}

/** The JSON of each `data:` event of a Server-Sent Events answer, until `data: [DONE]`. */
async function* serverSentEvents(response: Response): AsyncIterable<unknown> {
  for await (const line of responseLines(response)) {
    if (!line.startsWith("data:")) continue
    const data = line.slice("data:".length).trim()
    if (data === "[DONE]") return
    const parsed = JSON.parse(data) as { error?: { message?: string } }
    if (parsed.error !== undefined) throw new ExecutorCallFailed(parsed.error.message ?? "the stream failed", 500)
    yield parsed
  }
}

const ids = (value: unknown): ReadonlyArray<string> =>
  Array.isArray(value) ? value.map((item) => dataForwardId(item as EncodedDataForward)) : []

type Input = Record<string, unknown>

const embed = async (url: string, invocation: TaskInvocationWire, context: CallContext): Promise<CallResult> => {
  const input = invocation.input as { urls: ReadonlyArray<string> }
  const produced = ids((invocation.output as { embeddings: unknown }).embeddings)
  const modality = (invocation.config as { modality: EmbeddingsRequest["items"][number]["modality"] }).modality
  const body: typeof EmbeddingsRequest.Encoded = {
    items: input.urls.map((itemUrl, index) => ({
      id: produced[index]!,
      modality,
      url: itemUrl
    })) as unknown as (typeof EmbeddingsRequest.Encoded)["items"],
    receivers: context.receivers
  }
  await (await post(`${url}/embeddings`, body, context.signal)).arrayBuffer()
  return { output: invocation.output }
}

const embeddingRefs = (input: Input, context: CallContext) =>
  input.cornserveEmbeddings === undefined
    ? {}
    : {
        cornserve_embeddings: ids(input.cornserveEmbeddings).map((id) => ({
          id,
          modality: (context.modalities.get(id) ?? "image") as "image" | "audio" | "video"
        }))
      }

const chat = async (url: string, invocation: TaskInvocationWire, context: CallContext): Promise<CallResult> => {
  const { cornserveEmbeddings: _, stream: __, stream_options: options, ...request } = invocation.input as Input
  const body = {
    ...request,
    ...embeddingRefs(invocation.input as Input, context),
    model: (invocation.config as { model: string }).model,
    stream: true,
    stream_options: { include_usage: (options as { include_usage?: boolean } | undefined)?.include_usage ?? false }
  } as unknown as typeof ChatCompletionRequest.Encoded
  const response = await post(`${url}/v1/chat/completions`, body, context.signal)
  return { output: {}, stream: serverSentEvents(response) }
}

const promptEmbeddings = async (
  url: string,
  invocation: TaskInvocationWire,
  context: CallContext
): Promise<CallResult> => {
  const { cornserveEmbeddings: _, ...request } = invocation.input as Input
  const body = {
    model: (invocation.config as { model: string }).model,
    messages: request.messages,
    ...embeddingRefs(invocation.input as Input, context),
    id: ids([(invocation.output as { embeddings: unknown }).embeddings])[0]!,
    receivers: context.receivers
  } as typeof PromptEmbeddingsRequest.Encoded
  await (await post(`${url}/v1/cornserve/prompt-embeddings`, body, context.signal)).arrayBuffer()
  return { output: invocation.output }
}

const generatorBody = (input: Input, stream: boolean): typeof GenerateRequest.Encoded => ({
  embeddings: ids([input.embeddings])[0]!,
  ...(input.skipTokens === undefined ? {} : { skipTokens: input.skipTokens as number }),
  ...(input.height === undefined ? {} : { height: input.height as number }),
  ...(input.width === undefined ? {} : { width: input.width as number }),
  ...(input.seed === undefined ? {} : { seed: input.seed as number }),
  ...(input.chunks === undefined ? {} : { chunks: input.chunks as number }),
  stream
})

const generateImage = async (
  url: string,
  invocation: TaskInvocationWire,
  context: CallContext
): Promise<CallResult> => {
  const answer = (await (
    await post(`${url}/generate`, generatorBody(invocation.input as Input, false), context.signal)
  ).json()) as { image: string }
  return { output: { image: answer.image } }
}

async function* audioChunks(response: Response): AsyncIterable<unknown> {
  for await (const line of responseLines(response)) {
    if (line.trim().length === 0) continue
    const parsed = JSON.parse(line) as {
      audio?: string
      sampleRate?: number
      done?: boolean
      error?: { message?: string }
    }
    if (parsed.error !== undefined) throw new ExecutorCallFailed(parsed.error.message ?? "the stream failed", 500)
    if (parsed.done === true) return
    yield { audio: parsed.audio, sampleRate: parsed.sampleRate }
  }
}

const generateAudio = async (
  url: string,
  invocation: TaskInvocationWire,
  context: CallContext
): Promise<CallResult> => {
  const response = await post(`${url}/generate`, generatorBody(invocation.input as Input, true), context.signal)
  return { output: {}, stream: audioChunks(response) }
}

export const executorCalls: Readonly<
  Record<string, (url: string, invocation: TaskInvocationWire, context: CallContext) => Promise<CallResult>>
> = {
  embed,
  chat,
  "hidden-states": promptEmbeddings,
  "generate-image": generateImage,
  "generate-audio": generateAudio
}

/** Encoders and generators may run a request twice with the same result; an LLM's stream may not be replayed. */
export const idempotentOperations = new Set(["embed", "generate-image", "hidden-states"])
