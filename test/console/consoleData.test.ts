import { Counter, Histogram, Registry } from "prom-client"
import { describe, expect, it } from "vitest"
import { parsePrometheus, quantileBy, rateBy, scrapeOf, sumBy } from "../../console/src/prometheus.js"
import { base64Bytes, bytesBase64, wavOf } from "../../console/src/wav.js"
import { wavFile } from "../../src/executors/common/media/Wav.js"

/**
 * What the console computes in the browser from the platform's answers, run here on the same
 * inputs: prom-client's exposition (what /metrics writes) read back to the values recorded, rates
 * and histogram quantiles as PromQL computes them, and streamed PCM16 chunks gathered into the WAV
 * file Geri itself writes.
 */

const scrapeText = async (registry: Registry) => registry.metrics()

describe("the console's Prometheus reader", () => {
  it("reads prom-client's exposition: names, labels (escaped too) and values", async () => {
    const registry = new Registry()
    const requests = new Counter({
      name: "app_requests_total",
      help: "h",
      labelNames: ["app", "status"],
      registers: [registry]
    })
    requests.inc({ app: "color_chat", status: "200" }, 3)
    requests.inc({ app: 'say "hi"\\\nnow', status: "500" })
    const samples = parsePrometheus(await scrapeText(registry))
    expect(samples).toEqual([
      { name: "app_requests_total", labels: { app: "color_chat", status: "200" }, value: 3 },
      { name: "app_requests_total", labels: { app: 'say "hi"\\\nnow', status: "500" }, value: 1 }
    ])
    // Lines it cannot read are skipped, not fatal.
    expect(parsePrometheus('# HELP x\nbroken{a="1" 2\nok 4\nnan NaN\ninf +Inf\n')).toEqual([
      { name: "ok", labels: {}, value: 4 },
      { name: "nan", labels: {}, value: Number.NaN },
      { name: "inf", labels: {}, value: Number.POSITIVE_INFINITY }
    ])
  })

  it("computes rates by label between two scrapes, and counts a reset counter from zero", async () => {
    const registry = new Registry()
    const requests = new Counter({
      name: "app_requests_total",
      help: "h",
      labelNames: ["app", "status"],
      registers: [registry]
    })
    requests.inc({ app: "a", status: "200" }, 10)
    requests.inc({ app: "a", status: "500" }, 2)
    const before = scrapeOf(1000, parsePrometheus(await scrapeText(registry)))
    requests.inc({ app: "a", status: "200" }, 6)
    requests.inc({ app: "b", status: "200" }, 4)
    const after = scrapeOf(3000, parsePrometheus(await scrapeText(registry)))
    expect(sumBy(after, "app_requests_total", "app")).toEqual(
      new Map([
        ["a", 18],
        ["b", 4]
      ])
    )
    expect(rateBy(before, after, "app_requests_total", "app")).toEqual(
      new Map([
        ["a", 3],
        ["b", 2]
      ])
    )
    // A restart: the counter is lower than before, so all of it is new.
    const restarted = scrapeOf(5000, [{ name: "app_requests_total", labels: { app: "a" }, value: 4 }])
    expect(rateBy(after, restarted, "app_requests_total", "app").get("a")).toBe(2)
  })

  it("computes histogram quantiles of the observations between two scrapes, as histogram_quantile does", async () => {
    const registry = new Registry()
    const latency = new Histogram({
      name: "app_request_seconds",
      help: "h",
      labelNames: ["app"],
      buckets: [0.1, 0.2, 0.4, 0.8],
      registers: [registry]
    })
    // Observations before the first scrape do not count.
    for (let i = 0; i < 50; i++) latency.observe({ app: "a" }, 0.7)
    const before = scrapeOf(0, parsePrometheus(await scrapeText(registry)))
    // 10 observations: 4 in (0, 0.1], 4 in (0.1, 0.2], 2 in (0.2, 0.4].
    for (const value of [0.05, 0.05, 0.05, 0.05, 0.15, 0.15, 0.15, 0.15, 0.3, 0.3]) latency.observe({ app: "a" }, value)
    latency.observe({ app: "b" }, 5)
    const after = scrapeOf(2000, parsePrometheus(await scrapeText(registry)))
    const median = quantileBy(before, after, "app_request_seconds", "app", 0.5)
    // Rank 5 of 10 falls in (0.1, 0.2], one of its 4: 0.1 + 0.1 × 1/4.
    expect(median.get("a")).toBeCloseTo(0.125, 12)
    expect(quantileBy(before, after, "app_request_seconds", "app", 0.9).get("a")).toBeCloseTo(0.3, 12)
    // Past the last finite bound: that bound.
    expect(median.get("b")).toBe(0.8)
    // No observation between the scrapes: no quantile.
    expect(quantileBy(after, after, "app_request_seconds", "app", 0.5).size).toBe(0)
  })
})

describe("the console's WAV of streamed chunks", () => {
  it("is the file Geri writes for the same samples, whatever the chunks", async () => {
    const samples = Int16Array.from({ length: 1001 }, (_, i) => Math.round(Math.sin(i / 7) * 20000))
    const chunks = [samples.subarray(0, 1), samples.subarray(1, 500), samples.subarray(500)]
    // As the app's answer carries them: base64 of PCM16 little-endian.
    const lines = chunks.map((chunk) => bytesBase64(new Uint8Array(chunk.buffer, chunk.byteOffset, chunk.byteLength)))
    const blob = wavOf(lines.map(base64Bytes), 24000)
    expect(blob.type).toBe("audio/wav")
    expect(Buffer.from(await blob.arrayBuffer())).toEqual(wavFile([samples], 24000))
  })

  it("drops the odd byte of a broken chunk rather than shift every later sample", async () => {
    const blob = wavOf([Uint8Array.of(1, 0, 9), Uint8Array.of(2, 0)], 16000)
    const bytes = new Uint8Array(await blob.arrayBuffer())
    expect(bytes.length).toBe(44 + 4)
    expect([...bytes.subarray(44)]).toEqual([1, 0, 2, 0])
  })
})
