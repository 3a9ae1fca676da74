/**
 * OpenTelemetry traces, one per request, across every process of the platform: the gateway, the
 * app and dispatcher, each executor's router, engine and workers, and each node's sidecar. Each
 * process exports its own spans over OTLP/HTTP (`@effect/opentelemetry`'s exporter) and hands its
 * span to the next process as a W3C `traceparent` string: in an HTTP header to executors, in the
 * ZeroMQ messages of an executor's processes, in a sidecar's Send.
 *
 * Configured by the standard variables, and off when no endpoint is set:
 * `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as is) or `OTEL_EXPORTER_OTLP_ENDPOINT` (`/v1/traces`
 * appended); `OTEL_EXPORTER_OTLP[_TRACES]_HEADERS`; `OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL`
 * (`http/protobuf`, the default, or `http/json`); `OTEL_BSP_SCHEDULE_DELAY` (ms between exports);
 * `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`; `OTEL_SERVICE_NAME` (the main process's service; the others
 * append their role); `OTEL_RESOURCE_ATTRIBUTES`; `OTEL_SDK_DISABLED=true` or
 * `OTEL_TRACES_EXPORTER=none` turn it off.
 *
 * The code that makes spans is plain: `startSpan` gives a span, or one that records nothing when
 * tracing is off or the client asked not to sample, at the cost of a branch.
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Option from "effect/Option"
import type * as Scope from "effect/Scope"
import * as Tracer from "effect/Tracer"

export interface TraceSettings {
  readonly url: string
  readonly headers: Readonly<Record<string, string>>
  readonly protocol: "http/protobuf" | "http/json"
  readonly exportIntervalMs: number
  readonly maxBatchSize: number
  /** The main process's service name; other processes append their role. */
  readonly serviceName: string
}

const positiveNumber = (text: string | undefined, fallback: number): number => {
  const value = text === undefined ? Number.NaN : Number(text)
  return Number.isFinite(value) && value > 0 ? value : fallback
}

/** `key=value,key=value` with percent-encoded values, as the OTLP exporter variables spell headers. */
export const parseHeaderList = (text: string | undefined): Record<string, string> => {
  const headers: Record<string, string> = {}
  for (const pair of (text ?? "").split(",")) {
    const at = pair.indexOf("=")
    if (at <= 0) continue
    const key = pair.slice(0, at).trim().toLowerCase()
    const raw = pair.slice(at + 1).trim()
    try {
      headers[key] = decodeURIComponent(raw)
    } catch {
      headers[key] = raw
    }
  }
  return headers
}

/** The exporter's settings from the standard OTEL_* variables; undefined when tracing is off. */
export const traceSettingsOf = (env: Readonly<Record<string, string | undefined>>): TraceSettings | undefined => {
  if (env.OTEL_SDK_DISABLED?.trim().toLowerCase() === "true") return undefined
  const exporters = (env.OTEL_TRACES_EXPORTER ?? "otlp").split(",").map((name) => name.trim().toLowerCase())
  if (!exporters.includes("otlp")) return undefined
  const tracesEndpoint = env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT?.trim()
  const endpoint = env.OTEL_EXPORTER_OTLP_ENDPOINT?.trim()
  const url =
    tracesEndpoint !== undefined && tracesEndpoint !== ""
      ? tracesEndpoint
      : endpoint !== undefined && endpoint !== ""
        ? `${endpoint.replace(/\/+$/, "")}/v1/traces`
        : undefined
  if (url === undefined) return undefined
  const protocol = (env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL ?? env.OTEL_EXPORTER_OTLP_PROTOCOL ?? "").trim()
  return {
    url,
    headers: {
      ...parseHeaderList(env.OTEL_EXPORTER_OTLP_HEADERS),
      ...parseHeaderList(env.OTEL_EXPORTER_OTLP_TRACES_HEADERS)
    },
    protocol: protocol === "http/json" ? "http/json" : "http/protobuf",
    exportIntervalMs: positiveNumber(env.OTEL_BSP_SCHEDULE_DELAY, 5_000),
    maxBatchSize: Math.floor(positiveNumber(env.OTEL_BSP_MAX_EXPORT_BATCH_SIZE, 512)),
    serviceName: env.OTEL_SERVICE_NAME?.trim() || "cornserve"
  }
}

