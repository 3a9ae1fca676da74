import { readFileSync } from "node:fs"
import { join } from "node:path"
import { describe, expect, it } from "vitest"
import { repoRoot } from "../support/platform.js"

/** The Grafana dashboard of the gateway's /metrics, checked against the metrics the source defines. */
const dashboardPath = join(repoRoot, "deploy", "grafana", "cornserve.json")
/** How the panels name their datasource: the DS_PROMETHEUS input, or the variable of that name. */
const datasourceUid = `\${DS_PROMETHEUS}`
const metricSources = [
  join(repoRoot, "src", "control", "metrics", "PlatformMetrics.ts"),
  join(repoRoot, "src", "control", "gateway", "Metrics.ts"),
  join(repoRoot, "src", "sidecar", "SidecarMetrics.ts")
]

interface DataSourceRef {
  readonly type?: string
  readonly uid?: string
}

interface Target {
  readonly expr?: string
  readonly refId?: string
  readonly datasource?: DataSourceRef
}

interface Panel {
  readonly id?: number
  readonly type?: string
  readonly title?: string
  readonly datasource?: DataSourceRef
  readonly targets?: ReadonlyArray<Target>
  readonly gridPos?: { readonly x: number; readonly y: number; readonly w: number; readonly h: number }
  readonly fieldConfig?: { readonly defaults?: { readonly unit?: string } }
  readonly panels?: ReadonlyArray<Panel>
}

interface Variable {
  readonly name?: string
  readonly type?: string
  readonly multi?: boolean
  readonly includeAll?: boolean
  readonly datasource?: DataSourceRef
  readonly definition?: string
  readonly query?: string | { readonly query?: string }
}

interface Dashboard {
  readonly __inputs?: ReadonlyArray<{ readonly name?: string; readonly type?: string; readonly pluginId?: string }>
  readonly schemaVersion?: number
  readonly title?: string
  readonly uid?: string
  readonly panels?: ReadonlyArray<Panel>
  readonly templating?: { readonly list?: ReadonlyArray<Variable> }
}

const dashboard: Dashboard = JSON.parse(readFileSync(dashboardPath, "utf8"))

/** Every panel, rows and the panels a collapsed row holds included. */
const allPanels: ReadonlyArray<Panel> = (dashboard.panels ?? []).flatMap((panel) => [panel, ...(panel.panels ?? [])])
const rows = allPanels.filter((panel) => panel.type === "row")
const dataPanels = allPanels.filter((panel) => panel.type !== "row")
const variables = dashboard.templating?.list ?? []
const variable = (name: string) => variables.find((candidate) => candidate.name === name)
const variableQuery = (candidate: Variable | undefined) =>
  typeof candidate?.query === "string" ? candidate.query : (candidate?.query?.query ?? "")

const exprs: ReadonlyArray<{ readonly panel: string; readonly expr: string }> = dataPanels.flatMap((panel) =>
  (panel.targets ?? []).map((target) => ({ panel: panel.title ?? `#${panel.id}`, expr: target.expr ?? "" }))
)

