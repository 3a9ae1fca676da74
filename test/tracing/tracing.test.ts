import { describe, expect, it } from "vitest"
import {
  formatTraceparent,
  noSpan,
  parseHeaderList,
  parseTraceparent,
  startSpan,
  traceSettingsOf
} from "../../src/tracing/Tracing.js"

const traceId = "0af7651916cd43dd8448eb211c80319c"
const spanId = "b7ad6b7169203331"

describe("W3C traceparent", () => {
  it("reads a valid header and writes it back", () => {
    const header = `00-${traceId}-${spanId}-01`
    expect(parseTraceparent(header)).toEqual({ traceId, spanId, sampled: true })
    expect(formatTraceparent(parseTraceparent(header)!)).toBe(header)
    expect(parseTraceparent(`00-${traceId}-${spanId}-00`)?.sampled).toBe(false)
    expect(parseTraceparent(` 00-${traceId.toUpperCase()}-${spanId}-03 `)).toEqual({ traceId, spanId, sampled: true })
    // A later version may carry more fields; version 00 may not.
    expect(parseTraceparent(`01-${traceId}-${spanId}-01-extra`)).toEqual({ traceId, spanId, sampled: true })
  })

  it("ignores what the spec says to ignore", () => {
    for (const header of [
      undefined,
      ["a", "b"],
      "",
      "garbage",
      `ff-${traceId}-${spanId}-01`,
      `00-${traceId}-${spanId}-01-extra`,
      `00-${"0".repeat(32)}-${spanId}-01`,
      `00-${traceId}-${"0".repeat(16)}-01`,
      `00-${traceId.slice(1)}-${spanId}-01`,
      `00-${traceId}-${spanId}-1`,
      `00-${traceId}-${spanId}-zz`
    ]) {
      expect(parseTraceparent(header), String(header)).toBeUndefined()
    }
  })
})

describe("settings from OTEL_* variables", () => {
  it("are off without an endpoint, or when disabled", () => {
    expect(traceSettingsOf({})).toBeUndefined()
    expect(traceSettingsOf({ OTEL_EXPORTER_OTLP_ENDPOINT: "  " })).toBeUndefined()
    expect(traceSettingsOf({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318", OTEL_SDK_DISABLED: "TRUE" })).toBeUndefined()
    expect(
      traceSettingsOf({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318", OTEL_TRACES_EXPORTER: "none" })
    ).toBeUndefined()
  })

  it("take the standard defaults", () => {
    expect(traceSettingsOf({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://collector:4318/" })).toEqual({
      url: "http://collector:4318/v1/traces",
      headers: {},
      protocol: "http/protobuf",
      exportIntervalMs: 5_000,
      maxBatchSize: 512,
      serviceName: "cornserve"
    })
  })

  it("let the traces variables win over the general ones", () => {
    const settings = traceSettingsOf({
      OTEL_EXPORTER_OTLP_ENDPOINT: "http://general:4318",
      OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "http://traces:9999/custom",
      OTEL_EXPORTER_OTLP_HEADERS: "Authorization=Bearer%20general,x-team=a",
      OTEL_EXPORTER_OTLP_TRACES_HEADERS: "authorization=Bearer%20traces",
      OTEL_EXPORTER_OTLP_PROTOCOL: "http/protobuf",
      OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: "http/json",
      OTEL_BSP_SCHEDULE_DELAY: "250",
      OTEL_BSP_MAX_EXPORT_BATCH_SIZE: "64",
      OTEL_SERVICE_NAME: "shop",
      OTEL_TRACES_EXPORTER: "otlp,console"
    })
    expect(settings).toEqual({
      url: "http://traces:9999/custom",
      headers: { authorization: "Bearer traces", "x-team": "a" },
      protocol: "http/json",
      exportIntervalMs: 250,
      maxBatchSize: 64,
      serviceName: "shop"
    })
  })

  it("read header lists leniently", () => {
    expect(parseHeaderList("a=1, b = two%2C ,=x,novalue,c=%E0%A4%A")).toEqual({ a: "1", b: "two,", c: "%E0%A4%A" })
    expect(parseHeaderList(undefined)).toEqual({})
  })
})

describe("spans while this process does not export", () => {
  it("record nothing and pass the caller's trace on", () => {
    expect(startSpan("root", { root: true })).toBe(noSpan)
    expect(startSpan("child", { parent: noSpan })).toBe(noSpan)
    const header = `00-${traceId}-${spanId}-01`
    const passed = startSpan("child", { parent: header })
    expect(passed.traceparent).toBe(header)
    expect(startSpan("grandchild", { parent: passed }).traceparent).toBe(header)
    expect(() => passed.end(new Error("no-op"))).not.toThrow()
  })
})
