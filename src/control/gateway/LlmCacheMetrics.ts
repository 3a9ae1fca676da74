/**
 * The LLM executors' prefix caches in the platform's /metrics: at each scrape, every healthy
 * executor of an LLM task is asked for its stats (with the internal secret, within a short
 * timeout); one that does not answer in time is left out of that scrape.
 */
import * as Http from "node:http"
import * as Schema from "effect/Schema"
import { LlmStats } from "../../executors/llm/api.js"
import { metric } from "../../metrics/PrometheusText.js"
import { credentialHeaders } from "../executor-calls/ExecutorHttp.js"
import type { TaskSummary } from "../resource-manager/ResourceManager.js"

/** An executor's answer is a few hundred bytes; more is not an answer. */
const maxStatsBytes = 64 * 1024
const statsTimeoutMs = 1_000

const decodeStats = Schema.decodeUnknownOption(Schema.parseJson(LlmStats))

export interface ExecutorPrefixCache {
  readonly task: string
  readonly executor: string
  /** Absent for an executor that keeps no prefix cache. */
  readonly cache?: NonNullable<LlmStats["prefixCache"]>
  /** The KV caches other executors prefilled that its requests took (prefill and decode apart). */
  readonly imports?: NonNullable<LlmStats["kvImports"]>
}

/** GET of an executor's stats, bounded in time and size; undefined when it does not answer with them. */
const getStats = (url: string, secret: string): Promise<LlmStats | undefined> =>
  new Promise((resolve) => {
    const request = Http.get(
      `${url}/v1/cornserve/stats`,
      { headers: credentialHeaders(secret), timeout: statsTimeoutMs },
      (response) => {
        const chunks: Array<Buffer> = []
        let size = 0
        response.on("data", (chunk: Buffer) => {
          size += chunk.length
          if (size > maxStatsBytes) {
            request.destroy()
            return resolve(undefined)
          }
          chunks.push(chunk)
        })
        response.on("end", () => {
          if (response.statusCode !== 200) return resolve(undefined)
          const decoded = decodeStats(Buffer.concat(chunks).toString("utf8"))
          resolve(decoded._tag === "Some" ? decoded.value : undefined)
        })
        response.on("error", () => resolve(undefined))
      }
    )
    request.on("timeout", () => request.destroy())
    request.on("error", () => resolve(undefined))
  })

/** The prefix caches of every healthy LLM executor that answers. */
export const llmPrefixCaches = async (
  tasks: ReadonlyArray<TaskSummary>,
  secret: string
): Promise<ReadonlyArray<ExecutorPrefixCache>> => {
  const executors = tasks
    .filter((task) => task.kind === "llm")
    .flatMap((task) =>
      task.executors.flatMap((executor) =>
        executor.healthy && executor.url !== null ? [{ task: task.id, executor: executor.id, url: executor.url }] : []
      )
    )
  const answers = await Promise.all(executors.map((executor) => getStats(executor.url, secret)))
  return executors.flatMap((executor, index) => {
    const { prefixCache: cache, kvImports: imports } = answers[index] ?? {}
    if (cache === undefined && imports === undefined) return []
    return [
      {
        task: executor.task,
        executor: executor.executor,
        ...(cache === undefined ? {} : { cache }),
        ...(imports === undefined ? {} : { imports })
      }
    ]
  })
}

/** The Prometheus metrics of those caches, by task and executor. */
export const prefixCacheMetrics = (caches: ReadonlyArray<ExecutorPrefixCache>): ReadonlyArray<string> => {
  const samples = (field: keyof NonNullable<ExecutorPrefixCache["cache"]>) =>
    caches.flatMap(({ task, executor, cache }) =>
      cache === undefined ? [] : [[{ task, executor }, cache[field]] as const]
    )
  const imported = (field: "requests" | "tokens") =>
    caches.flatMap(({ task, executor, imports }) =>
      imports === undefined ? [] : [[{ task, executor }, imports[field]] as const]
    )
  return [
    metric(
      "cornserve_llm_prefix_cache_lookups_total",
      "counter",
      "Prompts an LLM executor looked up in its prefix cache, by task and executor.",
      samples("lookups")
    ),
    metric(
      "cornserve_llm_prefix_cache_hits_total",
      "counter",
      "Prompts that found their leading blocks in the prefix cache, and were prefilled from where those end.",
      samples("hits")
    ),
    metric(
      "cornserve_llm_prefix_cache_hit_tokens_total",
      "counter",
      "Prompt tokens not prefilled because the prefix cache held them.",
      samples("hitTokens")
    ),
    metric(
      "cornserve_llm_prefix_cache_bytes",
      "gauge",
      "Bytes of KV cache blocks the prefix cache holds (bounded by the executor's --prefix-cache-bytes per device).",
      samples("bytes")
    ),
    metric(
      "cornserve_llm_prefix_cache_max_bytes",
      "gauge",
      "The bound on the prefix cache's bytes, all devices of the executor together.",
      samples("maxBytes")
    ),
    metric(
      "cornserve_llm_prefix_cache_evictions_total",
      "counter",
      "Blocks evicted from the prefix cache, least recently used first, to stay within its bound.",
      samples("evictions")
    ),
    metric(
      "cornserve_llm_kv_imported_requests_total",
      "counter",
      "Requests that started from a KV cache another executor prefilled (prefill and decode apart).",
      imported("requests")
    ),
    metric(
      "cornserve_llm_kv_imported_tokens_total",
      "counter",
      "Prompt tokens not prefilled because another executor prefilled them and sent their KV cache.",
      imported("tokens")
    )
  ]
}
