/** The Prometheus text exposition format, written by hand where a registry would only copy state. */
const escapeLabel = (value: string) => value.replaceAll("\\", "\\\\").replaceAll('"', '\\"').replaceAll("\n", "\\n")

/** One metric in the Prometheus text format: its help, its type, and a sample per label set. */
export const metric = (
  name: string,
  type: "gauge" | "counter",
  help: string,
  samples: ReadonlyArray<readonly [Readonly<Record<string, string>>, number]>
) =>
  [
    `# HELP ${name} ${help}`,
    `# TYPE ${name} ${type}`,
    ...samples.map(([labels, value]) => {
      const rendered = Object.entries(labels).map(([key, label]) => `${key}="${escapeLabel(label)}"`)
      return `${name}${rendered.length > 0 ? `{${rendered.join(",")}}` : ""} ${value}`
    })
  ].join("\n")

/** A histogram's values: per-bucket (not cumulative) counts, their sum and count. */
export interface HistogramValues {
  readonly buckets: ReadonlyArray<number>
  readonly sum: number
  readonly count: number
}

/** A histogram in the Prometheus text format, from per-bucket (not cumulative) counts. */
export const histogram = (
  name: string,
  help: string,
  labels: Readonly<Record<string, string>>,
  bounds: ReadonlyArray<number>,
  values: HistogramValues
) => histograms(name, help, bounds, [[labels, values]])

/** A histogram with a series per label set, in the Prometheus text format. */
export const histograms = (
  name: string,
  help: string,
  bounds: ReadonlyArray<number>,
  series: ReadonlyArray<readonly [Readonly<Record<string, string>>, HistogramValues]>
) =>
  [
    `# HELP ${name} ${help}`,
    `# TYPE ${name} histogram`,
    ...series.flatMap(([labels, values]) => {
      const rendered = Object.entries(labels).map(([key, label]) => `${key}="${escapeLabel(label)}"`)
      const withLe = (le: string) => `{${[...rendered, `le="${le}"`].join(",")}}`
      const plain = rendered.length > 0 ? `{${rendered.join(",")}}` : ""
      let cumulative = 0
      return [
        ...bounds.map((bound, index) => {
          cumulative += values.buckets[index] ?? 0
          return `${name}_bucket${withLe(String(bound))} ${cumulative}`
        }),
        `${name}_bucket${withLe("+Inf")} ${values.count}`,
        `${name}_sum${plain} ${values.sum}`,
        `${name}_count${plain} ${values.count}`
      ]
    })
  ].join("\n")
