import { randomInt } from "node:crypto"
import * as Effect from "effect/Effect"
import type { FunctionTool, MediaProcessorOptions, RawPrompt } from "../../app-runtime/schemas/OpenAI.js"
import type { GenerationConfig } from "../../models/GenerationConfig.js"
import type { ModelDirectory } from "../../models/ModelDirectory.js"
import { type LiteralPrompt, type Marker, type Marks, unmark } from "../../models/SpecialTokenText.js"
import { ChatTemplateError, type ChatTokenizer } from "../../models/Tokenizer.js"
import { BadRequest, ContextLengthExceeded, EmptyPrompt } from "../common/errors.js"
import type { ExecutorConfig } from "../common/ExecutorConfig.js"
import { checkMediaItemCount } from "../common/media/MediaLimits.js"
import type { ThreadPool } from "../common/ThreadPool.js"
import type { ChatMessage, EmbeddingRef } from "./api.js"
import type { MediaInputs } from "./MediaInputs.js"
import { markClientTexts, type MediaPart, mediaParts, PromptError, templateMessages } from "./Prompt.js"
import type { PromptSource, SamplingFields } from "./PromptEmbeddingsRoute.js"
import { bytesPerToken, fewestTokens } from "./PromptBytes.js"
import type { PromptInput, SamplingParams } from "./protocol.js"

/**
 * What the LLM router makes of a request before the engine sees it: the prompt's token ids with
 * its media laid out (a chat rendered by the model's template, the client's texts kept as text; a
 * raw prompt; a continuation of another executor's tokens), bounded by the context first by its
 * bytes, and the sampling parameters with the model's generation defaults.
 */
export interface PromptBuilderContext {
  readonly config: ExecutorConfig
  readonly model: ModelDirectory
  readonly tokenizer: ChatTokenizer
  readonly media: MediaInputs
  readonly threads: ThreadPool
  readonly maxModelLength: number
  readonly generation: GenerationConfig
}

