/**
 * Eric's `POST /text-embeddings`: each input of the request is one work item (its token ids), so
 * that the engine batches the inputs of one request, and of concurrent requests, together; the
 * worker pools each input's token embeddings into its vector (see TextEncoder), and the vectors come
 * back in the answer.
 */
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as Effect from "effect/Effect"
import type { Pooling, TextEmbeddingSpec } from "../../models/TextEmbedding.js"
import { inSpan } from "../../tracing/Tracing.js"
import type { EngineClient } from "../common/EngineClient.js"
import { BadRequest, ContextLengthExceeded } from "../common/errors.js"
import type { ExecutorConfig } from "../common/ExecutorConfig.js"
import { errorAnswer, RequestSpan, workItemContext } from "../common/Router.js"
import type { ThreadPool } from "../common/ThreadPool.js"
import type { WorkItem } from "../common/wire.js"
import { TextEmbeddingsRequest, type TextEmbeddingsResponse } from "./api.js"
import type { TextItemMeta } from "./TextEncoder.js"
import { cutDimensions } from "./TextPooling.js"

/** Texts tokenized by one job of the thread pool. */
const textsPerJob = 64

/** How a request's inputs are embedded, once checked against the model. */
export interface TextEmbeddingPlan {
  readonly pooling: Pooling
  readonly normalize: boolean
  /** Inputs longer than this many tokens are cut to it; undefined: refused (ContextLengthExceeded). */
  readonly truncateTo: number | undefined
  readonly dimensions: number | undefined
}

/** The request's settings against what the model's files say; a request the model cannot serve is refused, naming why. */
export const textEmbeddingPlan = (
  request: TextEmbeddingsRequest,
  spec: TextEmbeddingSpec,
  model: string
): TextEmbeddingPlan | BadRequest => {
  const pooling = request.pooling ?? spec.pooling
  if (pooling === undefined) {
    return new BadRequest({
      message: `model ${model} does not say how to pool its token embeddings (${spec.poolingSource}): name it in the task, new TextEmbeddingTask({ model, pooling: "mean" | "cls" | "last" })`
    })
  }
  const { truncate, dimensions } = request
  if (truncate !== undefined && (truncate === 0 || truncate > spec.maxTokens)) {
    return new BadRequest({
      message: `truncate_prompt_tokens must be -1 (the model's limit) or 1 to ${spec.maxTokens}, the model's maximum context length; got ${truncate}`
    })
  }
  if (dimensions !== undefined) {
    if (spec.matryoshka === undefined) {
      return new BadRequest({
        message: `model ${model} does not support matryoshka representation: its vectors cannot be cut to dimensions`
      })
    }
    if (dimensions < 1 || dimensions > spec.hiddenSize) {
      return new BadRequest({
        message: `dimensions must be 1 to ${spec.hiddenSize} for model ${model}; got ${dimensions}`
      })
    }
    if (spec.matryoshka !== "any" && !spec.matryoshka.includes(dimensions)) {
      return new BadRequest({
        message: `model ${model} may be cut to the matryoshka dimensions ${spec.matryoshka.join(", ")} only; got ${dimensions}`
      })
    }
  }
  return {
    pooling,
    normalize: request.normalize ?? spec.normalize ?? true,
    truncateTo: truncate === undefined ? undefined : truncate === -1 ? spec.maxTokens : truncate,
    dimensions
  }
}

/** An input's token ids as given: each a token of the model's vocabulary, cut when the plan says so. */
const givenTokens = (
  ids: ReadonlyArray<number>,
  index: number,
  spec: TextEmbeddingSpec,
  plan: TextEmbeddingPlan
): Int32Array | BadRequest => {
  const outside = ids.find((id) => id >= spec.vocabSize)
  if (outside !== undefined) {
    return new BadRequest({
      message: `input ${index} has token id ${outside}, outside the model's vocabulary of ${spec.vocabSize}`
    })
  }
  return Int32Array.from(plan.truncateTo === undefined ? ids : ids.slice(0, plan.truncateTo))
}

const base64Of = (vector: Float32Array): string =>
  Buffer.from(vector.buffer, vector.byteOffset, vector.byteLength).toString("base64")

export const textEmbeddings = (context: {
  readonly config: ExecutorConfig
  readonly engine: EngineClient
  readonly pool: ThreadPool
  readonly spec: TextEmbeddingSpec
}) => {
  const { config, engine, pool, spec } = context

  /** Every input's token ids, in order; texts are tokenized in the thread pool. */
  const tokensOf = async (
    inputs: TextEmbeddingsRequest["inputs"],
    plan: TextEmbeddingPlan
  ): Promise<Array<Int32Array>> => {
    const tokens = new Array<Int32Array>(inputs.length)
    const texts: Array<number> = []
    for (const [index, input] of inputs.entries()) {
      if (input.length === 0) throw new BadRequest({ message: `input ${index} is empty` })
      if (typeof input === "string") {
        texts.push(index)
        continue
      }
      const given = givenTokens(input, index, spec, plan)
      if (given instanceof BadRequest) throw given
      tokens[index] = given
    }
    const jobs: Array<Promise<void>> = []
    for (let from = 0; from < texts.length; from += textsPerJob) {
      const indices = texts.slice(from, from + textsPerJob)
      jobs.push(
        pool
          .run<Array<Int32Array>>("tokenize", {
            modelDir: config.modelDir,
            texts: indices.map((index) => inputs[index] as string),
            ...(plan.truncateTo === undefined ? {} : { truncateTo: plan.truncateTo })
          })
          .then((ids) => indices.forEach((index, position) => (tokens[index] = ids[position]!)))
      )
    }
    await Promise.all(jobs)
    const tooLong = tokens.findIndex((ids) => ids.length > spec.maxTokens)
    if (tooLong >= 0) {
      throw new ContextLengthExceeded({
        message: `this model's maximum context length is ${spec.maxTokens} tokens, but input ${tooLong} has ${tokens[tooLong]!.length}: shorten it, or ask for truncation (truncate_prompt_tokens)`
      })
    }
    return tokens
  }

  return Effect.gen(function* () {
    const body = yield* HttpServerRequest.schemaBodyJson(TextEmbeddingsRequest)
    const plan = textEmbeddingPlan(body, spec, config.model)
    if (plan instanceof BadRequest) return yield* plan
    const span = yield* RequestSpan
    const itemContext = yield* workItemContext
    const tokens = yield* Effect.tryPromise({
      try: () =>
        inSpan("preprocess", { parent: span, attributes: { "cornserve.items": body.inputs.length } }, () =>
          tokensOf(body.inputs, plan)
        ),
      catch: (error) => error
    })
    const meta: TextItemMeta = { modality: "text", pooling: plan.pooling, normalize: plan.normalize }
    const items: Array<WorkItem<TextItemMeta>> = tokens.map((ids) => ({
      key: "text",
      inputs: { input_ids: { dtype: "int32", shape: [ids.length], data: ids } },
      meta,
      ...itemContext
    }))
    const results = yield* engine.run<Float32Array>(items)
    const answer: TextEmbeddingsResponse = {
      embeddings: results.map((full) =>
        base64Of(plan.dimensions === undefined ? full : cutDimensions(full, plan.dimensions, plan.normalize))
      ),
      promptTokens: tokens.reduce((sum, ids) => sum + ids.length, 0)
    }
    return HttpServerResponse.unsafeJson(answer)
  }).pipe(Effect.catchAll(errorAnswer))
}
