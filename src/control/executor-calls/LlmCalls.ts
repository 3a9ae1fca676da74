import * as Either from "effect/Either"
import * as Schema from "effect/Schema"
import { LLMConfig, LLMImageTokensInput, PromptEmbeddingSource } from "../../app-runtime/tasks/LLMTask.js"
import type { TaskInvocationWire } from "../../app-runtime/tasks/TaskGraph.js"
import { ChatCompletionRequest as OpenAIChatRequest } from "../../app-runtime/schemas/OpenAI.js"
import { ErrorBody } from "../../executors/common/errors.js"
import {
  ChatCompletionRequest,
  ImageTokensRequest,
  ImageTokensResponse,
  KvPrefillRequest,
  KvPrefillResponse,
  LlmChunk,
  PromptEmbeddingsRequest,
  PromptEmbeddingsResponse,
  StatesLine,
  TalkLine,
  TalkRequest
} from "../../executors/llm/api.js"
import { TalkerInput, type TalkerOutput } from "../../app-runtime/tasks/TalkerTask.js"
import { fromExecutor, remoteError } from "../RemoteError.js"
import { responseLines } from "../ResponseLines.js"
import type { ExecutorAnswer } from "./ExecutorHttp.js"
import {
  type CallContext,
  type CallResult,
  decodeAnswer,
  decodeInvocation,
  ForwardedId,
  post
} from "./ExecutorRequest.js"

const ChatInput = Schema.extend(
  OpenAIChatRequest,
  Schema.Struct({
    cornserveEmbeddings: Schema.optional(Schema.Array(ForwardedId)),
    /** A DecodeLLMTask's: the prompt's KV cache, which a PrefillLLMTask forwarded. */
    cornserveKv: Schema.optional(ForwardedId),
    parseSpecialTokensInContent: Schema.optional(Schema.Boolean)
  })
)

/** An app's own trusted prompt (LLMTask's `parseSpecialTokensInContent`), as the executor's requests say it. */
const specialTokensParsed = (trusted: boolean | undefined) =>
  trusted === true ? { cornserve_parse_special_tokens: true } : {}

const decodeChatCall = decodeInvocation(Schema.Struct({ config: LLMConfig, input: ChatInput }))
const decodeHiddenStatesCall = decodeInvocation(
  Schema.Struct({
    config: LLMConfig,
    input: Schema.extend(
      ChatInput,
      Schema.Struct({
        embeddingSource: Schema.optional(PromptEmbeddingSource),
        embeddingGenerate: Schema.optional(Schema.Union(Schema.Boolean, Schema.Literal("stream")))
      })
    ),
    output: Schema.Struct({ embeddings: ForwardedId, transcript: Schema.optional(ForwardedId) })
  })
)

const embeddingRefs = (ids: ReadonlyArray<string> | undefined, context: CallContext) =>
  ids === undefined
    ? {}
    : { cornserve_embeddings: ids.map((id) => ({ id, modality: context.modalities.get(id) ?? "image" })) }

const decodeChunk = decodeAnswer(Schema.parseJson(LlmChunk))
const decodeStreamError = Schema.decodeUnknownEither(Schema.parseJson(ErrorBody))

/** The chunks of a Server-Sent Events answer, until `data: [DONE]`; an error event fails the stream. */
async function* chatChunks(response: ExecutorAnswer): AsyncIterable<LlmChunk> {
  for await (const line of responseLines(response)) {
    if (!line.startsWith("data:")) continue
    const data = line.slice("data:".length).trim()
    if (data === "[DONE]") return
    const failure = decodeStreamError(data)
    if (Either.isRight(failure)) throw remoteError(failure.right.error, fromExecutor)
    yield decodeChunk(data)
  }
}

const chat = async (url: string, invocation: TaskInvocationWire, context: CallContext): Promise<CallResult> => {
  const { config, input } = decodeChatCall(invocation)
  const { cornserveEmbeddings, parseSpecialTokensInContent, cornserveKv, ...request } = input
  const body: ChatCompletionRequest = {
    ...request,
    ...embeddingRefs(cornserveEmbeddings, context),
    // A failover runs the whole graph again: the prefill too, whose cache comes under a fresh id.
    ...(cornserveKv === undefined ? {} : { cornserve_kv: { id: cornserveKv } }),
    ...specialTokensParsed(parseSpecialTokensInContent),
    model: config.model,
    stream: true,
    stream_options: { include_usage: request.stream_options?.include_usage ?? false },
    // The token ids let the dispatcher carry the stream on elsewhere if this executor fails.
    cornserve_token_ids: true,
    ...(context.continuation === undefined || context.continuation.length === 0
      ? {}
      : { cornserve_continuation: { token_ids: context.continuation } })
  }
  const response = await post(`${url}/v1/chat/completions`, ChatCompletionRequest, body, context)
  return { output: {}, stream: chatChunks(response) }
}

