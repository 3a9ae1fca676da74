/**
 * The LLM executor's router: the OpenAI chat-completions surface, and prompt embeddings for
 * generators. Requests are checked, rendered and tokenized here, their media preprocessed (or their
 * embeddings taken from the sidecar), and tokens turned back into text and OpenAI chunks; the
 * engine sees only token ids and tensors. A Janus-Pro model, served for image generation, has its
 * own routes (JanusImageTokens.ts), as has a talker, which writes codec frames (TalkerRoutes.ts).
 *
 * The event loop streams every request's tokens, so what may take long is bounded first and done
 * in the router's threads (preprocess.ts): a schema is measured before its thread compiles it, a
 * prompt refused by its length in bytes when it certainly takes more tokens than the context
 * holds, and a long prompt tokenized in a thread.
 */
import { randomUUID } from "node:crypto"
import { relative } from "node:path"
import * as HttpRouter from "@effect/platform/HttpRouter"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as Effect from "effect/Effect"
import * as Stream from "effect/Stream"
import { decoderFiles } from "../../models/DecoderLayout.js"
import { GenerationConfig } from "../../models/GenerationConfig.js"
import { isJanus } from "../../models/JanusModel.js"
import { isTalker } from "../../models/TalkerModel.js"
import { loadModelDirectory } from "../../models/ModelDirectory.js"
import { ChatTokenizer } from "../../models/Tokenizer.js"
import { SidecarClient } from "../../sidecar/SidecarClient.js"
import { BadRequest } from "../common/errors.js"
import {
  answeredFailure,
  errorAnswer,
  errorBody,
  RequestSpan,
  type RouterKind,
  workItemContext
} from "../common/Router.js"
import { inSpan } from "../../tracing/Tracing.js"
import type { ChoiceLogprobs, TokenLogprob } from "../../app-runtime/schemas/OpenAI.js"
import {
  type ChatCompletion,
  type ChatCompletionChunk,
  ChatCompletionRequest,
  type FinishReason,
  type LlmChunk,
  type LlmStats,
  type Usage
} from "./api.js"
import type { ResponseFormat } from "./Constraints.js"
import { type GeneratedToken, Generation, type Outcome } from "./Generation.js"
import {
  type AnswerDelta,
  type AnswerMode,
  AnswerShaper,
  anyCallSchema,
  parametersSchema,
  toolCallFormatOf
} from "./ToolCalls.js"
import { janusRouter } from "./JanusImageTokens.js"
import { talkerRouter } from "./TalkerRoutes.js"
import { modelRoutes } from "./ModelRoutes.js"
import { type KvTransferContext, kvPrefillRoute, receiveKv, releaseKv } from "./KvTransferRoutes.js"
import { promptEmbeddingsRoute } from "./PromptEmbeddingsRoute.js"
import { contextLength, kvBudget } from "./Limits.js"
import { makeMediaInputs } from "./MediaInputs.js"
import { promptBuilder } from "./PromptBuilder.js"
import { mediaParts } from "./Prompt.js"
import type { GenerateMeta } from "./protocol.js"
import { checkSchemaBounds, SchemaTooLarge } from "./structured/SchemaBounds.js"

const sseLine = (data: unknown) =>
  new TextEncoder().encode(`data: ${typeof data === "string" ? data : JSON.stringify(data)}\n\n`)

