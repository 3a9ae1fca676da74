/**
 * `POST /v1/cornserve/prompt-embeddings`: a prompt's embeddings, sent through the sidecar (or
 * answered inline): the embedding table's rows as the decoder takes them, or the decoder's final
 * hidden states; with `generate`, the messages answered first and the hidden states of the prompt
 * and the answer's tokens. The LLM embedding task's route; the router hands it what it shares
 * with chat completions (the model check, the prompt's building, sampling).
 */
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as Effect from "effect/Effect"
import type { FunctionTool } from "../../app-runtime/schemas/OpenAI.js"
import type { SidecarClient } from "../../sidecar/SidecarClient.js"
import { inSpan } from "../../tracing/Tracing.js"
import type { EngineClient } from "../common/EngineClient.js"
import { BadRequest, ContextLengthExceeded, type MediaError, type ModelNotFound, NoSidecar } from "../common/errors.js"
import { errorAnswer, RequestSpan, workItemContext } from "../common/Router.js"
import {
  type ChatCompletionRequest,
  type ChatMessage,
  type EmbeddingRef,
  PromptEmbeddingsRequest,
  type PromptEmbeddingsResponse,
  type PromptGeneration
} from "./api.js"
import { Generation } from "./Generation.js"
import { streamedStates } from "./StreamedStates.js"
import { type MediaPart, mediaParts } from "./Prompt.js"
import type { EmbedResult, LlmRequestMeta, PromptInput, SamplingParams } from "./protocol.js"
import type { Detokenizer } from "./TextStream.js"

/** What a completion's sampling is read from: a chat request's fields, or prompt-embeddings' `generate`. */
export type SamplingFields = Pick<
  ChatCompletionRequest,
  | "max_completion_tokens"
  | "max_tokens"
  | "temperature"
  | "top_p"
  | "top_k"
  | "repetition_penalty"
  | "presence_penalty"
  | "frequency_penalty"
  | "logprobs"
  | "top_logprobs"
  | "seed"
  | "ignore_eos"
>

/** What a prompt is built from: a chat's messages, or a plain text. */
export type PromptSource =
  | {
      readonly messages: ReadonlyArray<ChatMessage>
      readonly addGenerationPrompt: boolean
      readonly tools?: ReadonlyArray<FunctionTool>
      readonly trusted: boolean
    }
  | { readonly text: string }

/** What the route shares with the router's chat completions. */
export interface PromptEmbeddingsContext {
  readonly engine: EngineClient
  readonly tokenizer: Detokenizer
  /** This node's sidecar, where embeddings go by default; none: inline answers only. */
  readonly sidecar: SidecarClient | undefined
  readonly maxModelLength: number
  readonly checkModel: (name: string | undefined) => Effect.Effect<void, ModelNotFound>
  readonly checkMedia: (
    parts: ReadonlyArray<MediaPart>,
    refs: ReadonlyArray<EmbeddingRef> | undefined,
    maxPromptTokens: number
  ) => Effect.Effect<void, MediaError | ContextLengthExceeded>
  readonly buildPrompt: (
    source: PromptSource,
    refs: ReadonlyArray<EmbeddingRef> | undefined,
    maxTokens: number,
    mmProcessorKwargs: undefined,
    signal: AbortSignal
  ) => Promise<PromptInput>
  readonly sampling: (fields: SamplingFields, promptTokens: number) => SamplingParams
}

/** `run`'s signal aborts when the request ends. */
const attempt = <A>(run: (signal: AbortSignal) => Promise<A>) =>
  Effect.tryPromise({ try: run, catch: (error) => error })
const check = <A>(run: () => A) => Effect.try({ try: run, catch: (error) => error })