/** A completion before the hidden states (LLMEmbeddingTask's `generate`), as the call's chat request asks. */
const generationOf = (input: typeof ChatInput.Type) => {
  const maxTokens = input.max_completion_tokens ?? input.max_tokens
  return {
    ...(maxTokens == null ? {} : { max_tokens: maxTokens }),
    ...(input.temperature == null ? {} : { temperature: input.temperature }),
    ...(input.seed == null ? {} : { seed: input.seed })
  }
}

/** An LLM embedding call's request to the executor: the prompt's embeddings out under the output's id. */
const promptEmbeddingsBody = (
  { config, input, output }: ReturnType<typeof decodeHiddenStatesCall>,
  context: CallContext,
  receivers: ReadonlyArray<string>,
  asked: Pick<PromptEmbeddingsRequest, "source" | "generate">
): PromptEmbeddingsRequest => ({
  model: config.model,
  messages: input.messages,
  add_generation_prompt: false,
  ...embeddingRefs(input.cornserveEmbeddings, context),
  ...specialTokensParsed(input.parseSpecialTokensInContent),
  id: output.embeddings,
  receivers,
  return: "sidecar",
  ...asked
})

const promptEmbeddings = async (
  url: string,
  invocation: TaskInvocationWire,
  context: CallContext
): Promise<CallResult> => {
  const call = decodeHiddenStatesCall(invocation)
  const { input } = call
  if (input.embeddingGenerate === "stream") return streamedStates(url, call, invocation, context)
  const body = promptEmbeddingsBody(call, context, context.receivers, {
    source: input.embeddingSource ?? "embed_tokens",
    ...(input.embeddingGenerate === true ? { generate: generationOf(input) } : {})
  })
  const response = await post(`${url}/v1/cornserve/prompt-embeddings`, PromptEmbeddingsRequest, body, context)
  const { shape, completion } = decodeAnswer(PromptEmbeddingsResponse)(await response.json())
  return {
    output: {
      ...(invocation.output as object),
      shape,
      dtype: "float32",
      ...(completion === undefined
        ? {}
        : {
            completion: {
              text: completion.text,
              tokenIds: completion.token_ids,
              finishReason: completion.finish_reason
            }
          })
    }
  }
}

const decodeStatesLine = decodeAnswer(Schema.parseJson(StatesLine))

/**
 * LLMEmbeddingTask's generate "stream": the call answers once the prompt's hidden states are sent
 * (their shape), and goes on while the generation streams the rest and its text to the talker
 * (`goesOn`), until its last line, which says what was generated.
 */
const streamedStates = async (
  url: string,
  call: ReturnType<typeof decodeHiddenStatesCall>,
  invocation: TaskInvocationWire,
  context: CallContext
): Promise<CallResult> => {
  const { input, output } = call
  const readers = (id: string) => context.receiversOf?.(id) ?? context.receivers
  const body = promptEmbeddingsBody(call, context, readers(output.embeddings), {
    source: "hidden_states",
    generate: {
      ...generationOf(input),
      stream: true,
      ...(output.transcript === undefined
        ? {}
        : { transcript: { id: output.transcript, receivers: readers(output.transcript) } })
    }
  })
  const response = await post(`${url}/v1/cornserve/prompt-embeddings`, PromptEmbeddingsRequest, body, context)
  const lines = responseLines(response)[Symbol.asyncIterator]()
  const { shape } = await lines
    .next()
    .then((first) => {
      if (first.done === true) throw new Error("the executor's answer ended before the prompt's hidden states")
      return decodeAnswer(Schema.parseJson(PromptEmbeddingsResponse))(first.value)
    })
    .catch(async (error: unknown) => {
      await lines.return?.()
      throw error
    })
  const goesOn = (async () => {
    try {
      for (let line = await lines.next(); line.done !== true; line = await lines.next()) {
        if (line.value.trim().length === 0) continue
        const parsed = decodeStatesLine(line.value)
        if ("error" in parsed) {
          const failure = decodeStreamError(line.value)
          throw Either.isRight(failure) ? remoteError(failure.right.error, fromExecutor) : new Error(line.value)
        }
        return
      }
      throw new Error("the executor's answer ended before the generation did")
    } finally {
      await lines.return?.()
    }
  })()
  return { output: { ...(invocation.output as object), shape, dtype: "float32" }, goesOn }
}

