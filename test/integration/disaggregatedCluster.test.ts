import { type ChildProcess, spawn } from "node:child_process"
import { mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { randomLlamaFiles } from "../../src/models/recipes/RandomLlama.js"
import { writeModelFiles } from "../models/support/EmbeddingFixtures.js"
import { smallLlamaConfig } from "../models/support/SmallLlama.js"
import { makeNetwork, netnsAvailable, type VirtualNetwork } from "../support/netns.js"
import {
  adminHeaders,
  boundClusterPort,
  dataPlaneArgs,
  eventually,
  invoke,
  platformStartMs,
  readyWithin,
  removeStateDir,
  repoRoot,
  runCli,
  type RunningPlatform,
  startPlatform
} from "../support/platform.js"
import { disaggregatedAppSource, streamedText } from "../support/disaggregatedApps.js"

/**
 * An LLM's prefill and decode apart across machines, through the real binary: a control plane and
 * three data-plane nodes of one device each, each node in a network namespace of its own (on the
 * loopback address, each with its own ports, where namespaces cannot be made). The plain LLM task,
 * the prefill task and the decode task land on three nodes, so the prompt's KV cache goes from the
 * prefill node's sidecar to the decode node's over TCP; the greedy answers are the plain task's,
 * the decode executor's requests started from the caches, and no sidecar holds anything of them afterwards.
 */

const clusterToken = "disaggregated-cluster-token"
const nodeCount = 3

interface TaskRow {
  readonly id: string
  readonly name: string
  readonly config?: { readonly phase?: string }
  readonly executors: ReadonlyArray<{ readonly node: string }>
}

interface Node {
  readonly name: string
  readonly process: ChildProcess
  output(): string
}

const useNamespaces = process.env.CORNSERVE_TEST_LOOPBACK !== "1" && netnsAvailable()

describe(`prefill and decode apart across ${useNamespaces ? "network namespaces" : "loopback ports"}`, () => {
  let network: VirtualNetwork | undefined
  let root: string
  let controlPlane: RunningPlatform
  const nodes: Array<Node> = []
  const loopbackChildren: Array<ChildProcess> = []

  const controlPlaneHost = () => network?.bridgeAddress ?? "127.0.0.1"
  const nodeHost = (index: number) => (network === undefined ? "127.0.0.1" : network.nodes[index]!.address)

  /** A node's own /metrics (its sidecar's series). */
  const nodeMetrics = async (name: string) => {
    const node = nodes.find((entry) => entry.name === name)!
    const health = /health on (http:\/\/\S+)\/health/.exec(node.output())![1]
    return (await fetch(`${health}/metrics`)).text()
  }
  const series = (text: string, metric: string, having = "") =>
    text
      .split("\n")
      .filter((line) => line.startsWith(`${metric}{`) && line.includes(having))
      .reduce((sum, line) => sum + Number(line.split(" ").at(-1)), 0)

  beforeAll(
    async () => {
      root = await mkdtemp(join(tmpdir(), "cornserve-disaggregated-cluster-"))
      await writeModelFiles(
        join(root, "models", "small-llama"),
        randomLlamaFiles({ config: smallLlamaConfig, layout: "decoder-only", dtypes: ["fp32"], seed: 10 })
      )
      if (useNamespaces) network = await makeNetwork({ nodes: nodeCount })
      // The kernel picks the cluster port as it binds it: a port found free and bound later could
      // be taken in between by another process's ephemeral port.
      controlPlane = await startPlatform({
        args: ["--role", "control-plane", "--host", controlPlaneHost(), "--cluster-port", "0"],
        env: { CORNSERVE_CLUSTER_TOKEN: clusterToken }
      })
      const clusterPort = await boundClusterPort(controlPlane)
      for (let index = 0; index < nodeCount; index++) {
        const name = `n${index}`
        const dir = join(root, name)
        const args = dataPlaneArgs(`http://${controlPlaneHost()}:${clusterPort}`, name, "cpu:0", [
          "--host",
          nodeHost(index),
          "--sidecar-arena-bytes",
          String(64 * 1024 * 1024),
          "--state-dir",
          join(dir, "state")
        ])
        const options = {
          cwd: repoRoot,
          env: { ...process.env, CORNSERVE_CLUSTER_TOKEN: clusterToken, CORNSERVE_MODEL_DIR: join(root, "models") },
          stdio: ["ignore", "pipe", "pipe"] as ["ignore", "pipe", "pipe"]
        }
        const child =
          network === undefined
            ? spawn(process.execPath, args, options)
            : network.spawn(index, process.execPath, args, options)
        if (network === undefined) loopbackChildren.push(child)
        let output = ""
        child.stdout!.on("data", (chunk: Buffer) => (output += chunk.toString()))
        child.stderr!.on("data", (chunk: Buffer) => (output += chunk.toString()))
        nodes.push({ name, process: child, output: () => output })
      }
      await eventually(
        async () => {
          const listed = (await (
            await fetch(`${controlPlane.url}/nodes/list`, { headers: adminHeaders() })
          ).json()) as { nodes: Array<{ state: string }> }
          return listed.nodes.filter((node) => node.state === "ready").length === nodeCount ? true : undefined
        },
        nodeCount * platformStartMs,
        "three nodes ready"
      )
      for (const [name, task] of [
        ["together", "LLMTask"],
        ["apart", "DisaggregatedLLMTask"]
      ] as const) {
        const file = join(root, `${name}.ts`)
        await writeFile(file, disaggregatedAppSource(join(root, "models", "small-llama"), task))
        const registered = await runCli(["app", "register", file], { CORNSERVE_GATEWAY_URL: controlPlane.url })
        expect(registered.code, registered.stderr + nodes.map((node) => node.output()).join("\n")).toBe(0)
      }
    },
    readyWithin(3) + nodeCount * platformStartMs
  )

  afterAll(async () => {
    await controlPlane?.stop()
    await network?.close()
    await Promise.all(
      loopbackChildren.map(
        (child) =>
          new Promise<void>((resolve) => {
            if (child.exitCode !== null || child.signalCode !== null) return resolve()
            child.once("exit", () => resolve())
            child.kill("SIGTERM")
          })
      )
    )
    if (controlPlane !== undefined) await removeStateDir(controlPlane.stateDir)
    await rm(root, { recursive: true, force: true })
  })

  it("streams the plain task's greedy answers, the KV cache crossing from the prefill node to the decode node over TCP", async () => {
    const { tasks } = (await (await fetch(`${controlPlane.url}/tasks/list`, { headers: adminHeaders() })).json()) as {
      tasks: Array<TaskRow>
    }
    const nodeOf = (phase: string) =>
      tasks.find((task) => (task.config?.phase ?? "whole") === phase)!.executors[0]!.node
    const [prefillNode, decodeNode, wholeNode] = [nodeOf("prefill"), nodeOf("decode"), nodeOf("whole")]
    expect(new Set([prefillNode, decodeNode, wholeNode]).size).toBe(3)

    const prompts = [
      "the red fox and the blue bird went to the green hill where the yellow sun shone on the white snow",
      "the black cat slept by the grey stone while the brown dog ran over the wide field to the old barn"
    ]
    for (const content of prompts) {
      const request = JSON.stringify({ messages: [{ role: "user", content }], max_tokens: 12, temperature: 0 })
      const together = await invoke(controlPlane.url, "together", request).then(streamedText)
      const apart = await invoke(controlPlane.url, "apart", request).then(streamedText)
      expect(apart, content).toBe(together)
      expect(apart.length).toBeGreaterThan(0)
    }

    const [prefillMetrics, decodeMetrics] = await Promise.all([nodeMetrics(prefillNode), nodeMetrics(decodeNode)])
    // The caches went node to node: the prefill node's sidecar sent them, the decode node's received them.
    expect(series(prefillMetrics, "cornserve_sidecar_bytes_sent_to_peers_total")).toBeGreaterThan(0)
    expect(series(decodeMetrics, "cornserve_sidecar_chunks_received_from_peers_total")).toBeGreaterThanOrEqual(
      2 * 2 * smallLlamaConfig.layers
    )
    expect(series(decodeMetrics, "cornserve_sidecar_bytes_sent_to_peers_total")).toBe(0)
    // The decode executor took them: each prompt run from its cache but for its last token.
    const decodeTask = tasks.find((task) => task.config?.phase === "decode")!.id
    const platformMetrics = await (await fetch(`${controlPlane.url}/metrics`, { headers: adminHeaders() })).text()
    expect(series(platformMetrics, "cornserve_llm_kv_imported_tokens_total", decodeTask)).toBeGreaterThanOrEqual(2 * 32)
    // And freed them once taken: nothing of them is left in either node's arena.
    await eventually(async () => {
      const [sender, receiver] = await Promise.all([nodeMetrics(prefillNode), nodeMetrics(decodeNode)])
      return series(sender, "cornserve_sidecar_bytes_in_use") === 0 &&
        series(receiver, "cornserve_sidecar_bytes_in_use") === 0
        ? true
        : undefined
    }, 10_000)
  })
})
