import { histograms, metric } from "../../metrics/PrometheusText.js"
import { sidecarMetrics } from "../../sidecar/SidecarMetrics.js"
import type { SidecarStats } from "../../sidecar/protocol.js"
import type { AppSummary } from "../app-manager/AppManager.js"
import type { TaskSummary } from "../resource-manager/ResourceManager.js"
import { coldStartBuckets } from "../task-manager/IdleRelease.js"

/** The platform's state as Prometheus metrics: apps, requests, tasks and their executors, the sidecar. */
export const renderMetrics = (state: {
  readonly apps: ReadonlyArray<AppSummary>
  readonly inFlight: number
  readonly tasks: ReadonlyArray<TaskSummary>
  readonly sidecar: SidecarStats | undefined
  /** Devices moved by rebalancing (--autoscale), by kind: onto a free device, or taken from a task with slack. */
  readonly rebalanceMoves?: ReadonlyMap<string, number>
}): string => {
  const sections = [
    metric(
      "cornserve_apps",
      "gauge",
      "Registered apps by state.",
      [...new Set(state.apps.map((app) => app.state))].map(
        (appState) => [{ state: appState }, state.apps.filter((app) => app.state === appState).length] as const
      )
    ),
    metric(
      "cornserve_app_requests_in_flight",
      "gauge",
      "Requests being served, by app.",
      state.apps.map((app) => [{ app: app.id }, app.inFlight] as const)
    ),
    metric("cornserve_gateway_requests_in_flight", "gauge", "HTTP requests open at the gateway.", [
      [{}, state.inFlight]
    ]),
    metric(
      "cornserve_task_executors",
      "gauge",
      "Executors of each deployed unit task, by health.",
      state.tasks.flatMap((task) => [
        [
          { task: task.id, name: task.name, healthy: "true" },
          task.executors.filter((executor) => executor.healthy).length
        ] as const,
        [
          { task: task.id, name: task.name, healthy: "false" },
          task.executors.filter((executor) => !executor.healthy).length
        ] as const
      ])
    ),
    metric(
      "cornserve_task_outstanding_requests",
      "gauge",
      "Requests each task's executors are working on.",
      state.tasks.map(
        (task) => [{ task: task.id }, task.executors.reduce((sum, executor) => sum + executor.outstanding, 0)] as const
      )
    ),
    metric(
      "cornserve_task_calls_shed_total",
      "counter",
      "Calls each task refused at the dispatcher because it was full (serve --task-queue per executor): 503 to the client.",
      state.tasks.map((task) => [{ task: task.id }, task.callsShed] as const)
    ),
    metric(
      "cornserve_task_released",
      "gauge",
      "1 while a task's executors are stopped because it was idle (serve --idle-release, its config's idleReleaseS), else 0.",
      state.tasks.map((task) => [{ task: task.id }, task.state === "released" ? 1 : 0] as const)
    ),
    metric(
      "cornserve_task_releases_total",
      "counter",
      "Times each task's executors stopped because no call came for its idle time.",
      state.tasks.map((task) => [{ task: task.id }, task.idleRelease.releases] as const)
    ),
    metric(
      "cornserve_task_cold_starts_failed_total",
      "counter",
      "Cold starts of a released task that failed: the calls waiting for them got an error, the next call tries again.",
      state.tasks.map((task) => [{ task: task.id }, task.idleRelease.coldStartsFailed] as const)
    ),
    histograms(
      "cornserve_task_cold_start_seconds",
      "Cold starts of a released task, from its next call to its executors running again, by task.",
      coldStartBuckets,
      state.tasks.map((task) => [{ task: task.id }, task.idleRelease.coldStarts] as const)
    )
  ]
  if (state.rebalanceMoves !== undefined) {
    sections.push(
      metric(
        "cornserve_rebalance_moves_total",
        "counter",
        "Executors rebalancing moved: given to a bottleneck task on a free device, on one taken from a task with slack or on a CPU device it shares with calm tasks; released because the task's profile showed no gain from them, or given back from a shared device because the task had slack.",
        ["free_device", "taken_from_slack", "shared_device", "released", "unshared"].map(
          (kind) => [{ kind }, state.rebalanceMoves!.get(kind) ?? 0] as const
        )
      )
    )
  }
  if (state.sidecar !== undefined) sections.push(...sidecarMetrics(state.sidecar))
  return `${sections.join("\n")}\n`
}
