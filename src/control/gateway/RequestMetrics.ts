/**
 * What the gateway measures of the requests to apps, with prom-client: latency by app and status,
 * errors by code, and requests shed by admission control. The labels name registered apps only
 * (a request for an unknown app counts under app=""), so that a client cannot grow the series.
 */
import { Counter, Histogram, Registry } from "prom-client"

/** From half a millisecond (the gateway's own overhead) to a minute (a long generation). */
const latencyBuckets = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]

/** Error codes that mean the request was shed for capacity, by the reason shown in the counter. */
const shedReasons: Readonly<Record<string, string>> = {
  AppOverloaded: "app_overloaded",
  QueueTimeout: "queue_timeout",
  ShuttingDown: "shutting_down"
}

export class RequestMetrics {
  readonly registry = new Registry()
  private readonly duration = new Histogram({
    name: "cornserve_request_duration_seconds",
    help: "Requests to apps, from arrival at the gateway to the last byte of the answer, by app and status (499: the client left first).",
    labelNames: ["app", "status"] as const,
    buckets: latencyBuckets,
    registers: [this.registry]
  })
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

  /** One request ended: `errorCode` is the error it was answered with, if any. */
  finished(app: string, status: number, seconds: number, errorCode: string | undefined): void {
    this.duration.observe({ app, status: String(status) }, seconds)
    if (errorCode === undefined) return
    this.errors.inc({ app, code: errorCode })
    const reason = shedReasons[errorCode]
    if (reason !== undefined) this.shed.inc({ app, reason })
  }

  /** The Prometheus text of these metrics. */
  text(): Promise<string> {
    return this.registry.metrics()
  }
}
