/**
 * Sidecar throughput and latency, each against a baseline measured in the same run.
 *
 * Starts two real sidecars (`bin/cornserve internal sidecar`, run `npm run build` first) standing
 * for two nodes, and executor processes (support/sidecar-peer.ts) that receive. This process is the
 * sending executor.
 *
 * - Same node, 7 MiB and 64 MiB float32 tensors: the time from `send` until the receiving process
 *   holds its view (both read the same monotonic clock), against a plain Buffer copy of the same
 *   size, interleaved sample by sample so that machine noise hits both alike. Also the hand-off of
 *   a tensor written in place (`allocate`), which moves no bytes.
 * - Across nodes: 8 × 64 MiB chunks from node A's executor into node B's executor, against raw
 *   TCP between two Node processes moving as many bytes; rounds alternate them. Raw TCP is read
 *   two ways: as Node reads a socket by default (the baseline of the target), and into one large
 *   buffer (onread), the way the receiving sidecar reads, which is the stricter comparison. The
 *   sidecar also runs with tensors written in place, without the copy into the arena.
 *
 * All three processes first make 500 small hand-offs, unmeasured, so that their code runs compiled
 * as it does in a sidecar that has been serving for a while.
 *
 * Prints a table, then (as the last line) one JSON object with the figures.
 * Env: BENCH_SAMPLES (same-node samples per size, default 40), BENCH_ROUNDS (cross-node, default 3).
 */
import { mkdtempSync, rmSync } from "node:fs"
import { availableParallelism, tmpdir } from "node:os"
import { join } from "node:path"
import { arenaFilePrefix } from "../src/sidecar/Arena.js"
import { SidecarClient } from "../src/sidecar/SidecarClient.js"
import { type RunningSidecar, startSidecar } from "../src/sidecar/SidecarProcess.js"
import { Tensor } from "../src/sidecar/Tensor.js"
import { bundlePeer, children, forkPeer, handOff, now, type Peer, rawTcpNs, type TcpRead } from "./support/peers.js"

const MiB = 1024 * 1024
const SAMPLES = envCount("BENCH_SAMPLES", 40)
const ROUNDS = envCount("BENCH_ROUNDS", 3)
const WARMUP_SAMPLES = 3
/** Small hand-offs first, so that the three processes' code is compiled as in a server that runs. */
const JIT_WARMUP_HANDOFFS = 500
const SIZES = [7 * MiB, 64 * MiB] as const
const CROSS_CHUNKS = 8
const CROSS_CHUNK_BYTES = 64 * MiB
/** Chunks in flight from the sending executor: enough to keep TCP busy while the next is copied in. */
const CROSS_WINDOW = 3
const ARENA_BYTES = 512 * MiB
const TARGET = { sameNodeRatio: 0.5, crossNodeRatio: 0.8 } as const

function envCount(name: string, fallback: number): number {
  const raw = process.env[name]
  if (raw === undefined || raw === "") return fallback
  const value = Number(raw)
  if (!Number.isInteger(value) || value <= 0) throw new Error(`${name} must be a positive whole number, got ${raw}`)
  return value
}

const round = (value: number, digits: number) => Number(value.toFixed(digits))
const median = (values: ReadonlyArray<number>) =>
  percentile(
    [...values].sort((a, b) => a - b),
    0.5
  )

/** Nearest-rank percentile of sorted values. */
function percentile(sorted: ReadonlyArray<number>, p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1))]!
}

const gbPerSecond = (bytes: number, ns: number) => bytes / ns

interface SameNodeResult {
  readonly bytes: number
  readonly copyGBps: number
  readonly sidecarGBps: number
  readonly ratio: number
  readonly p50Ms: number
  readonly p99Ms: number
}

