/**
 * The cluster: color_chat served by a control plane and data-plane processes of the real binary on
 * this machine, with its encoders and its LLM on one node (the features go through shared memory)
 * and on two nodes (they go between the nodes' sidecars over TCP), one after the other in the same
 * run, each measured at the same concurrency: throughput and latency percentiles.
 *
 * Then the cross-node hop alone, for a 7 MiB tensor: from `send` on node A's sidecar until an
 * executor process on node B holds it, against the same bytes over raw TCP between two Node
 * processes on the same address, sample for sample: read as Node reads a socket by default, and
 * into one large buffer (onread) as the receiving sidecar reads, the stricter baseline; the ratio
 * is against the stricter one.
 *
 * Nodes share the loopback address here: what is measured is the platform's own cost of the hop
 * (the sidecars' protocol, copies and arenas), not a network's.
 *
 * Env: BENCH_SECONDS (measured seconds per layout, default 10), BENCH_CONCURRENCY (default 4),
 * BENCH_SAMPLES (7 MiB hops, default 30). Prints a table, then (last line) one JSON object.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { availableParallelism, tmpdir } from "node:os"
import { join } from "node:path"
import { arenaFilePrefix } from "../src/sidecar/Arena.js"
import { SidecarClient } from "../src/sidecar/SidecarClient.js"
import { type RunningSidecar, startSidecar } from "../src/sidecar/SidecarProcess.js"
import { Tensor } from "../src/sidecar/Tensor.js"
import {
  dataPlaneArgs,
  eventually,
  freePort,
  invoke,
  removeStateDir,
  repoRoot,
  type RunningPlatform,
  runCli,
  startPlatform
} from "../test/support/platform.js"
import { chatRequest, outcomeOf } from "../test/support/colorChatRequest.js"
import { bundlePeer, children, forkPeer, handOff, rawTcpNs } from "./support/peers.js"

const MiB = 1024 * 1024
const SECONDS = Number(process.env.BENCH_SECONDS ?? 10)
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 4)
const SAMPLES = Number(process.env.BENCH_SAMPLES ?? 30)
const WARMUP_REQUESTS = 20
const HOP_BYTES = 7 * MiB
const token = "bench-cluster-token"

const round = (value: number, digits = 2) => Number(value.toFixed(digits))
const percentile = (values: ReadonlyArray<number>, p: number) => {
  if (values.length === 0) return Number.NaN
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1))]!
}

interface Layout {
  readonly name: string
  /** Each data-plane node's devices. */
  readonly nodes: ReadonlyArray<string>
}

interface LayoutResult {
  readonly layout: string
  readonly placement: string
  readonly requests: number
  readonly errors: number
  readonly rps: number
  readonly p50Ms: number
  readonly p99Ms: number
}

/** A control plane and `layout`'s nodes, color_chat registered, then a closed loop at CONCURRENCY. */
async function measureLayout(layout: Layout, scratch: string): Promise<LayoutResult> {
  const clusterPort = await freePort()
  const nodes: Array<ChildProcess> = []
  let controlPlane: RunningPlatform | undefined
  try {
    controlPlane = await startPlatform({
      // No cache of encoder outputs: every request sends the same image, and the hop of its features is measured.
      args: ["--role", "control-plane", "--cluster-port", String(clusterPort), "--embedding-cache-bytes", "0"],
      env: { CORNSERVE_CLUSTER_TOKEN: token }
    })
    for (const [index, devices] of layout.nodes.entries()) {
      const name = `${layout.name}-${index}`
      const node = spawn(
        process.execPath,
        dataPlaneArgs(`http://127.0.0.1:${clusterPort}`, name, devices, [
          "--sidecar-arena-bytes",
          String(64 * MiB),
          "--state-dir",
          join(scratch, name)
        ]),
        {
          cwd: repoRoot,
          env: { ...process.env, CORNSERVE_CLUSTER_TOKEN: token, CORNSERVE_MODEL_DIR: join(scratch, `${name}-models`) },
          stdio: "ignore"
        }
      )
      nodes.push(node)
      children.add(node)
    }
    const url = controlPlane.url
    await eventually(async () => {
      const listed = (await (await fetch(`${url}/nodes/list`)).json()) as { nodes: Array<{ state: string }> }
      return listed.nodes.filter((node) => node.state === "ready").length === layout.nodes.length ? true : undefined
    })
    const registered = await runCli(["app", "register", join(repoRoot, "examples", "color_chat.ts")], {
      CORNSERVE_GATEWAY_URL: url
    })
    if (registered.code !== 0) throw new Error(`registering color_chat failed: ${registered.stderr}`)
    const { tasks } = (await (await fetch(`${url}/tasks/list`)).json()) as {
      tasks: Array<{ name: string; executors: Array<{ node: string }> }>
    }
    const nodeOf = (prefix: string) => tasks.find((task) => task.name.startsWith(prefix))!.executors[0]!.node
    const placement = `image encoder on ${nodeOf("encoder-image")}, LLM on ${nodeOf("llm")}`
    const apart = nodeOf("encoder-image") !== nodeOf("llm")
    if (apart !== layout.nodes.length > 1) throw new Error(`${layout.name}: unexpected placement (${placement})`)

    const one = () =>
      invoke(url, "color_chat", chatRequest)
        .then(outcomeOf)
        .then((outcome) => ("text" in outcome ? outcome.text : "failed"))
    for (let i = 0; i < WARMUP_REQUESTS; i++) await one()
    const latencies: Array<number> = []
    let errors = 0
    const started = performance.now()
    const deadline = started + SECONDS * 1000
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (performance.now() < deadline) {
          const sent = performance.now()
          const text = await one().catch(() => "failed")
          if (text === "red") latencies.push(performance.now() - sent)
          else errors++
        }
      })
    )
    const elapsed = (performance.now() - started) / 1000
    return {
      layout: layout.name,
      placement,
      requests: latencies.length,
      errors,
      rps: round(latencies.length / elapsed),
      p50Ms: round(percentile(latencies, 0.5), 1),
      p99Ms: round(percentile(latencies, 0.99), 1)
    }
  } finally {
    for (const node of nodes) if (node.exitCode === null) node.kill("SIGTERM")
    await Promise.all(
      nodes.map((node) => (node.exitCode !== null ? undefined : new Promise((resolve) => node.once("exit", resolve))))
    )
    if (controlPlane !== undefined) {
      await controlPlane.stop()
      await removeStateDir(controlPlane.stateDir)
    }
  }
}

