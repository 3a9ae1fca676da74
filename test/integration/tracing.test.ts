/**
 * OpenTelemetry traces against the real binary: an OTLP/HTTP receiver inside the test collects what
 * every process exports, and one color_chat request's spans must form one tree under the client's
 * span, from the gateway through the app, the dispatcher, both executors (router, queue, worker) and
 * the sidecar transfer between them.
 */
import { randomBytes } from "node:crypto"
import { createServer, type Server } from "node:http"
import type { AddressInfo } from "node:net"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type ColorChatPlatform, chatRequest, startColorChat } from "../support/colorChat.js"
import { eventually } from "../support/platform.js"

interface OtlpValue {
  readonly stringValue?: string
  readonly intValue?: string | number
  readonly boolValue?: boolean
  readonly doubleValue?: number
}

interface ReceivedSpan {
  readonly service: string
  readonly process: string | undefined
  readonly name: string
  readonly traceId: string
  readonly spanId: string
  readonly parentSpanId: string | undefined
  readonly kind: number
  readonly start: bigint
  readonly end: bigint
  readonly attributes: Readonly<Record<string, string | number | boolean | undefined>>
  readonly status: number
}

const attributeValue = (value: OtlpValue) =>
  value.stringValue ??
  (value.intValue === undefined ? undefined : Number(value.intValue)) ??
  value.boolValue ??
  value.doubleValue

const attributesOf = (list: ReadonlyArray<{ key: string; value: OtlpValue }> | undefined) =>
  Object.fromEntries((list ?? []).map(({ key, value }) => [key, attributeValue(value)]))