export const routerKind: RouterKind = {
  preprocessModule: new URL("./preprocess.js", import.meta.url).href,
  make: ({ config, engine, pool }) =>
    Effect.gen(function* () {
      const model = yield* Effect.tryPromise({
        try: () => loadModelDirectory(config.modelDir),
        catch: (error) => error as Error
      })
      if (isJanus(model)) return yield* janusRouter(config, engine, model)
      if (isTalker(model)) return yield* talkerRouter(config, engine, model)
      if (model.decoder === undefined) {
        return yield* Effect.fail(
          new Error(`${config.model} is not a decoder model: its config.json (or text_config) has no vocab_size`)
        )
      }
      const files = yield* Effect.try({
        try: () => decoderFiles(model, config.dtype),
        catch: (error) => error as Error
      })
      const decoder: NonNullable<LlmStats["decoder"]> = {
        file: relative(model.path, files.decoder),
        dtype: files.dtype,
        ...(files.dtype.startsWith("q4") ? { q4Activations: config.q4Activations ?? "exported" } : {})
      }
      yield* Effect.logInfo(
        `${config.model}: ${files.layout} layout at ${files.dtype}${config.dtype === undefined ? " (default)" : ""}, running ${decoder.file}` +
          (decoder.q4Activations === "int8" ? ", its 4-bit products with int8 activations (--q4-activations int8)" : "")
      )
      const tokenizer = yield* Effect.try({ try: () => new ChatTokenizer(model), catch: (error) => error as Error })
      const sidecar =
        config.sidecarSocket === undefined
          ? undefined
          : yield* Effect.acquireRelease(
              Effect.tryPromise({
                try: () => SidecarClient.connect(config.sidecarSocket!),
                catch: (error) => error as Error
              }),
              (client) => Effect.promise(() => client.close())
            )
      const threads = pool!
      const media = makeMediaInputs({ config, model, pool: threads, sidecar })
      const maxModelLength = contextLength(model)
      const generation = yield* Effect.try({ try: () => GenerationConfig.of(model), catch: (error) => error as Error })
      const { checkModel, models, stats } = modelRoutes(config.model, engine, maxModelLength, { decoder })

      const { buildPrompt, rawPrompt, sampling, continuing, checkMedia } = promptBuilder({
        config,
        model,
        tokenizer,
        media,
        threads,
        maxModelLength,
        generation
      })

      /** `run`'s signal aborts when the request ends. */
      const attempt = <A>(run: (signal: AbortSignal) => Promise<A>) =>
        Effect.tryPromise({ try: run, catch: (error) => error })
      const check = <A>(run: () => A) => Effect.try({ try: run, catch: (error) => error })

      /** A token as OpenAI's logprobs spell it: its text alone, and that text's UTF-8 bytes. */
      const tokenTexts = new Map<number, { readonly token: string; readonly bytes: ReadonlyArray<number> }>()
      const tokenText = (id: number) => {
        let known = tokenTexts.get(id)
        if (known === undefined) {
          const token = tokenizer.decode([id])
          known = { token, bytes: Array.from(Buffer.from(token, "utf8")) }
          tokenTexts.set(id, known)
        }
        return known
      }
      const logprobsContent = (tokens: ReadonlyArray<GeneratedToken>): ChoiceLogprobs => ({
        content: tokens.map((generated) => {
          const top: Array<TokenLogprob["top_logprobs"][number]> = []
          for (let i = 0; i + 1 < generated.top.length; i += 2)
            top.push({ ...tokenText(generated.top[i]!), logprob: generated.top[i + 1]! })
          return { ...tokenText(generated.token), logprob: generated.logprob, top_logprobs: top }
        })
      })

      const toolCallFormat = toolCallFormatOf(tokenizer.chatTemplateSource())

      /**
       * What a request's tools and response format ask of its answers: the mode each choice's text
       * is read in, and the JSON format its tokens are held to (if any).
       */
      const answerPlan = (
        body: ChatCompletionRequest
      ): { readonly mode: AnswerMode; readonly format: ResponseFormat | undefined } => {
        const tools = body.tools ?? []
        const choice = body.tool_choice ?? (tools.length > 0 ? "auto" : "none")
        const asked = body.response_format ?? undefined
        const format: ResponseFormat | undefined =
          asked === undefined || asked.type === "text"
            ? undefined
            : asked.type === "json_object"
              ? { type: "json_object" }
              : { type: "json_schema", json_schema: asked.json_schema }
        if (choice !== "none" && tools.length === 0)
          throw new BadRequest({ message: "tool_choice needs tools: the request has none" })
        const plan = ((): { readonly mode: AnswerMode; readonly format: ResponseFormat | undefined } => {
          if (choice === "none") return { mode: { kind: "text" }, format }
          if (format !== undefined)
            throw new BadRequest({
              message: "response_format cannot be held to while the model may call tools; set tool_choice to none"
            })
          if (choice === "auto") {
            if (toolCallFormat === undefined)
              throw new BadRequest({
                message:
                  "this model's chat template takes no tools, or writes calls in a way the platform does not read (it reads Hermes and Qwen's <tool_call> and Llama 3.1's JSON); name a function in tool_choice or use required"
              })
            return { mode: { kind: "parse", format: toolCallFormat }, format: undefined }
          }
          if (choice === "required") {
            const schema = anyCallSchema(
              tools.map((tool) => ({ name: tool.function.name, parameters: tool.function.parameters }))
            )
            return {
              mode: { kind: "any" },
              format: { type: "json_schema", json_schema: { name: "tool_call", schema } }
            }
          }
          const named = tools.find((tool) => tool.function.name === choice.function.name)
          if (named === undefined)
            throw new BadRequest({
              message: `tool_choice names ${JSON.stringify(choice.function.name)}, which is not among the request's tools`
            })
          return {
            mode: { kind: "named", name: named.function.name },
            format: {
              type: "json_schema",
              json_schema: {
                name: named.function.name,
                schema: parametersSchema(named.function.parameters),
                strict: named.function.strict ?? null
              }
            }
          }
        })()
        return plan
      }

      /**
       * What the worker's decoder would refuse of a format (a schema, or a tokenizer that cannot
       * spell every byte) is the request's 400, not a failed step for its batch: the schema is
       * measured here, and compiled in a thread, as the worker will compile it.
       */
      const checkFormat = (format: ResponseFormat | undefined) =>
        Effect.gen(function* () {
          if (format === undefined) return
          if (format.type === "json_schema") {
            yield* Effect.try({
              try: () => checkSchemaBounds(format.json_schema.schema),
              catch: (error) =>
                error instanceof SchemaTooLarge
                  ? new BadRequest({ message: `the schema cannot be held to: ${error.message}` })
                  : error
            })
          }
          const refusal = yield* attempt(() =>
            threads.run<string | undefined>("checkFormat", { modelDir: config.modelDir, format })
          )
          if (refusal !== undefined) return yield* new BadRequest({ message: refusal })
        })

      const chatCompletions = Effect.gen(function* () {
        const body = yield* HttpServerRequest.schemaBodyJson(ChatCompletionRequest)
        yield* checkModel(body.model)
        if (body.top_logprobs != null && body.logprobs !== true)
          return yield* new BadRequest({ message: "top_logprobs needs logprobs: true" })
        if (body.modalities?.includes("audio") === true)
          return yield* new BadRequest({
            message: `${config.model} answers text: a spoken answer (modalities "audio") comes from an app whose talker speaks the text (a TalkerTask)`
          })
        const choices = body.n ?? 1
        const continued = body.cornserve_continuation?.token_ids ?? []
        if (choices > 1 && continued.length > 0)
          return yield* new BadRequest({ message: "a continuation goes on with one choice; n must be 1" })
        const raw = body.cornserve_prompt
        const plan = yield* check(() => answerPlan(body))
        yield* checkFormat(plan.format)
        const tools = body.tools ?? undefined
        // A prompt must leave at least one position for the completion.
        const maxPromptTokens = maxModelLength - 1
        if (raw === undefined) yield* checkMedia(mediaParts(body.messages), body.cornserve_embeddings, maxPromptTokens)
        const span = yield* RequestSpan
        // The prompt's media: decoded here, or their embeddings taken from the sidecar.
        const asked = yield* attempt((signal) =>
          inSpan("prompt", { parent: span }, async () =>
            raw === undefined
              ? buildPrompt(
                  {
                    messages: body.messages,
                    addGenerationPrompt: true,
                    ...(tools === undefined ? {} : { tools }),
                    trusted: body.cornserve_parse_special_tokens === true
                  },
                  body.cornserve_embeddings,
                  maxPromptTokens,
                  body.mm_processor_kwargs,
                  signal
                )
              : rawPrompt(raw, maxPromptTokens)
          )
        )
        const sampled = yield* check(() => sampling(body, asked.inputIds.length))
        const params = plan.format === undefined ? sampled : { ...sampled, format: plan.format }
        const { prompt, sampling: samplingParams } =
          continued.length === 0
            ? { prompt: asked, sampling: params }
            : yield* check(() => continuing(asked, params, continued))
        // Its KV cache, which a prefill executor sent (cornserve_kv): the request starts from it as it joins.
        const kv =
          body.cornserve_kv === undefined ? undefined : yield* receiveKv(kvContext, prompt, body.cornserve_kv.id)
        const stops =
          body.stop === undefined || body.stop === null ? [] : typeof body.stop === "string" ? [body.stop] : body.stop
        const context = yield* workItemContext
        // Each choice is a request of its own to the engine, drawn with its own seed: seed + its index.
        const generations = Array.from({ length: choices }, (_, index) => {
          const meta: GenerateMeta = {
            op: "generate",
            prompt,
            sampling: index === 0 ? samplingParams : { ...samplingParams, seed: samplingParams.seed + index },
            ...(kv === undefined ? {} : { kv })
          }
          return new Generation(engine, meta, tokenizer, stops, continued, context)
        })
        const cancelled = new AbortController()
        releaseKv(kvContext, kv, generations, cancelled.signal)
        const cancelAll = () => {
          for (const generation of generations) generation.cancel()
          cancelled.abort()
        }
        const id = `chatcmpl-${randomUUID()}`
        const now = Math.floor(Date.now() / 1000)
        const withLogprobs = body.logprobs === true
        const shapers = generations.map(() => new AnswerShaper(plan.mode))
        /** A choice that called a tool and ended by itself ended for its calls. */
        const finishOf = (called: boolean, outcome: Outcome): FinishReason =>
          called && outcome.finishReason === "stop" ? "tool_calls" : outcome.finishReason
        const usage = (outcomes: ReadonlyArray<Outcome>): Usage => {
          const promptTokens = prompt.inputIds.length - continued.length
          const completionTokens = outcomes.reduce((sum, outcome) => sum + outcome.completionTokens, 0)
          return {
            prompt_tokens: promptTokens,
            completion_tokens: completionTokens,
            total_tokens: promptTokens + completionTokens
          }
        }

        if (body.stream !== true) {
          const outcomes = yield* attempt(() => Promise.all(generations.map((generation) => generation.done))).pipe(
            Effect.onInterrupt(() => Effect.sync(cancelAll)),
            Effect.tapError(() => Effect.sync(cancelAll))
          )
          const completion: ChatCompletion = {
            id,
            object: "chat.completion",
            created: now,
            model: config.model,
            choices: generations.map((generation, index) => {
              const answer = shapers[index]!.whole(generation.text)
              return {
                index,
                message: {
                  role: "assistant",
                  content: answer.content,
                  ...(answer.calls.length === 0
                    ? {}
                    : {
                        tool_calls: answer.calls.map((call) => ({
                          id: call.id,
                          type: "function" as const,
                          function: { name: call.name, arguments: call.arguments }
                        }))
                      })
                },
                finish_reason: finishOf(answer.calls.length > 0, outcomes[index]!),
                logprobs: withLogprobs ? logprobsContent(generation.logprobs) : null
              }
            }),
            usage: usage(outcomes)
          }
          return HttpServerResponse.unsafeJson(completion)
        }

        // The answer starts with every choice's first token, so that a request the engine refuses gets its status.
        yield* Effect.promise(() => Promise.all(generations.map((generation) => generation.started))).pipe(
          Effect.onInterrupt(() => Effect.sync(cancelAll))
        )
        const failure = generations.find((generation) => generation.failure !== undefined)?.failure
        if (failure !== undefined) {
          cancelAll()
          return yield* Effect.fail(failure)
        }
        const includeUsage = body.stream_options?.include_usage === true
        // Token ids let the dispatcher carry a broken stream on: a single choice of plain text can be.
        const withTokens =
          body.cornserve_token_ids === true && choices === 1 && plan.mode.kind === "text" && plan.format === undefined
        const chunk = (
          index: number,
          delta: ChatCompletionChunk["choices"][number]["delta"],
          finishReason: FinishReason | null,
          tokens: ReadonlyArray<number> = [],
          logprobs: ReadonlyArray<GeneratedToken> = []
        ): LlmChunk => ({
          id,
          object: "chat.completion.chunk",
          created: now,
          model: config.model,
          choices: [
            {
              index,
              delta,
              finish_reason: finishReason,
              logprobs: withLogprobs && logprobs.length > 0 ? logprobsContent(logprobs) : null
            }
          ],
          ...(includeUsage ? { usage: null } : {}),
          ...(withTokens ? { cornserve_token_ids: tokens } : {})
        })
        const events = Stream.async<Uint8Array>((emit) => {
          const outcomes: Array<Outcome> = []
          let ended = false
          const close = (last: ReadonlyArray<unknown>) => {
            if (ended) return
            ended = true
            for (const line of last) void emit.single(sseLine(line))
            void emit.single(sseLine("[DONE]"))
            void emit.end()
          }
          generations.forEach((generation, index) => {
            // A continuation goes on with a stream whose role chunk its client has seen.
            if (continued.length === 0)
              void emit.single(sseLine(chunk(index, { role: "assistant", content: "" }, null)))
            const shaper = shapers[index]!
            const say = (
              deltas: ReadonlyArray<AnswerDelta>,
              tokens: ReadonlyArray<number> = [],
              logprobs: ReadonlyArray<GeneratedToken> = []
            ) => {
              deltas.forEach((delta, at) => {
                const said = "content" in delta ? { content: delta.content } : { tool_calls: delta.toolCalls }
                // A chunk's tokens and their logprobs go with its first piece.
                void emit.single(sseLine(chunk(index, said, null, at === 0 ? tokens : [], at === 0 ? logprobs : [])))
              })
            }
            say(shaper.start())
            generation.subscribe({
              text: (text, tokens, logprobs) => {
                if (!ended) say(shaper.push(text), tokens, logprobs)
              },
              end: (outcome) => {
                if (ended) return
                say(shaper.end())
                void emit.single(sseLine(chunk(index, {}, finishOf(shaper.called, outcome), generation.takeUnsaid())))
                outcomes.push(outcome)
                if (outcomes.length < generations.length) return
                close(includeUsage ? [{ ...chunk(0, {}, null), choices: [], usage: usage(outcomes) }] : [])
              },
              error: (failure) => {
                cancelAll()
                close([errorBody(Effect.runSync(answeredFailure(failure)))])
              }
            })
          })
          return Effect.sync(cancelAll)
        })
        return HttpServerResponse.stream(events, {
          contentType: "text/event-stream",
          headers: { "cache-control": "no-cache" }
        })
      }).pipe(Effect.catchAll(errorAnswer))

      const kvContext: KvTransferContext = {
        engine,
        sidecar,
        maxModelLength,
        checkModel,
        checkMedia,
        buildPrompt,
        waitMs: config.embeddingWaitMs
      }

      const promptEmbeddings = promptEmbeddingsRoute({
        engine,
        tokenizer,
        sidecar,
        maxModelLength,
        checkModel,
        checkMedia,
        buildPrompt,
        sampling
      })

      return {
        info: {
          modalities: media.accepted,
          encoders: media.encodable,
          maxModelLength,
          kvCacheBytesPerDevice: kvBudget(config, model).totalBytes,
          sidecarNode: sidecar?.nodeId ?? null
        },
        routes: HttpRouter.empty.pipe(
          HttpRouter.post("/v1/chat/completions", chatCompletions),
          HttpRouter.get("/v1/models", models),
          HttpRouter.post("/v1/cornserve/prompt-embeddings", promptEmbeddings),
          HttpRouter.post("/v1/cornserve/kv-prefill", kvPrefillRoute(kvContext)),
          HttpRouter.get("/v1/cornserve/stats", stats)
        )
      }
    })
}
