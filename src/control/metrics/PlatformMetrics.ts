/**
 * The platform's prom-client metrics: what the gateway measures of the requests to apps (latency by
 * app and status, errors by code, requests shed by admission control) and what the dispatcher
 * reports of its executor calls. The labels name registered apps and deployed tasks only (a
 * request for an unknown app counts under app=""), so that a client cannot grow the series.
 */
import * as Effect from "effect/Effect"
import { Counter, Gauge, Histogram, Registry } from "prom-client"
import type { CallObserver, RequestObserver } from "../DispatchContract.js"
import type { EmbeddingCacheStats } from "../executor-calls/EmbeddingCache.js"

/** From half a millisecond (the gateway's own overhead) to a minute (a long generation). */
const latencyBuckets = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]

/** From a tenth of a millisecond: the platform's own share of a request is small. */
const overheadBuckets = [0.0001, 0.00025, ...latencyBuckets]

/** Error codes that mean the request was shed for capacity, by the reason shown in the counter. */
const shedReasons: Readonly<Record<string, string>> = {
  AppOverloaded: "app_overloaded",
  QueueTimeout: "queue_timeout",
  ShuttingDown: "shutting_down"
}

export class Metrics {
  readonly registry = new Registry()
  private readonly duration = this.histogram(
    "cornserve_request_duration_seconds",
    "Requests to apps, from arrival at the gateway to the last byte of the answer, by app and status (499: the client left first).",
    ["app", "status"]
  )
  private readonly errors = new Counter({
    name: "cornserve_request_errors_total",
    help: "Requests to apps answered with an error, by app and error code.",
    labelNames: ["app", "code"] as const,
    registers: [this.registry]
  })
  private readonly shed = new Counter({
    name: "cornserve_requests_shed_total",
    help: "Requests refused for capacity before any of their work started, by app and reason.",
    labelNames: ["app", "reason"] as const,
    registers: [this.registry]
  })

  private readonly calls = this.histogram(
    "cornserve_executor_call_seconds",
    "Calls from the dispatcher to task executors, from the call to its answer (its last chunk when streamed), by task, operation and outcome.",
    ["task", "operation", "outcome"]
  )
  private readonly firstChunk = this.histogram(
    "cornserve_stream_first_chunk_seconds",
    "Streamed executor calls (an LLM's tokens): from the call to its first chunk (time to first token), by task.",
    ["task"]
  )
  private readonly nextChunk = this.histogram(
    "cornserve_stream_inter_chunk_seconds",
    "Streamed executor calls: the time between one chunk and the next (inter-token latency), by task.",
    ["task"]
  )

  private readonly leaseWait = this.histogram(
    "cornserve_task_lease_wait_seconds",
    "How long the dispatcher waited for an executor of the task to call (none healthy, say), by task.",
    ["task"]
  )
  private readonly retries = new Counter({
    name: "cornserve_dispatch_retries_total",
    help: "Task graphs run again as a whole, by reason (unavailable: an executor could not take a call, or its node or the sidecar was lost).",
    labelNames: ["reason"] as const,
    registers: [this.registry]
  })

  private readonly failovers = new Counter({
    name: "cornserve_llm_failovers_total",
    help: "LLM streams that broke off (their executor died, their node was lost) and went on from a fresh run, by task.",
    labelNames: ["task"] as const,
    registers: [this.registry]
  })

  private readonly overhead = this.histogram(
    "cornserve_request_overhead_seconds",
    "The platform's own time per request: from its hand-over to the app to the end of its answer, less the time inside executor calls (app code included), by app.",
    ["app"],
    overheadBuckets
  )
  private readonly appCode = this.histogram(
    "cornserve_app_code_seconds",
    "Per request, the time outside task dispatches: the app's own code and the hop to its process, by app.",
    ["app"],
    overheadBuckets
  )
  private readonly dispatchOverhead = this.histogram(
    "cornserve_dispatch_overhead_seconds",
    "Per request, the time inside task dispatches but outside executor calls: leasing, wiring, waiting on the app to read a stream, by app.",
    ["app"],
    overheadBuckets
  )

  private readonly cacheLookups = new Counter({
    name: "cornserve_embedding_cache_lookups_total",
    help: "Media items an encoder task was asked to embed that the cache of encoder outputs could hold (data: URLs), by task and result (hit: forwarded from the cache, the encoder not called; miss).",
    labelNames: ["task", "result"] as const,
    registers: [this.registry]
  })
  private readonly cacheBytes = new Gauge({
    name: "cornserve_embedding_cache_bytes",
    help: "Bytes of encoder outputs the cache holds (bounded by --embedding-cache-bytes).",
    registers: [this.registry]
  })
  private readonly cacheEntries = new Gauge({
    name: "cornserve_embedding_cache_entries",
    help: "Encoder outputs the cache holds.",
    registers: [this.registry]
  })

  /** The cache of encoder outputs: each lookup, and its size after each change. */
  embeddingCacheLookup(task: string, result: "hit" | "miss"): void {
    this.cacheLookups.inc({ task, result })
  }
  embeddingCacheSize(stats: EmbeddingCacheStats): void {
    this.cacheBytes.set(stats.bytes)
    this.cacheEntries.set(stats.entries)
  }

  /** What the dispatcher reports of its executor calls goes into these metrics. */
  readonly callObserver: CallObserver = {
    call: (task, operation, outcome, seconds) => this.calls.observe({ task, operation, outcome }, seconds),
    firstChunk: (task, seconds) => this.firstChunk.observe({ task }, seconds),
    nextChunk: (task, seconds) => this.nextChunk.observe({ task }, seconds),
    leaseWait: (task, seconds) => this.leaseWait.observe({ task }, seconds),
    retried: (reason) => this.retries.inc({ reason }),
    failover: (task) => this.failovers.inc({ task })
  }

  /** What app drivers report of each request's time goes into these metrics. */
  readonly requestObserver: RequestObserver = {
    ended: (app, seconds, dispatchSeconds, executorSeconds) => {
      this.overhead.observe({ app }, Math.max(0, seconds - executorSeconds))
      this.appCode.observe({ app }, Math.max(0, seconds - dispatchSeconds))
      this.dispatchOverhead.observe({ app }, Math.max(0, dispatchSeconds - executorSeconds))
    }
  }

  /** One request ended: `errorCode` is the error it was answered with, if any. */
  finished(app: string, status: number, seconds: number, errorCode: string | undefined): void {
    this.duration.observe({ app, status: String(status) }, seconds)
    if (errorCode === undefined) return
    this.errors.inc({ app, code: errorCode })
    const reason = shedReasons[errorCode]
    if (reason !== undefined) this.shed.inc({ app, reason })
  }

  /** A latency histogram in this registry. */
  private histogram<Label extends string>(
    name: string,
    help: string,
    labelNames: ReadonlyArray<Label>,
    buckets: ReadonlyArray<number> = latencyBuckets
  ) {
    return new Histogram<Label>({ name, help, labelNames, buckets: [...buckets], registers: [this.registry] })
  }

  /** The Prometheus text of these metrics. */
  text(): Promise<string> {
    return this.registry.metrics()
  }
}

/** The platform's prom-client metrics, one set per process, shared by the gateway and the dispatcher. */
export class PlatformMetrics extends Effect.Service<PlatformMetrics>()("cornserve/PlatformMetrics", {
  sync: () => ({ metrics: new Metrics() })
}) {}