/** A collector of OTLP/HTTP JSON trace exports. */
const startReceiver = async () => {
  const spans: Array<ReceivedSpan> = []
  const contentTypes = new Set<string>()
  const server: Server = createServer((request, response) => {
    const chunks: Array<Buffer> = []
    request.on("data", (chunk: Buffer) => chunks.push(chunk))
    request.on("end", () => {
      contentTypes.add(request.headers["content-type"] ?? "")
      if (request.url !== "/v1/traces") return void response.writeHead(404).end()
      const body = JSON.parse(Buffer.concat(chunks).toString("utf8"))
      for (const resourceSpans of body.resourceSpans ?? []) {
        const resource = attributesOf(resourceSpans.resource?.attributes)
        for (const scopeSpans of resourceSpans.scopeSpans ?? []) {
          for (const span of scopeSpans.spans ?? []) {
            spans.push({
              service: String(resource["service.name"]),
              process: resource["cornserve.executor.process"] as string | undefined,
              name: span.name,
              traceId: span.traceId,
              spanId: span.spanId,
              parentSpanId: span.parentSpanId || undefined,
              kind: span.kind,
              start: BigInt(span.startTimeUnixNano),
              end: BigInt(span.endTimeUnixNano),
              attributes: attributesOf(span.attributes),
              status: span.status?.code ?? 0
            })
          }
        }
      }
      response.writeHead(200, { "content-type": "application/json" }).end("{}")
    })
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    spans,
    contentTypes,
    close: () => new Promise<void>((resolve) => server.close(() => resolve()))
  }
}

const hex = (bytes: number) => randomBytes(bytes).toString("hex")

/** SpanKind in OTLP: 1 internal, 2 server, 3 client, 4 producer. */
const kinds = { internal: 1, server: 2, client: 3, producer: 4 } as const

describe("tracing", () => {
  let receiver: Awaited<ReturnType<typeof startReceiver>>
  let running: ColorChatPlatform

  beforeAll(async () => {
    receiver = await startReceiver()
    // Without the cache of encoder outputs: every request here sends the same image, and each must reach the encoder.
    running = await startColorChat(`trace-${process.pid}`, ["--embedding-cache-bytes", "0"], {
      OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
      OTEL_EXPORTER_OTLP_PROTOCOL: "http/json",
      OTEL_BSP_SCHEDULE_DELAY: "100",
      OTEL_SERVICE_NAME: "cornserve"
    })
  }, 180_000)

  afterAll(async () => {
    await running?.dispose()
    await receiver?.close()
  })

  const invokeTraced = async (traceparent: string) => {
    const response = await fetch(`${running.platform.url}/app/invoke/color_chat`, {
      method: "POST",
      headers: { "content-type": "application/json", traceparent },
      body: chatRequest
    })
    expect(response.status).toBe(200)
    expect(await response.text()).toContain("red")
  }

  it("exports one span tree per color_chat request, under the client's span, across every process", async () => {
    // A client that asks not to be sampled is not traced anywhere.
    const unsampledTrace = hex(16)
    await invokeTraced(`00-${unsampledTrace}-${hex(8)}-00`)

    const traceId = hex(16)
    const clientSpanId = hex(8)
    await invokeTraced(`00-${traceId}-${clientSpanId}-01`)

    const expected = [
      ["cornserve", "POST /app/invoke/{id}"],
      ["cornserve", "app color_chat"],
      ["cornserve", "dispatch"],
      ["cornserve-eric", "POST /embeddings"],
      ["cornserve-eric", "preprocess"],
      ["cornserve-eric", "queue"],
      ["cornserve-eric", "compute"],
      ["cornserve-sidecar", "sidecar send"],
      ["cornserve-llm", "POST /v1/chat/completions"],
      ["cornserve-llm", "prompt"],
      ["cornserve-llm", "queue"],
      ["cornserve-llm", "generate"]
    ] as const
    const trace = await eventually(async () => {
      const spans = receiver.spans.filter((span) => span.traceId === traceId)
      const complete = expected.every(([service, name]) =>
        spans.some((span) => span.service === service && span.name === name)
      )
      return complete ? spans : undefined
    }, 30_000)
    expect(receiver.contentTypes).toContain("application/json")

    const byId = new Map(trace.map((span) => [span.spanId, span]))
    const one = (service: string, name: string) => {
      const found = trace.filter((span) => span.service === service && span.name === name)
      expect(found, `${service} ${name}`).toHaveLength(1)
      return found[0]!
    }
    const parentOf = (span: ReceivedSpan) => byId.get(span.parentSpanId ?? "")

    // The gateway's span is the client's span's child; every other span's parent is in the trace.
    const gateway = one("cornserve", "POST /app/invoke/{id}")
    expect(gateway.parentSpanId).toBe(clientSpanId)
    expect(gateway.kind).toBe(kinds.server)
    expect(gateway.attributes["http.response.status_code"]).toBe(200)
    expect(gateway.attributes["cornserve.app"]).toBe("color_chat")
    for (const span of trace) {
      if (span !== gateway) expect(parentOf(span), `${span.service} ${span.name}`).toBeDefined()
      expect(span.end >= span.start).toBe(true)
      expect(span.status, `${span.service} ${span.name}`).not.toBe(2)
    }

    const app = one("cornserve", "app color_chat")
    expect(parentOf(app)).toBe(gateway)
    const dispatch = one("cornserve", "dispatch")
    expect(parentOf(dispatch)).toBe(app)
    const calls = trace.filter((span) => span.service === "cornserve" && span.kind === kinds.client)
    expect(calls).toHaveLength(2)
    for (const call of calls) expect(parentOf(call)).toBe(dispatch)
    const leases = trace.filter((span) => span.name.startsWith("lease "))
    expect(leases).toHaveLength(2)
    for (const lease of leases) expect(parentOf(lease)).toBe(dispatch)

    // Eric: its router's span is the encoder call's child; queue and compute are the router's.
    const eric = one("cornserve-eric", "POST /embeddings")
    expect(eric.kind).toBe(kinds.server)
    expect(eric.process).toBe("router")
    expect(parentOf(eric)?.kind).toBe(kinds.client)
    expect(parentOf(eric)?.attributes["cornserve.operation"]).toBe("embed")
    expect(parentOf(one("cornserve-eric", "preprocess"))).toBe(eric)
    const ericQueue = one("cornserve-eric", "queue")
    expect(ericQueue.process).toBe("router")
    expect(parentOf(ericQueue)).toBe(eric)
    const compute = one("cornserve-eric", "compute")
    expect(compute.process).toBe("worker")
    expect(parentOf(compute)).toBe(eric)
    // The features go from Eric's worker through the sidecar, with their bytes.
    const send = one("cornserve-sidecar", "sidecar send")
    expect(parentOf(send)).toBe(compute)
    expect(send.kind).toBe(kinds.producer)
    expect(Number(send.attributes["cornserve.transfer.bytes"])).toBeGreaterThan(0)

    // The LLM: prompt (its media embeddings from the sidecar), queue, then the worker's generation.
    const llm = one("cornserve-llm", "POST /v1/chat/completions")
    expect(parentOf(llm)?.attributes["cornserve.operation"]).toBe("chat")
    expect(parentOf(one("cornserve-llm", "prompt"))).toBe(llm)
    const llmQueue = one("cornserve-llm", "queue")
    expect(llmQueue.process).toBe("router")
    expect(parentOf(llmQueue)).toBe(llm)
    const generate = one("cornserve-llm", "generate")
    expect(generate.process).toBe("worker")
    expect(parentOf(generate)).toBe(llm)
    expect(Number(generate.attributes["cornserve.completion_tokens"])).toBeGreaterThan(0)

    expect(receiver.spans.filter((span) => span.traceId === unsampledTrace)).toEqual([])
  }, 60_000)

  it("starts a trace of its own for a request without a traceparent, and ignores a malformed one", async () => {
    const before = new Set(receiver.spans.map((span) => span.traceId))
    await invokeTraced("00-not-a-trace-01")
    const gateway = await eventually(async () =>
      receiver.spans.find(
        (span) => span.name === "POST /app/invoke/{id}" && !before.has(span.traceId) && span.parentSpanId === undefined
      )
    )
    await eventually(async () =>
      receiver.spans.some((span) => span.traceId === gateway.traceId && span.name === "generate") ? true : undefined
    )
  }, 60_000)
})