export const promptBuilder = (context: PromptBuilderContext) => {
  const { config, model, tokenizer, media, threads, maxModelLength, generation } = context
  const stopTokenIds = generation.eosTokenIds
  const defaults = generation.sampling

  /**
   * The chat template over the messages, with the client's texts in them and in the tools
   * marked by `marker` when one is given, so that the special tokens they spell stay text; a
   * template that refuses them (or none at all) is the request's problem.
   */
  const renderChat = (
    messages: ReadonlyArray<ChatMessage>,
    addGenerationPrompt: boolean,
    tools: ReadonlyArray<FunctionTool> | undefined,
    marker: Marker | undefined
  ): string => {
    const clientMessages = marker === undefined ? messages : markClientTexts(messages, marker.text)
    const clientTools = tools === undefined || marker === undefined ? tools : marker.value(tools)
    try {
      return tokenizer.applyChatTemplate(templateMessages(clientMessages, media.mediaText), {
        addGenerationPrompt,
        ...(clientTools === undefined ? {} : { tools: clientTools })
      })
    } catch (error) {
      if (!(error instanceof ChatTemplateError)) throw error
      throw new PromptError(
        `the model's chat template (${error.template}) cannot render these messages: ${error.reason}`
      )
    }
  }

  /** The most bytes of a text one token stands for, if the tokenizer bounds it (PromptBytes.ts). */
  const perToken = bytesPerToken(model.tokenizer!.json as Record<string, unknown>, model.tokenizer!.rawConfig)

  /**
   * Refuses a prompt that certainly takes more than `maxTokens` tokens, by its length in bytes
   * alone: before it is tokenized.
   */
  const checkPromptBytes = (text: string, maxTokens: number) => {
    if (perToken === undefined) return
    const bytes = Buffer.byteLength(text, "utf8")
    const fewest = fewestTokens(bytes, perToken)
    if (fewest > maxTokens) {
      throw new ContextLengthExceeded({
        message: `this model's maximum context length is ${maxModelLength} tokens; the prompt (${bytes} bytes) takes at least ${fewest}, as no token stands for more than ${perToken} bytes, and it may take ${maxTokens}`
      })
    }
  }

  /** Prompts longer than this (UTF-16 units) are tokenized in a thread, shorter ones here. */
  const tokenizedHere = 8192

  const encode = async (prompt: LiteralPrompt, addSpecialTokens: boolean): Promise<ReadonlyArray<number>> =>
    prompt.text.length <= tokenizedHere
      ? tokenizer.encodePrompt(prompt, { addSpecialTokens })
      : Array.from(await threads.run<Int32Array>("tokenize", { modelDir: config.modelDir, prompt, addSpecialTokens }))

  /**
   * The prompt a chat request (or a plain text) runs: ids with expanded placeholders, media rows
   * to splice. It may take `maxTokens` tokens at most, which its bytes are checked against first.
   */
  const buildPrompt = async (
    source: PromptSource,
    refs: ReadonlyArray<EmbeddingRef> | undefined,
    maxTokens: number,
    processor?: MediaProcessorOptions,
    signal?: AbortSignal
  ): Promise<PromptInput> => {
    let text =
      "messages" in source
        ? renderChat(source.messages, source.addGenerationPrompt, source.tools, undefined)
        : source.text
    // The prompt as the model reads it is measured before the client's texts are scanned for special tokens.
    checkPromptBytes(text, maxTokens)
    let marks: Marks = { nonce: "", contents: [] }
    if ("messages" in source && !source.trusted) {
      const marker = tokenizer.specials.marker()
      text = renderChat(source.messages, source.addGenerationPrompt, source.tools, marker)
      marks = marker.marks
    }
    const parts = "messages" in source ? mediaParts(source.messages) : []
    const resolved = await media.resolve(parts, refs, processor, signal)
    const prompt = unmark(media.promptText(text, resolved), marks)
    const { inputIds, spans, rope } = media.layout(await encode(prompt, false), resolved)
    if (inputIds.length === 0) throw new EmptyPrompt()
    return { inputIds, media: spans, ...(rope === undefined ? {} : { rope }) }
  }

  const sampling = (body: SamplingFields, promptTokens: number): SamplingParams => {
    if (promptTokens >= maxModelLength) {
      throw new ContextLengthExceeded({
        message: `this model's maximum context length is ${maxModelLength} tokens; the messages take ${promptTokens}`
      })
    }
    const asked = body.max_completion_tokens ?? body.max_tokens ?? undefined
    const maxNewTokens =
      asked ?? Math.min(generation.maxNewTokens(promptTokens) ?? Infinity, maxModelLength - promptTokens)
    if (promptTokens + maxNewTokens > maxModelLength) {
      throw new ContextLengthExceeded({
        message: `this model's maximum context length is ${maxModelLength} tokens; ${promptTokens + maxNewTokens} were asked for (${promptTokens} in the messages, ${maxNewTokens} in the completion)`
      })
    }
    return {
      temperature: body.temperature ?? defaults.temperature,
      topP: body.top_p ?? defaults.topP,
      topK: body.top_k === undefined || body.top_k === null ? defaults.topK : Math.max(body.top_k, 0),
      repetitionPenalty: body.repetition_penalty ?? defaults.repetitionPenalty,
      ...(body.presence_penalty == null ? {} : { presencePenalty: body.presence_penalty }),
      ...(body.frequency_penalty == null ? {} : { frequencyPenalty: body.frequency_penalty }),
      ...(body.logprobs === true ? { logprobs: body.top_logprobs ?? 0 } : {}),
      seed: body.seed ?? randomInt(2 ** 31),
      maxNewTokens,
      stopTokenIds: body.ignore_eos === true ? [] : stopTokenIds
    }
  }

  /**
   * The prompt of a completion that goes on from `tokens` another executor generated: they
   * follow the generation prompt, and its budget of new tokens shrinks by as many.
   */
  const continuing = (
    prompt: PromptInput,
    params: SamplingParams,
    tokens: ReadonlyArray<number>
  ): { readonly prompt: PromptInput; readonly sampling: SamplingParams } => {
    const vocabulary = model.decoder!.vocabSize
    const foreign = tokens.find((token) => token >= vocabulary)
    if (foreign !== undefined)
      throw new BadRequest({
        message: `token ${foreign} of the continuation is not in the vocabulary (${vocabulary})`
      })
    if (tokens.length >= params.maxNewTokens)
      throw new BadRequest({
        message: `the continuation has ${tokens.length} tokens, the completion's whole budget is ${params.maxNewTokens}`
      })
    const inputIds = new Int32Array(prompt.inputIds.length + tokens.length)
    inputIds.set(prompt.inputIds)
    inputIds.set(tokens, prompt.inputIds.length)
    return {
      prompt: { ...prompt, inputIds },
      sampling: { ...params, maxNewTokens: params.maxNewTokens - tokens.length }
    }
  }

  /** A prompt given as it is (`/v1/completions`): a text tokenized with the model's own special tokens, or token ids. */
  const rawPrompt = async (raw: RawPrompt, maxTokens: number): Promise<PromptInput> => {
    if (typeof raw === "string") {
      checkPromptBytes(raw, maxTokens)
      const inputIds = Int32Array.from(await encode({ text: raw, literals: [] }, true))
      if (inputIds.length === 0) throw new EmptyPrompt()
      return { inputIds, media: [] }
    }
    const vocabulary = model.decoder!.vocabSize
    const foreign = raw.find((token) => token >= vocabulary)
    if (foreign !== undefined)
      throw new BadRequest({ message: `token ${foreign} of the prompt is not in the vocabulary (${vocabulary})` })
    return { inputIds: Int32Array.from(raw), media: [] }
  }

  /** Prompt rows a media part takes when the model embeds it itself: known from its config, before decoding. */
  const encodedRows: Readonly<Record<MediaPart["modality"], number | undefined>> = {
    image: model.config.image_seq_length,
    audio: model.config.audio_seq_length,
    video: undefined
  }

  /**
   * Refuses, before any media is read or decoded, a request with too many media parts, or whose
   * media alone take more than `maxPromptTokens` positions. Rows of sidecar embeddings are known
   * only once they arrive, so those are counted after.
   */
  const checkMedia = (
    parts: ReadonlyArray<MediaPart>,
    refs: ReadonlyArray<EmbeddingRef> | undefined,
    maxPromptTokens: number
  ) =>
    Effect.gen(function* () {
      yield* checkMediaItemCount(parts.length, config.maxMediaItems)
      if (refs !== undefined) return
      const rows = parts.reduce((sum, part) => sum + (encodedRows[part.modality] ?? 0), 0)
      if (rows > maxPromptTokens) {
        return yield* new ContextLengthExceeded({
          message: `this model's maximum context length is ${maxModelLength} tokens; the ${parts.length} media parts alone take ${rows}`
        })
      }
    })

  return { buildPrompt, rawPrompt, sampling, continuing, checkMedia }
}