export const promptEmbeddingsRoute = ({
  engine,
  tokenizer,
  sidecar,
  maxModelLength,
  checkModel,
  checkMedia,
  buildPrompt,
  sampling
}: PromptEmbeddingsContext) => {
  const sidecarNode = sidecar?.nodeId
  /** How prompt-embeddings' `generate` samples: greedy unless it says. */
  const generationParams = (prompt: PromptInput, asked: PromptGeneration) =>
    check(() =>
      sampling(
        {
          ...(asked.max_tokens === undefined ? {} : { max_tokens: asked.max_tokens }),
          temperature: asked.temperature ?? 0,
          ...(asked.seed === undefined ? {} : { seed: asked.seed })
        },
        prompt.inputIds.length
      )
    )

  /** A completion of `prompt` whose tokens its hidden states then run over too (prompt-embeddings' `generate`). */
  const completeFirst = (prompt: PromptInput, asked: PromptGeneration) =>
    Effect.gen(function* () {
      const params = yield* generationParams(prompt, asked)
      const generation = new Generation(engine, { op: "generate", prompt, sampling: params }, tokenizer, [], [], {
        ...(yield* workItemContext)
      })
      const { outcome, tokens } = yield* attempt(() => generation.tokens()).pipe(
        Effect.onInterrupt(() => Effect.sync(() => generation.cancel()))
      )
      return { text: generation.text, tokens, finishReason: outcome.finishReason }
    })

  return Effect.gen(function* () {
    const body = yield* HttpServerRequest.schemaBodyJson(PromptEmbeddingsRequest)
    yield* checkModel(body.model)
    yield* checkMedia(
      body.messages === undefined ? [] : mediaParts(body.messages),
      body.cornserve_embeddings,
      maxModelLength
    )
    if ((body.messages === undefined) === (body.prompt === undefined))
      return yield* new BadRequest({ message: "give either messages or prompt" })
    if (body.generate !== undefined && body.source !== "hidden_states")
      return yield* new BadRequest({
        message: 'generate gives the hidden states of what it generates: ask for source "hidden_states"'
      })
    const inline = body.return === "inline"
    if (!inline && sidecarNode === undefined) return yield* new NoSidecar()
    const span = yield* RequestSpan
    const prompt = yield* attempt((signal) =>
      inSpan("prompt", { parent: span }, () =>
        buildPrompt(
          body.messages === undefined
            ? { text: body.prompt! }
            : {
                messages: body.messages,
                addGenerationPrompt: body.add_generation_prompt || body.generate !== undefined,
                trusted: body.cornserve_parse_special_tokens === true
              },
          body.cornserve_embeddings,
          maxModelLength,
          undefined,
          signal
        )
      )
    )
    if (prompt.inputIds.length > maxModelLength) {
      return yield* new ContextLengthExceeded({
        message: `this model's maximum context length is ${maxModelLength} tokens; the prompt takes ${prompt.inputIds.length}`
      })
    }
    const receivers = body.receivers ?? (sidecarNode === undefined ? [] : [sidecarNode])
    if (body.generate?.stream === true) {
      if (inline)
        return yield* new BadRequest({ message: 'streamed hidden states go through the sidecar, not "inline"' })
      return yield* streamedStates({
        engine,
        tokenizer,
        sidecar,
        prompt,
        sampling: yield* generationParams(prompt, body.generate),
        id: body.id,
        receivers,
        transcript: body.generate.transcript,
        itemContext: yield* workItemContext
      })
    }
    const completion = body.generate === undefined ? undefined : yield* completeFirst(prompt, body.generate)
    const meta: LlmRequestMeta = {
      op: "embed",
      prompt:
        completion === undefined
          ? prompt
          : { ...prompt, inputIds: Int32Array.from([...prompt.inputIds, ...completion.tokens]) },
      id: body.id,
      source: body.source,
      receivers,
      inline
    }
    const result = yield* engine.runOne<EmbedResult>({
      key: meta.op,
      inputs: {},
      meta,
      ...(yield* workItemContext)
    })
    const answer: PromptEmbeddingsResponse = {
      id: body.id,
      source: body.source,
      dtype: "float32",
      shape: result.shape!,
      ...(result.embedding === undefined ? {} : { embedding: Array.from(result.embedding) }),
      ...(completion === undefined
        ? {}
        : {
            completion: {
              text: completion.text,
              token_ids: completion.tokens,
              finish_reason: completion.finishReason
            }
          })
    }
    return HttpServerResponse.unsafeJson(answer)
  }).pipe(Effect.catchAll(errorAnswer))
}