// ---------------------------------------------------------------------------------------------
// W3C trace context

export interface SpanContext {
  readonly traceId: string
  readonly spanId: string
  readonly sampled: boolean
}

const traceparentPattern = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/

/** A `traceparent` header's context; undefined for anything the W3C spec says to ignore. */
export const parseTraceparent = (header: string | ReadonlyArray<string> | undefined): SpanContext | undefined => {
  if (typeof header !== "string") return undefined
  const match = traceparentPattern.exec(header.trim().toLowerCase())
  if (match === null) return undefined
  const [, version, traceId, spanId, flags, rest] = match
  if (version === "ff" || (version === "00" && rest !== undefined)) return undefined
  if (/^0+$/.test(traceId!) || /^0+$/.test(spanId!)) return undefined
  return { traceId: traceId!, spanId: spanId!, sampled: (Number.parseInt(flags!, 16) & 1) === 1 }
}

export const formatTraceparent = (context: SpanContext): string =>
  `00-${context.traceId}-${context.spanId}-${context.sampled ? "01" : "00"}`

// ---------------------------------------------------------------------------------------------
// Spans

export type AttributeValue = string | number | boolean
export type SpanKind = "server" | "client" | "internal" | "producer" | "consumer"

export interface Span {
  /** This span as the next process's parent; undefined when nothing is traced. */
  readonly traceparent: string | undefined
  /** Whether it is exported (a span that is not may still pass its caller's traceparent on). */
  readonly recording: boolean
  attribute(key: string, value: AttributeValue): void
  event(name: string, attributes?: Readonly<Record<string, AttributeValue>>): void
  /** Ends it (once; later calls do nothing), failed when `failure` is given. */
  end(failure?: unknown): void
}

/** A span that records nothing. */
class Unrecorded implements Span {
  readonly recording = false
  constructor(readonly traceparent: string | undefined) {}
  attribute() {}
  event() {}
  end() {}
}

export const noSpan: Span = new Unrecorded(undefined)

/** A span, or the traceparent of one in another process (or of the client). */
export type SpanParent = Span | string | undefined

export interface SpanOptions {
  /** Without one, nothing is recorded unless `root`: work outside any request's trace is not traced. */
  readonly parent?: SpanParent
  /** Begins a new trace when there is no valid parent (a request arriving at the gateway). */
  readonly root?: boolean
  readonly kind?: SpanKind
  readonly attributes?: Readonly<Record<string, AttributeValue | undefined>>
  /** When it began, as `performance.now()` (default: now). */
  readonly startTime?: number
}

let tracer: Tracer.Tracer | undefined

/** Epoch nanoseconds of a `performance.now()` reading. */
const epochNanos = (at: number = performance.now()): bigint => BigInt(Math.round((performance.timeOrigin + at) * 1e6))

const failureMessage = (failure: unknown): string =>
  failure instanceof Error
    ? failure.message
    : typeof failure === "object" && failure !== null && "message" in failure
      ? String((failure as { readonly message: unknown }).message)
      : String(failure)

class Recorded implements Span {
  readonly recording = true
  private ended = false
  constructor(private readonly span: Tracer.Span) {}

  get traceparent(): string {
    return formatTraceparent(this.span)
  }
  attribute(key: string, value: AttributeValue) {
    if (!this.ended) this.span.attribute(key, value)
  }
  event(name: string, attributes?: Readonly<Record<string, AttributeValue>>) {
    if (!this.ended) this.span.event(name, epochNanos(), attributes)
  }
  end(failure?: unknown) {
    if (this.ended) return
    this.ended = true
    const tag = (failure as { readonly _tag?: unknown } | null | undefined)?._tag
    if (typeof tag === "string") this.span.attribute("error.type", tag)
    this.span.end(
      epochNanos(),
      failure === undefined
        ? Exit.void
        : Exit.fail(Object.assign(new Error(failureMessage(failure)), { name: tag ?? "Error" }))
    )
  }
  get context(): Tracer.Span {
    return this.span
  }
}