interface HopResult {
  readonly sidecarP50Ms: number
  readonly sidecarP99Ms: number
  /** Raw TCP read as Node reads a socket by default (a new buffer per read). */
  readonly rawTcpP50Ms: number
  readonly rawTcpP99Ms: number
  /** Raw TCP read into one large buffer (onread), as the receiving sidecar reads: the stricter baseline. */
  readonly rawTcpOnreadP50Ms: number
  readonly rawTcpOnreadP99Ms: number
  /** The sidecars' p50 minus the stricter baseline's. */
  readonly addedP50Ms: number
  readonly ratio: number
}

/** A 7 MiB tensor from node A's sidecar to an executor on node B, against raw TCP, interleaved. */
async function measureHop(scratch: string): Promise<HopResult> {
  const peerScript = await bundlePeer()
  const sidecars: Array<RunningSidecar> = []
  const clients: Array<SidecarClient> = []
  try {
    const start = async (nodeId: string) => {
      const sidecar = await startSidecar({
        binPath: "bin/cornserve",
        nodeId,
        socketPath: join(scratch, `${nodeId}.sock`),
        arenaPath: `/dev/shm/${arenaFilePrefix}bench-${nodeId}-${process.pid}`,
        arenaBytes: 64 * MiB
      })
      sidecars.push(sidecar)
      return sidecar
    }
    const [nodeA, nodeB] = await Promise.all([start("hop-a"), start("hop-b")])
    const onA = await SidecarClient.connect(nodeA.socketPath)
    const onB = await SidecarClient.connect(nodeB.socketPath)
    clients.push(onA, onB)
    await onA.setPeers({ [nodeB.nodeId]: `127.0.0.1:${nodeB.peerPort}` })
    await onB.setPeers({ [nodeA.nodeId]: `127.0.0.1:${nodeA.peerPort}` })
    const receiver = await forkPeer(peerScript, "receiver", nodeB.socketPath)
    const [sink, source] = await Promise.all([
      forkPeer(peerScript, "tcp-sink"),
      forkPeer(peerScript, "tcp-source", String(HOP_BYTES), String(HOP_BYTES))
    ])
    const tensor = Tensor.zeros("float32", [HOP_BYTES / 4])
    tensor.data.forEach((_, i) => (tensor.data[i] = i))
    const small = Tensor.zeros("float32", [1024])
    for (let i = 0; i < 200; i++) await handOff(onA, receiver, nodeB.nodeId, `hop-warmup-${i}`, small)
    const hops: Array<number> = []
    const raws: Array<number> = []
    const onreads: Array<number> = []
    for (let sample = 0; sample < 3 + SAMPLES; sample++) {
      // Each raw sample opens its connection, which on loopback costs a fraction of a millisecond.
      const rawNs = await rawTcpNs(source, sink, "data", HOP_BYTES)
      const onreadNs = await rawTcpNs(source, sink, "onread", HOP_BYTES)
      const hopNs = await handOff(onA, receiver, nodeB.nodeId, `hop-${sample}`, tensor)
      if (sample < 3) continue
      raws.push(rawNs / 1e6)
      onreads.push(onreadNs / 1e6)
      hops.push(hopNs / 1e6)
    }
    const sidecarP50 = percentile(hops, 0.5)
    const onreadP50 = percentile(onreads, 0.5)
    return {
      sidecarP50Ms: round(sidecarP50, 3),
      sidecarP99Ms: round(percentile(hops, 0.99), 3),
      rawTcpP50Ms: round(percentile(raws, 0.5), 3),
      rawTcpP99Ms: round(percentile(raws, 0.99), 3),
      rawTcpOnreadP50Ms: round(onreadP50, 3),
      rawTcpOnreadP99Ms: round(percentile(onreads, 0.99), 3),
      addedP50Ms: round(sidecarP50 - onreadP50, 3),
      ratio: round(sidecarP50 / onreadP50, 3)
    }
  } finally {
    await Promise.all(clients.map((client) => client.close()))
    for (const child of children) if (!sidecars.some((sidecar) => sidecar.process === child)) child.kill("SIGTERM")
    await Promise.all(sidecars.map((sidecar) => sidecar.stop()))
    rmSync(peerScript, { force: true })
  }
}