async function sameNode(sender: SidecarClient, receiver: Peer, nodeId: string, bytes: number): Promise<SameNodeResult> {
  const tensor = Tensor.zeros("float32", [bytes / 4])
  tensor.data.forEach((_, i) => (tensor.data[i] = i))
  const source = Buffer.from(tensor.bytes)
  const target = Buffer.alloc(bytes, 1)
  const copies: Array<number> = []
  const handOffs: Array<number> = []
  for (let sample = 0; sample < WARMUP_SAMPLES + SAMPLES; sample++) {
    const copyStarted = now()
    source.copy(target)
    const copyNs = Number(now() - copyStarted)
    const handOffNs = await handOff(sender, receiver, nodeId, `same-${bytes}-${sample}`, tensor)
    if (sample < WARMUP_SAMPLES) continue
    copies.push(copyNs)
    handOffs.push(handOffNs)
  }
  const sorted = [...handOffs].sort((a, b) => a - b)
  const copyGBps = gbPerSecond(bytes, median(copies))
  const sidecarGBps = gbPerSecond(bytes, median(handOffs))
  return {
    bytes,
    copyGBps: round(copyGBps, 2),
    sidecarGBps: round(sidecarGBps, 2),
    ratio: round(sidecarGBps / copyGBps, 3),
    p50Ms: round(percentile(sorted, 0.5) / 1e6, 3),
    p99Ms: round(percentile(sorted, 0.99) / 1e6, 3)
  }
}

/** Hand-offs of tensors the producer wrote into the arena itself: control messages only. */
async function inPlace(sender: SidecarClient, receiver: Peer, nodeId: string, bytes: number) {
  const latencies: Array<number> = []
  for (let sample = 0; sample < WARMUP_SAMPLES + SAMPLES; sample++) {
    const tensor = await sender.allocate("float32", [bytes / 4])
    tensor.data[0] = sample
    const ns = await handOff(sender, receiver, nodeId, `in-place-${sample}`, tensor)
    if (sample >= WARMUP_SAMPLES) latencies.push(ns)
  }
  const sorted = latencies.sort((a, b) => a - b)
  return { p50: round(percentile(sorted, 0.5) / 1e6, 3), p99: round(percentile(sorted, 0.99) / 1e6, 3) }
}

/**
 * CROSS_CHUNKS chunks of one transfer to node B, CROSS_WINDOW in flight: GB/s until B's executor
 * has the last. `chunk` is copied into the arena per send; without it each chunk is a tensor
 * allocated in the arena (as a producer that writes its output there), which isolates the transport.
 */
async function crossNode(
  sender: SidecarClient,
  receiver: Peer,
  nodeId: string,
  id: string,
  chunk: Tensor | undefined
): Promise<number> {
  receiver.send({ id, chunks: CROSS_CHUNKS })
  await receiver.receive()
  const started = now()
  let next = 0
  const lane = async () => {
    while (next < CROSS_CHUNKS) {
      const index = next++
      const data = chunk ?? (await sender.allocate("uint8", [CROSS_CHUNK_BYTES]))
      await sender.send(id, data, { to: [nodeId], chunk: index, numChunks: CROSS_CHUNKS })
    }
  }
  await Promise.all(Array.from({ length: CROSS_WINDOW }, lane))
  const { doneAt } = await receiver.receive()
  return gbPerSecond(CROSS_CHUNKS * CROSS_CHUNK_BYTES, Number(BigInt(doneAt as string) - started))
}

/** The same bytes over one TCP connection between two Node processes, read one of two ways. */
async function rawTcp(source: Peer, sink: Peer, mode: TcpRead): Promise<number> {
  const bytes = CROSS_CHUNKS * CROSS_CHUNK_BYTES
  return gbPerSecond(bytes, await rawTcpNs(source, sink, mode, bytes))
}

// ---------------------------------------------------------------------------------------------
// Report