/** Whether this process exports spans. */
export const tracing = (): boolean => tracer !== undefined

/** Starts a span: a child of `parent`, or (with `root`) the first of a new trace. */
export const startSpan = (name: string, options: SpanOptions = {}): Span => {
  const parent = options.parent
  if (parent instanceof Unrecorded) return parent
  if (tracer === undefined) return typeof parent === "string" ? new Unrecorded(parent) : noSpan
  let parentSpan: Option.Option<Tracer.AnySpan> = Option.none()
  if (parent instanceof Recorded) parentSpan = Option.some(parent.context)
  else if (typeof parent === "string") {
    const context = parseTraceparent(parent)
    // A client that asked not to be sampled is not, here or further on.
    if (context?.sampled === false) return new Unrecorded(parent)
    if (context !== undefined) parentSpan = Option.some(Tracer.externalSpan(context))
  }
  if (Option.isNone(parentSpan) && options.root !== true) return noSpan
  const span = tracer.span(
    name,
    parentSpan,
    Context.empty(),
    [],
    epochNanos(options.startTime),
    options.kind ?? "internal"
  )
  for (const [key, value] of Object.entries(options.attributes ?? {}))
    if (value !== undefined) span.attribute(key, value)
  return new Recorded(span)
}

/**
 * Exports this process's spans for as long as the scope is open, when the OTEL_* variables ask for
 * it; spans still buffered are sent when the scope closes. `role` names the process (none for the
 * main process): its service is `<OTEL_SERVICE_NAME or cornserve>-<role>`.
 */
export const traceProcess = (
  role: string | undefined,
  attributes: Readonly<Record<string, string>> = {}
): Effect.Effect<void, never, Scope.Scope> =>
  Effect.gen(function* () {
    const settings = traceSettingsOf(process.env)
    if (settings === undefined || tracer !== undefined) return
    // Loaded only when tracing is on: every process of the platform imports this module.
    const [OtlpSerialization, OtlpTracer, NodeHttpClient] = yield* Effect.promise(() =>
      Promise.all([
        import("@effect/opentelemetry/OtlpSerialization"),
        import("@effect/opentelemetry/OtlpTracer"),
        import("@effect/platform-node/NodeHttpClient")
      ])
    )
    const made = yield* OtlpTracer.make({
      url: settings.url,
      headers: settings.headers,
      exportInterval: settings.exportIntervalMs,
      maxBatchSize: settings.maxBatchSize,
      shutdownTimeout: "3 seconds",
      resource: {
        serviceName: role === undefined ? settings.serviceName : `${settings.serviceName}-${role}`,
        attributes: { ...attributes, "process.pid": process.pid }
      }
    }).pipe(
      Effect.provide(NodeHttpClient.layer),
      Effect.provide(settings.protocol === "http/json" ? OtlpSerialization.layerJson : OtlpSerialization.layerProtobuf)
    )
    // Registered after the exporter's own finalizer, so it runs first: no span starts while the last ones are sent.
    yield* Effect.acquireRelease(
      Effect.sync(() => {
        tracer = made
      }),
      () =>
        Effect.sync(() => {
          tracer = undefined
        })
    )
  })

/** Runs `run` inside a span of its own, ended (failed, when it rejects) once it settles. */
export const inSpan = async <A>(name: string, options: SpanOptions, run: (span: Span) => Promise<A>): Promise<A> => {
  const span = startSpan(name, options)
  try {
    const result = await run(span)
    span.end()
    return result
  } catch (error) {
    span.end(error)
    throw error
  }
}
