/**
 * OpenAI's routes on every app, one table: each route's path under `/app/:id/v1/`, its name in a
 * refusal, and the parameters of OpenAI's API it does not implement (a request that sets one is
 * refused, naming it, rather than answered as if it had not been asked). The gateway's router and
 * refusals (`OpenAiApi.ts`), its metrics' route labels (`InvokeRoute.ts`), the OpenAPI documents
 * (`OpenAiPaths.ts`) and the console read it. Plain data: the console imports it.
 */
export const openAiRoutes = {
  chat: {
    path: "chat/completions",
    name: "chat completions",
    unimplemented: [
      "function_call",
      "functions",
      "logit_bias",
      "metadata",
      "prediction",
      "prompt_cache_key",
      "reasoning_effort",
      "safety_identifier",
      "service_tier",
      "store",
      "verbosity",
      "web_search_options"
    ]
  },
  completions: { path: "completions", name: "completions", unimplemented: ["logit_bias", "suffix"] },
  embeddings: { path: "embeddings", name: "embeddings", unimplemented: [] },
  // OpenAI's `prompt` (Whisper's previous text) and streamed transcripts.
  transcriptions: {
    path: "audio/transcriptions",
    name: "transcriptions",
    unimplemented: ["prompt", "include", "stream"]
  },
  translations: { path: "audio/translations", name: "translations", unimplemented: ["prompt"] },
  // Voice instructions (gpt-4o-mini-tts's) have no counterpart in the models served here.
  speech: { path: "audio/speech", name: "speech", unimplemented: ["instructions"] },
  // Streamed partial images, and settings the generators served here have no counterpart for.
  images: {
    path: "images/generations",
    name: "image generations",
    unimplemented: ["stream", "partial_images", "background", "moderation", "output_compression", "quality", "style"]
  }
} as const satisfies Record<
  string,
  { readonly path: string; readonly name: string; readonly unimplemented: ReadonlyArray<string> }
>

/** A route that takes a request (POST); `models` (GET) lists what an app serves. */
export type OpenAiRoute = keyof typeof openAiRoutes

/** A route's path on app `appId` (`{id}`: the path's template, as OpenAPI and the metrics name it). */
export const openAiPath = (route: OpenAiRoute | "models", appId = "{id}"): string =>
  `/app/${appId}/v1/${route === "models" ? "models" : openAiRoutes[route].path}`

const byPath: ReadonlyMap<string, OpenAiRoute> = new Map(
  (Object.keys(openAiRoutes) as Array<OpenAiRoute>).map((route) => [openAiRoutes[route].path, route])
)

/** The route whose path under `/v1/` is `path`. */
export const openAiRouteAt = (path: string): OpenAiRoute | undefined => byPath.get(path)