/** The metric names the source defines: its string literals that start with cornserve_. */
const sourceText = metricSources.map((file) => readFileSync(file, "utf8")).join("\n")
const definedNames = new Set([...sourceText.matchAll(/["'`](cornserve_[A-Za-z0-9_]+)["'`]/g)].map((match) => match[1]!))
/** The histograms among them: built by a `histogram(` helper or as a prom-client `new Histogram({ name })`. */
const histogramNames = new Set(
  [
    ...sourceText.matchAll(/histogram\(\s*["'`](cornserve_[A-Za-z0-9_]+)["'`]/g),
    ...sourceText.matchAll(/new Histogram(?:<[^>]*>)?\(\s*\{\s*name:\s*["'`](cornserve_[A-Za-z0-9_]+)["'`]/g)
  ].map((match) => match[1]!)
)

const histogramSuffix = /_(bucket|sum|count)$/

/** The metric a name in a query reads: a histogram's series name less its suffix. */
const baseMetric = (name: string): string => {
  const base = name.replace(histogramSuffix, "")
  return base !== name && histogramNames.has(base) ? base : name
}

const metricNamesIn = (expr: string): ReadonlyArray<string> =>
  [...expr.matchAll(/\bcornserve_[A-Za-z0-9_]+/g)].map((match) => match[0])

describe("Grafana dashboard", () => {
  it("is a dashboard Grafana imports, its datasource an input and a variable", () => {
    expect(dashboard.title).toBe("Cornserve")
    expect(dashboard.uid).toMatch(/^[A-Za-z0-9_-]{1,40}$/)
    expect(dashboard.schemaVersion).toBeGreaterThanOrEqual(36)
    expect(dashboard.__inputs).toContainEqual(
      expect.objectContaining({ name: "DS_PROMETHEUS", type: "datasource", pluginId: "prometheus" })
    )
    expect(variable("DS_PROMETHEUS")).toMatchObject({ type: "datasource", query: "prometheus" })
  })

  it("has the app and task variables, multi-valued with All", () => {
    const app = variable("app")
    const task = variable("task")
    expect(app).toMatchObject({ type: "query", multi: true, includeAll: true })
    expect(task).toMatchObject({ type: "query", multi: true, includeAll: true })
    expect(variableQuery(app)).toBe("label_values(cornserve_request_duration_seconds_count, app)")
    expect(variableQuery(task)).toBe("label_values(cornserve_executor_call_seconds_count, task)")
    for (const candidate of [app, task]) expect(candidate?.datasource?.uid).toBe(datasourceUid)
  })

  it("groups its panels in rows", () => {
    expect(rows.map((row) => row.title)).toEqual(["Requests", "Platform overhead", "Tasks", "Sidecar"])
    expect(dataPanels.length).toBeGreaterThan(20)
  })

  it("gives every panel a title, the datasource, and queries", () => {
    for (const panel of dataPanels) {
      const name = panel.title ?? `#${panel.id}`
      expect(panel.title, `panel #${panel.id}`).toMatch(/\S/)
      expect(panel.datasource, name).toEqual({ type: "prometheus", uid: datasourceUid })
      expect(panel.targets?.length ?? 0, name).toBeGreaterThan(0)
      for (const target of panel.targets ?? []) {
        expect(target.expr, name).toMatch(/cornserve_/)
        expect(target.refId, name).toMatch(/^[A-Z]$/)
      }
      expect(new Set(panel.targets?.map((target) => target.refId)).size, name).toBe(panel.targets?.length)
      expect(panel.fieldConfig?.defaults?.unit, name).toBeDefined()
    }
  })

  it("gives every panel its own id and its own place on the grid", () => {
    const ids = allPanels.map((panel) => panel.id)
    for (const id of ids) expect(Number.isInteger(id)).toBe(true)
    expect(new Set(ids).size).toBe(ids.length)
    const placed = (dashboard.panels ?? []).map((panel) => ({ title: panel.title, ...panel.gridPos! }))
    for (const [index, a] of placed.entries()) {
      expect(a.x + a.w, a.title).toBeLessThanOrEqual(24)
      for (const b of placed.slice(index + 1)) {
        const overlap = a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h
        expect(overlap, `${a.title} overlaps ${b.title}`).toBe(false)
      }
    }
  })

  it("finds the metric definitions in the source", () => {
    // A guard on the extraction itself: a change in how the source defines metrics shows here first.
    expect(definedNames).toContain("cornserve_request_duration_seconds")
    expect(definedNames).toContain("cornserve_task_executors")
    expect(histogramNames).toContain("cornserve_request_duration_seconds")
    expect(histogramNames).toContain("cornserve_sidecar_transfer_seconds")
    expect(histogramNames).not.toContain("cornserve_request_errors_total")
  })

  it("reads only metrics the source defines", () => {
    const queries = [
      ...exprs,
      ...variables.map((candidate) => ({ panel: `variable ${candidate.name}`, expr: variableQuery(candidate) }))
    ]
    const undefinedNames = queries.flatMap(({ panel, expr }) =>
      metricNamesIn(expr)
        .filter((name) => !definedNames.has(baseMetric(name)))
        .map((name) => `${panel}: ${name}`)
    )
    expect(undefinedNames).toEqual([])
    // A histogram has no series of its bare name, only _bucket, _sum and _count.
    const bareHistograms = queries.flatMap(({ panel, expr }) =>
      metricNamesIn(expr)
        .filter((name) => histogramNames.has(name))
        .map((name) => `${panel}: ${name}`)
    )
    expect(bareHistograms).toEqual([])
  })

  it("takes quantiles over summed bucket rates and rates over the rate interval", () => {
    for (const { panel, expr } of exprs) {
      const quantiles = [...expr.matchAll(/histogram_quantile\(([^,]+),\s*sum by \(([^)]*)\) \(rate\((\w+)/g)]
      expect(quantiles.length, panel).toBe(expr.split("histogram_quantile(").length - 1)
      for (const quantile of quantiles) {
        expect(Number(quantile[1]), panel).toBeGreaterThan(0)
        expect(
          quantile[2]!.split(",").map((label) => label.trim()),
          panel
        ).toContain("le")
        expect(quantile[3], panel).toMatch(/_bucket$/)
      }
      for (const range of expr.matchAll(/\[([^\]]+)\]/g)) expect(range[1], panel).toBe("$__rate_interval")
    }
    expect(exprs.filter(({ expr }) => expr.includes("histogram_quantile(")).length).toBeGreaterThan(0)
  })
})