function printTable(rows: ReadonlyArray<ReadonlyArray<string>>) {
  const header = ["case", "baseline", "sidecar", "ratio", "target"]
  const widths = header.map((title, column) => Math.max(title.length, ...rows.map((row) => row[column]!.length)))
  const line = (cells: ReadonlyArray<string>) => cells.map((cell, column) => cell.padEnd(widths[column]!)).join("  ")
  console.log(
    `sidecar bench: ${SAMPLES} same-node samples per size, ${ROUNDS} cross-node rounds of ${CROSS_CHUNKS} × 64 MiB, ` +
      `${availableParallelism()} cores`
  )
  console.log(line(header))
  for (const row of rows) console.log(line(row))
}

export default async function sidecarBench(): Promise<void> {
  const socketDir = mkdtempSync(join(tmpdir(), "cornserve-bench-"))
  let peerScript: string | undefined
  const cleanUp = () => {
    rmSync(socketDir, { recursive: true, force: true })
    if (peerScript !== undefined) rmSync(peerScript, { force: true })
  }
  // A signal to the bench alone (not its process group) must not orphan the sidecars.
  const onSignal = (signal: NodeJS.Signals) => {
    for (const child of children) child.kill("SIGTERM")
    cleanUp()
    process.exit(signal === "SIGINT" ? 130 : 143)
  }
  process.once("SIGINT", onSignal)
  process.once("SIGTERM", onSignal)
  const sidecars: Array<RunningSidecar> = []
  const clients: Array<SidecarClient> = []

  try {
    peerScript = await bundlePeer()
    const start = async (nodeId: string) => {
      const sidecar = await startSidecar({
        binPath: "bin/cornserve",
        nodeId,
        socketPath: join(socketDir, `${nodeId}.sock`),
        arenaPath: `/dev/shm/${arenaFilePrefix}bench-${nodeId}-${process.pid}`,
        arenaBytes: ARENA_BYTES
      })
      sidecars.push(sidecar)
      children.add(sidecar.process)
      return sidecar
    }
    const [nodeA, nodeB] = await Promise.all([start("bench-a"), start("bench-b")])
    const sender = await SidecarClient.connect(nodeA.socketPath)
    const onB = await SidecarClient.connect(nodeB.socketPath)
    clients.push(sender, onB)
    await sender.setPeers({ [nodeB.nodeId]: `127.0.0.1:${nodeB.peerPort}` })
    await onB.setPeers({ [nodeA.nodeId]: `127.0.0.1:${nodeA.peerPort}` })

    const receiverA = await forkPeer(peerScript, "receiver", nodeA.socketPath)
    const receiverB = await forkPeer(peerScript, "receiver", nodeB.socketPath)
    const [sink, source] = await Promise.all([
      forkPeer(peerScript, "tcp-sink"),
      forkPeer(peerScript, "tcp-source", String(CROSS_CHUNKS * CROSS_CHUNK_BYTES), String(CROSS_CHUNK_BYTES))
    ])

    const small = Tensor.zeros("float32", [1024])
    for (let i = 0; i < JIT_WARMUP_HANDOFFS; i++) await handOff(sender, receiverA, nodeA.nodeId, `warmup-${i}`, small)

    const same = []
    for (const bytes of SIZES) {
      same.push(await sameNode(sender, receiverA, nodeA.nodeId, bytes))
      console.error(`  same node ${bytes / MiB} MiB: done`)
    }
    const written = await inPlace(sender, receiverA, nodeA.nodeId, SIZES[0])

    const chunk = Tensor.zeros("uint8", [CROSS_CHUNK_BYTES])
    chunk.data.fill(3)
    const raw: Record<TcpRead, Array<number>> = { data: [], onread: [] }
    const cross: Array<number> = []
    const crossInPlace: Array<number> = []
    await crossNode(sender, receiverB, nodeB.nodeId, "cross-warmup", chunk)
    for (let round = 0; round < ROUNDS; round++) {
      for (const mode of ["data", "onread"] as const) raw[mode].push(await rawTcp(source, sink, mode))
      cross.push(await crossNode(sender, receiverB, nodeB.nodeId, `cross-${round}`, chunk))
      crossInPlace.push(await crossNode(sender, receiverB, nodeB.nodeId, `cross-in-place-${round}`, undefined))
      console.error(
        `  cross node round ${round + 1}: raw TCP ${raw.data.at(-1)!.toFixed(2)} GB/s (onread ${raw.onread.at(-1)!.toFixed(2)}), ` +
          `sidecar ${cross.at(-1)!.toFixed(2)} GB/s (in place ${crossInPlace.at(-1)!.toFixed(2)})`
      )
    }
    const rawGBps = median(raw.data)
    const onreadGBps = median(raw.onread)
    const crossGBps = median(cross)
    const crossInPlaceGBps = median(crossInPlace)
    const crossRatio = crossGBps / rawGBps

    const [seven, sixtyFour] = same as [SameNodeResult, SameNodeResult]
    printTable([
      ...same.map((result) => [
        `same node send→recv ${result.bytes / MiB} MiB`,
        `Buffer copy ${result.copyGBps} GB/s`,
        `${result.sidecarGBps} GB/s (p50 ${result.p50Ms} ms, p99 ${result.p99Ms} ms)`,
        String(result.ratio),
        `≥ ${TARGET.sameNodeRatio}`
      ]),
      [
        `same node, written in place ${SIZES[0] / MiB} MiB`,
        "-",
        `p50 ${written.p50} ms, p99 ${written.p99} ms`,
        "-",
        "-"
      ],
      [
        `cross node ${CROSS_CHUNKS} × 64 MiB`,
        `raw TCP ${round(rawGBps, 2)} GB/s`,
        `${round(crossGBps, 2)} GB/s`,
        String(round(crossRatio, 3)),
        `≥ ${TARGET.crossNodeRatio}`
      ],
      [
        `cross node, against TCP read via onread`,
        `raw TCP ${round(onreadGBps, 2)} GB/s`,
        `${round(crossGBps, 2)} GB/s`,
        String(round(crossGBps / onreadGBps, 3)),
        "-"
      ],
      [
        `cross node, written in place`,
        `raw TCP ${round(onreadGBps, 2)} GB/s (onread)`,
        `${round(crossInPlaceGBps, 2)} GB/s`,
        String(round(crossInPlaceGBps / onreadGBps, 3)),
        "-"
      ]
    ])
    console.log(
      JSON.stringify({
        bench: "sidecar",
        sameNode7MiB: { copyGBps: seven.copyGBps, sidecarGBps: seven.sidecarGBps, ratio: seven.ratio },
        sameNode64MiB: { copyGBps: sixtyFour.copyGBps, sidecarGBps: sixtyFour.sidecarGBps, ratio: sixtyFour.ratio },
        handOff7MiBMs: { p50: seven.p50Ms, p99: seven.p99Ms },
        handOffInPlace7MiBMs: written,
        crossNode: {
          rawTcpGBps: round(rawGBps, 3),
          sidecarGBps: round(crossGBps, 3),
          ratio: round(crossRatio, 3),
          rawTcpOnreadGBps: round(onreadGBps, 3),
          ratioToOnread: round(crossGBps / onreadGBps, 3),
          inPlaceGBps: round(crossInPlaceGBps, 3),
          inPlaceRatioToOnread: round(crossInPlaceGBps / onreadGBps, 3)
        },
        target: TARGET,
        meetsTarget:
          seven.ratio >= TARGET.sameNodeRatio &&
          sixtyFour.ratio >= TARGET.sameNodeRatio &&
          crossRatio >= TARGET.crossNodeRatio
      })
    )
  } finally {
    await Promise.all(clients.map((client) => client.close()))
    for (const child of children) if (!sidecars.some((sidecar) => sidecar.process === child)) child.kill("SIGTERM")
    await Promise.all(sidecars.map((sidecar) => sidecar.stop()))
    cleanUp()
  }
}
