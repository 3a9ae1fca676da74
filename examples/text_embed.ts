/**
 * A text embedding service, as OpenAI's embeddings: a text (or a list of up to 2048, or their
 * token ids) becomes one vector each, for a retrieval app's index and queries. The built-in
 * `cornserve/tiny-text-embedder` is a small BERT sentence encoder (mean pooling, unit vectors) whose
 * vectors are close for texts that share words. The inputs of one request, and of requests that
 * arrive together, run as one batch.
 */
import { defineApp, EmbeddingRequest, EmbeddingResponse, TextEmbeddingTask } from "cornserve/app"

const embedder = new TextEmbeddingTask({ model: "cornserve/tiny-text-embedder" })

export default defineApp({
  description: "Embeds texts into vectors (OpenAI's embeddings).",
  tasks: { embedder },
  request: EmbeddingRequest,
  response: EmbeddingResponse,
  example: { input: ["The weather is warm today.", "Is it warm outside?"] },
  serve: (request) => embedder.invoke(request)
})
