/**
 * The platform's prom-client metrics: what the gateway measures of the requests to apps (latency by
 * app and status, errors by code, requests shed by admission control) and what the dispatcher
 * reports of its executor calls. The labels name registered apps and deployed tasks only (a
 * request for an unknown app counts under app=""), so that a client cannot grow the series.
 */
import { Effect } from "effect"
import { Counter, Histogram, Registry } from "prom-client"
import type { CallObserver } from "../dispatcher/Dispatcher.js"

/** From half a millisecond (the gateway's own overhead) to a minute (a long generation). */
const latencyBuckets = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]

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

  /** What the dispatcher reports of its executor calls goes into these metrics. */
  readonly callObserver: CallObserver = {
    call: (task, operation, outcome, seconds) => this.calls.observe({ task, operation, outcome }, seconds),
    firstChunk: (task, seconds) => this.firstChunk.observe({ task }, seconds),
    nextChunk: (task, seconds) => this.nextChunk.observe({ task }, seconds)
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
  private histogram<Label extends string>(name: string, help: string, labelNames: ReadonlyArray<Label>) {
    return new Histogram<Label>({ name, help, labelNames, buckets: latencyBuckets, registers: [this.registry] })
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
