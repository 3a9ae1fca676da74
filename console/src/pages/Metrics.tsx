import { useState } from "preact/hooks"
import { call, readText, type Refusal } from "../api"
import { formatMs, RefusalNotice, usePolling } from "../components"
import { LineChart, type Series } from "../LineChart"
import { parsePrometheus, quantileBy, rateBy, type Scrape, scrapeOf, sumBy } from "../prometheus"

const pollMs = 2000
/** Scrapes kept: three minutes at one every two seconds. */
const keptScrapes = 90
/** Scrapes a rate and a quantile look back over: about six and ten seconds, to smooth a two-second poll. */
const rateWindow = 3
const quantileWindow = 5
const maxMetricsBytes = 8 * 1024 * 1024

type PointsByKey = Map<string, Array<readonly [number, number]>>

/** For each scrape after the first, `derive(earlier, scrape)` by key, gathered into series by key. */
const seriesOf = (
  scrapes: ReadonlyArray<Scrape>,
  window: number,
  derive: (before: Scrape, after: Scrape) => ReadonlyMap<string, number>,
  label: (key: string) => string = (key) => key || "(none)"
): Array<Series> => {
  const byKey: PointsByKey = new Map()
  scrapes.forEach((scrape, index) => {
    if (index === 0) return
    const before = scrapes[Math.max(0, index - window)]!
    for (const [key, value] of derive(before, scrape)) {
      const points = byKey.get(key) ?? []
      points.push([scrape.at, value])
      byKey.set(key, points)
    }
  })
  return [...byKey].sort(([a], [b]) => a.localeCompare(b)).map(([key, points]) => ({ name: label(key), points }))
}

const gaugeSeries = (scrapes: ReadonlyArray<Scrape>, name: string, by: string): Array<Series> =>
  seriesOf(scrapes, 0, (_, scrape) => sumBy(scrape, name, by))

/** Latency quantiles over every app's successful requests. */
const latencySeries = (scrapes: ReadonlyArray<Scrape>): Array<Series> =>
  ([0.5, 0.95, 0.99] as const).map((q) => ({
    name: `p${Math.round(q * 100)}`,
    points:
      seriesOf(scrapes, quantileWindow, (before, after) =>
        quantileBy(before, after, "cornserve_request_duration_seconds", "", q, (labels) => labels.status === "200")
      )[0]?.points ?? []
  }))

const perSecond = (y: number) => (y >= 10 ? y.toFixed(0) : y.toFixed(y >= 1 ? 1 : 2))
const seconds = (y: number) => formatMs(y * 1000)

export const MetricsPage = () => {
  const [scrapes, setScrapes] = useState<ReadonlyArray<Scrape>>([])
  const [refusal, setRefusal] = useState<Refusal | undefined>(undefined)
  const [attempt, setAttempt] = useState(0)
  usePolling(
    async (signal) => {
      // After a 401 it waits for a token rather than asking again every two seconds.
      if (refusal?.status === 401) return
      const sent = await call("/metrics", { auth: "metrics", signal })
      if (signal.aborted) return
      if (!sent.ok) return setRefusal(sent.refusal)
      const text = await readText(sent.value, maxMetricsBytes)
      if (signal.aborted) return
      setRefusal(undefined)
      const scrape = scrapeOf(Date.now(), parsePrometheus(text))
      setScrapes((kept) => [...kept.slice(-(keptScrapes - 1)), scrape])
    },
    pollMs,
    attempt
  )
  const latest = scrapes.at(-1)?.at ?? Date.now()
  const formatX = (x: number) => {
    const ago = Math.round((latest - x) / 1000)
    return ago <= 0 ? "now" : `${ago} s ago`
  }
  // From the first scrape kept (at least half a minute back), so that a fresh page's few points spread out.
  const first = Math.max(scrapes[0]?.at ?? latest, latest - keptScrapes * pollMs)
  const xDomain = [Math.min(first, latest - 30_000), latest] as const
  const charts: ReadonlyArray<{ title: string; series: Array<Series>; formatY: (y: number) => string }> = [
    {
      title: "Requests per second, by app",
      series: seriesOf(scrapes, rateWindow, (a, b) => rateBy(a, b, "cornserve_request_duration_seconds_count", "app")),
      formatY: perSecond
    },
    { title: "Request latency (status 200, all apps)", series: latencySeries(scrapes), formatY: seconds },
    {
      title: "p95 latency, by app",
      series: seriesOf(scrapes, quantileWindow, (a, b) =>
        quantileBy(a, b, "cornserve_request_duration_seconds", "app", 0.95)
      ),
      formatY: seconds
    },
    {
      title: "Requests in flight, by app",
      series: gaugeSeries(scrapes, "cornserve_app_requests_in_flight", "app"),
      formatY: perSecond
    },
    {
      title: "Errors per second, by app",
      series: seriesOf(scrapes, rateWindow, (a, b) => rateBy(a, b, "cornserve_request_errors_total", "app")),
      formatY: perSecond
    },
    {
      title: "Shed per second: app requests and task calls",
      series: [
        ...seriesOf(
          scrapes,
          rateWindow,
          (a, b) => rateBy(a, b, "cornserve_requests_shed_total", "app"),
          (key) => `app ${key}`
        ),
        ...seriesOf(
          scrapes,
          rateWindow,
          (a, b) => rateBy(a, b, "cornserve_task_calls_shed_total", "task"),
          (key) => `task ${key}`
        )
      ],
      formatY: perSecond
    },
    {
      title: "Time to first token (p50), by task",
      series: seriesOf(scrapes, quantileWindow, (a, b) =>
        quantileBy(a, b, "cornserve_stream_first_chunk_seconds", "task", 0.5)
      ),
      formatY: seconds
    },
    {
      title: "Executor call latency (p50), by task",
      series: seriesOf(scrapes, quantileWindow, (a, b) =>
        quantileBy(a, b, "cornserve_executor_call_seconds", "task", 0.5)
      ),
      formatY: seconds
    }
  ]
  return (
    <div class="page metrics">
      <section class="panel">
        <h2>Metrics</h2>
        <p class="hint">
          Read from <code>/metrics</code> every {pollMs / 1000} s ({scrapes.length} scrape
          {scrapes.length === 1 ? "" : "s"} kept); rates and quantiles over the last few seconds, as Prometheus's{" "}
          <code>rate</code> and <code>histogram_quantile</code> compute them.
        </p>
        {refusal !== undefined && (
          <RefusalNotice
            refusal={refusal}
            onRetry={() => {
              setRefusal(undefined)
              setAttempt((value) => value + 1)
            }}
          />
        )}
        <div class="charts">
          {charts.map((chart) => (
            <LineChart
              key={chart.title}
              title={chart.title}
              series={chart.series}
              formatX={formatX}
              formatY={chart.formatY}
              xDomain={xDomain}
              empty={scrapes.length < 2 ? "waiting for a second scrape" : "nothing measured in this window"}
            />
          ))}
        </div>
      </section>
    </div>
  )
}