export default async function clusterBench(): Promise<void> {
  const scratch = mkdtempSync(join(tmpdir(), "cornserve-bench-cluster-"))
  const onSignal = (signal: NodeJS.Signals) => {
    for (const child of children) child.kill("SIGTERM")
    rmSync(scratch, { recursive: true, force: true })
    process.exit(signal === "SIGINT" ? 130 : 143)
  }
  process.once("SIGINT", onSignal)
  process.once("SIGTERM", onSignal)
  try {
    const layouts: ReadonlyArray<Layout> = [
      { name: "one-node", nodes: ["cpu:0,cpu:1,cpu:2"] },
      { name: "two-nodes", nodes: ["cpu:0,cpu:1", "cpu:0"] }
    ]
    const results: Array<LayoutResult> = []
    for (const layout of layouts) {
      results.push(await measureLayout(layout, scratch))
      console.error(`  ${layout.name}: done`)
    }
    const hop = await measureHop(scratch)
    const [one, two] = results as [LayoutResult, LayoutResult]

    console.log(
      `cluster bench: color_chat at concurrency ${CONCURRENCY} for ${SECONDS} s per layout, ` +
        `${SAMPLES} hops of 7 MiB, ${availableParallelism()} cores`
    )
    const rows = [
      ["case", "baseline", "measured", "ratio"],
      [
        "color_chat throughput",
        `one node ${one.rps} req/s`,
        `two nodes ${two.rps} req/s`,
        String(round(two.rps / one.rps, 3))
      ],
      [
        "color_chat p50",
        `one node ${one.p50Ms} ms`,
        `two nodes ${two.p50Ms} ms`,
        String(round(two.p50Ms / one.p50Ms, 3))
      ],
      [
        "color_chat p99",
        `one node ${one.p99Ms} ms`,
        `two nodes ${two.p99Ms} ms`,
        String(round(two.p99Ms / one.p99Ms, 3))
      ],
      [
        "7 MiB hop p50 (send → held)",
        `raw TCP ${hop.rawTcpP50Ms} ms (onread ${hop.rawTcpOnreadP50Ms} ms)`,
        `sidecars ${hop.sidecarP50Ms} ms (${hop.addedP50Ms >= 0 ? "+" : ""}${hop.addedP50Ms} ms vs onread)`,
        String(hop.ratio)
      ],
      [
        "7 MiB hop p99",
        `raw TCP ${hop.rawTcpP99Ms} ms (onread ${hop.rawTcpOnreadP99Ms} ms)`,
        `sidecars ${hop.sidecarP99Ms} ms`,
        "-"
      ]
    ]
    const widths = rows[0]!.map((_, column) => Math.max(...rows.map((row) => row[column]!.length)))
    for (const row of rows) console.log(row.map((cell, column) => cell.padEnd(widths[column]!)).join("  "))
    console.log(`placement: ${one.layout}: ${one.placement}; ${two.layout}: ${two.placement}`)
    console.log(
      JSON.stringify({
        bench: "cluster",
        concurrency: CONCURRENCY,
        seconds: SECONDS,
        oneNode: one,
        twoNodes: two,
        throughputRatio: round(two.rps / one.rps, 3),
        p50Ratio: round(two.p50Ms / one.p50Ms, 3),
        hop7MiB: hop
      })
    )
  } finally {
    rmSync(scratch, { recursive: true, force: true })
  }
}
