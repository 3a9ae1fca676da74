import { histogram, metric } from "../metrics/PrometheusText.js"
import { type SidecarStats, transferSecondsBuckets } from "./protocol.js"

/** A node's sidecar as Prometheus metrics: its arena, and chunks that crossed to or from other nodes. */
export const sidecarMetrics = (sidecar: SidecarStats): ReadonlyArray<string> => {
  const node = { node: sidecar.nodeId }
  return [
    metric("cornserve_sidecar_arena_bytes", "gauge", "Size of the node's shared-memory arena.", [
      [node, sidecar.arenaBytes]
    ]),
    metric(
      "cornserve_sidecar_arena_committed_bytes",
      "gauge",
      "Bytes of the arena that hold memory, grown as its slots are first handed out.",
      [[node, sidecar.arenaCommittedBytes]]
    ),
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
