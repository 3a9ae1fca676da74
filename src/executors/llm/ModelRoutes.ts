/**
 * What every LLM executor's router answers whatever its model: `GET /v1/models` (the one model it
 * serves) and `GET /v1/cornserve/stats` (the engine's and the workers' counts), and the check of a
 * request's `model`. The chat router, Janus-Pro's and a talker's take them from here.
 */
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as Effect from "effect/Effect"
import type { EngineClient } from "../common/EngineClient.js"
import { ModelNotFound } from "../common/errors.js"
import { errorAnswer } from "../common/Router.js"
import type { LlmStats, ModelList } from "./api.js"
import type { LlmRequestMeta } from "./protocol.js"

export const modelRoutes = (
  model: string,
  engine: EngineClient,
  maxModelLength: number,
  /** Said about the executor in its stats (the decoder it runs). */
  about: Partial<LlmStats> = {}
) => {
  const created = Math.floor(Date.now() / 1000)
  const list: ModelList = {
    object: "list",
    data: [{ id: model, object: "model", created, owned_by: "cornserve", max_model_len: maxModelLength }]
  }
  return {
    /** A request's `model`, when it names one, must be this executor's. */
    checkModel: (name: string | undefined) =>
      name === undefined || name === model
        ? Effect.void
        : Effect.fail(new ModelNotFound({ message: `this executor serves "${model}", not "${name}"` })),
    models: Effect.sync(() => HttpServerResponse.unsafeJson(list)),
    stats: Effect.gen(function* () {
      const result = yield* engine.runOne<LlmStats>({
        key: "stats",
        inputs: {},
        meta: { op: "stats" } satisfies LlmRequestMeta
      })
      return HttpServerResponse.unsafeJson({ ...about, ...result })
    }).pipe(Effect.catchAll(errorAnswer))
  }
}
