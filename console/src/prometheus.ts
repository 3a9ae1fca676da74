/**
 * Prometheus's text format, as /metrics writes it, read in the browser: samples by name and labels,
 * and what the metrics page derives from two scrapes (rates, and quantiles of histogram buckets, as
 * PromQL's `rate` and `histogram_quantile` do).
 */
export interface Sample {
  readonly name: string
  readonly labels: Readonly<Record<string, string>>
  readonly value: number
}

/** Samples a scrape may hold: past it the rest is not read. */
const maxSamples = 50_000

const unescapeLabel = (text: string) =>
  text.replace(/\\(["\\n])/g, (_, escaped: string) => (escaped === "n" ? "\n" : escaped))

const labelPattern = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?\s*/y

const parseLabels = (text: string): Record<string, string> | undefined => {
  const labels: Record<string, string> = {}
  labelPattern.lastIndex = 0
  while (labelPattern.lastIndex < text.length) {
    const start = labelPattern.lastIndex
    const match = labelPattern.exec(text)
    if (match === null || labelPattern.lastIndex === start) return undefined
    labels[match[1]!] = unescapeLabel(match[2]!)
  }
  return labels
}

const parseValue = (text: string): number | undefined => {
  if (text === "+Inf") return Number.POSITIVE_INFINITY
  if (text === "-Inf") return Number.NEGATIVE_INFINITY
  if (text === "NaN") return Number.NaN
  const value = Number(text)
  return text.trim() === "" || Number.isNaN(value) ? undefined : value
}

/** The samples of a scrape; comment lines and lines it cannot read are skipped. */
export const parsePrometheus = (text: string): Array<Sample> => {
  const samples: Array<Sample> = []
  for (const rawLine of text.split("\n")) {
    if (samples.length >= maxSamples) break
    const line = rawLine.trim()
    if (line === "" || line.startsWith("#")) continue
    const brace = line.indexOf("{")
    const nameEnd = brace >= 0 ? brace : line.search(/\s/)
    if (nameEnd <= 0) continue
    const name = line.slice(0, nameEnd)
    let labels: Record<string, string> | undefined = {}
    let rest = line.slice(nameEnd)
    if (brace >= 0) {
      const close = line.lastIndexOf("}")
      if (close < brace) continue
      labels = parseLabels(line.slice(brace + 1, close))
      rest = line.slice(close + 1)
    }
    // A timestamp may follow the value.
    const value = parseValue(rest.trim().split(/\s+/)[0] ?? "")
    if (labels === undefined || value === undefined) continue
    samples.push({ name, labels, value })
  }
  return samples
}

/** One scrape: its samples grouped by metric name, and when it was taken (ms). */
export interface Scrape {
  readonly at: number
  readonly byName: ReadonlyMap<string, ReadonlyArray<Sample>>
}

export const scrapeOf = (at: number, samples: ReadonlyArray<Sample>): Scrape => {
  const byName = new Map<string, Array<Sample>>()
  for (const sample of samples) {
    const list = byName.get(sample.name)
    if (list === undefined) byName.set(sample.name, [sample])
    else list.push(sample)
  }
  return { at, byName }
}

/** A metric's values summed by one label (`by`), as `sum by (by) (metric)`. */
export const sumBy = (scrape: Scrape, name: string, by: string): Map<string, number> => {
  const sums = new Map<string, number>()
  for (const sample of scrape.byName.get(name) ?? []) {
    const key = sample.labels[by] ?? ""
    sums.set(key, (sums.get(key) ?? 0) + sample.value)
  }
  return sums
}

/**
 * A counter's increase per second between two scrapes, summed by a label. A counter that went down
 * (the platform restarted) counts from zero, as Prometheus's `rate` does.
 */
export const rateBy = (before: Scrape, after: Scrape, name: string, by: string): Map<string, number> => {
  const seconds = (after.at - before.at) / 1000
  const previous = sumBy(before, name, by)
  const rates = new Map<string, number>()
  if (seconds <= 0) return rates
  for (const [key, value] of sumBy(after, name, by)) {
    const was = previous.get(key) ?? 0
    rates.set(key, (value >= was ? value - was : value) / seconds)
  }
  return rates
}

/**
 * The `q` quantile of a histogram's observations between two scrapes, by a label, as
 * `histogram_quantile(q, sum by (by, le) (rate(name_bucket[...])))`: linear within the bucket it
 * falls in. A key with no observation in between has no quantile.
 */
export const quantileBy = (
  before: Scrape,
  after: Scrape,
  name: string,
  by: string,
  q: number,
  keep: (labels: Readonly<Record<string, string>>) => boolean = () => true
): Map<string, number> => {
  const bucketsOf = (scrape: Scrape) => {
    const byKey = new Map<string, Map<number, number>>()
    for (const sample of scrape.byName.get(`${name}_bucket`) ?? []) {
      if (!keep(sample.labels)) continue
      const le = parseValue(sample.labels.le ?? "")
      if (le === undefined) continue
      const key = sample.labels[by] ?? ""
      const buckets = byKey.get(key) ?? new Map<number, number>()
      buckets.set(le, (buckets.get(le) ?? 0) + sample.value)
      byKey.set(key, buckets)
    }
    return byKey
  }
  const earlier = bucketsOf(before)
  const quantiles = new Map<string, number>()
  for (const [key, buckets] of bucketsOf(after)) {
    const was = earlier.get(key)
    const counts = [...buckets]
      .map(([le, count]) => {
        const previous = was?.get(le) ?? 0
        return [le, count >= previous ? count - previous : count] as const
      })
      .sort((a, b) => a[0] - b[0])
    const total = counts.at(-1)?.[1] ?? 0
    if (total <= 0) continue
    const rank = q * total
    let lowerBound = 0
    let lowerCount = 0
    for (const [le, count] of counts) {
      if (count >= rank) {
        // Past the last finite bound, the quantile is that bound (as Prometheus answers).
        const value = Number.isFinite(le)
          ? lowerBound + (le - lowerBound) * ((rank - lowerCount) / Math.max(count - lowerCount, 1e-12))
          : lowerBound
        quantiles.set(key, value)
        break
      }
      lowerBound = le
      lowerCount = count
    }
  }
  return quantiles
}