const decodeKvPrefillCall = decodeInvocation(
  Schema.Struct({
    config: LLMConfig,
    input: ChatInput,
    output: Schema.Struct({ kv: ForwardedId, embeddings: Schema.optional(Schema.Array(ForwardedId)) })
  })
)

/**
 * A PrefillLLMTask's call: the prompt prefilled, its KV cache sent through the sidecar under the
 * output's id, and the embeddings it took sent on under the output's own ids, for the decode task.
 */
const kvPrefill = async (url: string, invocation: TaskInvocationWire, context: CallContext): Promise<CallResult> => {
  const { config, input, output } = decodeKvPrefillCall(invocation)
  const body: KvPrefillRequest = {
    model: config.model,
    messages: input.messages,
    // The decode executor renders them into the same prompt: the cache must be that prompt's.
    ...(input.tools === undefined || input.tools === null ? {} : { tools: input.tools }),
    ...embeddingRefs(input.cornserveEmbeddings, context),
    ...specialTokensParsed(input.parseSpecialTokensInContent),
    id: output.kv,
    ...(output.embeddings === undefined || output.embeddings.length === 0
      ? {}
      : { forward_embeddings: output.embeddings }),
    receivers: context.receivers
  }
  const response = await post(`${url}/v1/cornserve/kv-prefill`, KvPrefillRequest, body, context)
  decodeAnswer(KvPrefillResponse)(await response.json())
  return { output: invocation.output }
}

const decodeImageTokensCall = decodeInvocation(
  Schema.Struct({ config: LLMConfig, input: LLMImageTokensInput, output: Schema.Struct({ tokens: ForwardedId }) })
)

/** An image's tokens from a text-to-image LLM, sent by the executor through the sidecar under the output's id. */
const imageTokens = async (url: string, invocation: TaskInvocationWire, context: CallContext): Promise<CallResult> => {
  const { config, input, output } = decodeImageTokensCall(invocation)
  const body: ImageTokensRequest = {
    model: config.model,
    prompt: input.prompt,
    id: output.tokens,
    receivers: context.receivers,
    ...(input.guidanceScale === undefined ? {} : { guidanceScale: input.guidanceScale }),
    ...(input.temperature === undefined ? {} : { temperature: input.temperature }),
    ...(input.seed === undefined ? {} : { seed: input.seed })
  }
  const response = await post(`${url}/v1/cornserve/image-tokens`, ImageTokensRequest, body, context)
  decodeAnswer(ImageTokensResponse)(await response.json())
  return { output: invocation.output }
}

const decodeTalkCall = decodeInvocation(
  Schema.Struct({
    config: LLMConfig,
    input: Schema.Struct({ ...TalkerInput.fields, embeddings: ForwardedId, transcript: Schema.optional(ForwardedId) })
  })
)
const decodeTalkLine = decodeAnswer(Schema.parseJson(TalkLine))

/** The frames (and the thinker's text passed on) of a talk answer (NDJSON), until its done line; an error line fails the stream. */
async function* talkFrames(response: ExecutorAnswer): AsyncIterable<TalkerOutput> {
  for await (const line of responseLines(response)) {
    if (line.trim().length === 0) continue
    const parsed = decodeTalkLine(line)
    if ("error" in parsed) {
      const failure = decodeStreamError(line)
      throw Either.isRight(failure) ? remoteError(failure.right.error, fromExecutor) : new Error(line)
    }
    if ("done" in parsed) return
    yield parsed
  }
}

/** A talker's call: the thinker's hidden states from the sidecar, its codec frames streamed back as they are chosen. */
const talk = async (url: string, invocation: TaskInvocationWire, context: CallContext): Promise<CallResult> => {
  const { config, input } = decodeTalkCall(invocation)
  const body: TalkRequest = { model: config.model, ...input }
  const response = await post(`${url}/v1/cornserve/talk`, TalkRequest, body, context)
  return { output: {}, stream: talkFrames(response) }
}

export const llmCalls = {
  talk,
  chat,
  "hidden-states": promptEmbeddings,
  "kv-prefill": kvPrefill,
  "image-tokens": imageTokens
}
