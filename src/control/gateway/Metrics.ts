import { type SidecarStats, transferSecondsBuckets } from "../../sidecar/protocol.js"
import type { AppSummary } from "../app-manager/AppManager.js"
import type { TaskSummary } from "../resource-manager/ResourceManager.js"

const escapeLabel = (value: string) => value.replaceAll("\\", "\\\\").replaceAll('"', '\\"').replaceAll("\n", "\\n")

/** One metric in the Prometheus text format: its help, its type, and a sample per label set. */
const metric = (
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

/** A histogram in the Prometheus text format, from per-bucket (not cumulative) counts. */
const histogram = (
  name: string,
  help: string,
  labels: Readonly<Record<string, string>>,
  bounds: ReadonlyArray<number>,
  values: { readonly buckets: ReadonlyArray<number>; readonly sum: number; readonly count: number }
) => {
  const rendered = Object.entries(labels).map(([key, label]) => `${key}="${escapeLabel(label)}"`)
  const withLe = (le: string) => `{${[...rendered, `le="${le}"`].join(",")}}`
  const plain = rendered.length > 0 ? `{${rendered.join(",")}}` : ""
  let cumulative = 0
  return [
    `# HELP ${name} ${help}`,
    `# TYPE ${name} histogram`,
    ...bounds.map((bound, index) => {
      cumulative += values.buckets[index] ?? 0
      return `${name}_bucket${withLe(String(bound))} ${cumulative}`
    }),
    `${name}_bucket${withLe("+Inf")} ${values.count}`,
    `${name}_sum${plain} ${values.sum}`,
    `${name}_count${plain} ${values.count}`
  ].join("\n")
}

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

/** A node's sidecar as Prometheus metrics: its arena, and chunks that crossed to or from other nodes. */
const sidecarMetrics = (sidecar: SidecarStats): ReadonlyArray<string> => {
  const node = { node: sidecar.nodeId }
  return [
    metric("cornserve_sidecar_arena_bytes", "gauge", "Size of the node's shared-memory arena.", [
      [node, sidecar.arenaBytes]
    ]),
    metric("cornserve_sidecar_bytes_in_use", "gauge", "Arena bytes held by tensors in transit.", [
      [node, sidecar.bytesInUse]
    ]),
    metric("cornserve_sidecar_slots_in_use", "gauge", "Arena slots held.", [[node, sidecar.slotsInUse]]),
    histogram(
      "cornserve_sidecar_transfer_seconds",
      "Transfers through the sidecar, from their first chunk's arrival to the release of their last by its receivers.",
      node,
      transferSecondsBuckets,
      sidecar.transferSeconds
    ),
    metric(
      "cornserve_sidecar_transferred_bytes_total",
      "counter",
      "Bytes of the finished transfers counted in cornserve_sidecar_transfer_seconds.",
      [[node, sidecar.bytesTransferred]]
    ),
    metric(
      "cornserve_sidecar_transfers_active",
      "gauge",
      "Transfers in progress: data stored, receivers waiting, or chunks not yet read.",
      [[node, sidecar.transfersActive]]
    ),
    metric(
      "cornserve_sidecar_transfers_remembered",
      "gauge",
      "Finished transfers whose record the sidecar keeps until its TTL, to refuse duplicate chunks.",
      [[node, sidecar.transfersRemembered]]
    ),
    metric("cornserve_sidecar_allocation_waits_total", "counter", "Allocations that found the arena full and waited.", [
      [node, sidecar.allocationWaits]
    ]),
    metric("cornserve_sidecar_chunks_reclaimed_total", "counter", "Chunks nobody marked done, freed after the TTL.", [
      [node, sidecar.chunksReclaimed]
    ]),
    metric(
      "cornserve_sidecar_chunks_sent_to_peers_total",
      "counter",
      "Chunks this node's sidecar streamed to other nodes' sidecars over TCP.",
      [[node, sidecar.chunksForwarded]]
    ),
    metric(
      "cornserve_sidecar_bytes_sent_to_peers_total",
      "counter",
      "Bytes this node's sidecar streamed to other nodes' sidecars over TCP.",
      [[node, sidecar.bytesForwarded]]
    ),
    metric(
      "cornserve_sidecar_chunks_received_from_peers_total",
      "counter",
      "Chunks this node's sidecar received from other nodes' sidecars over TCP.",
      [[node, sidecar.chunksReceivedRemote]]
    ),
    metric("cornserve_sidecar_peers_connected", "gauge", "Other nodes' sidecars connected to this one.", [
      [node, sidecar.peersConnected]
    ])
  ]
}

/** A data-plane node's own metrics: its sidecar (the control plane's /metrics has the rest). */
export const renderNodeMetrics = (sidecar: SidecarStats): string => `${sidecarMetrics(sidecar).join("\n")}\n`
