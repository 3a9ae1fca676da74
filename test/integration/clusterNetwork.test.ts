import { type ChildProcess, type SpawnOptions, spawn } from "node:child_process"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { chatRequest, outcomeOf, streamedText } from "../support/colorChatRequest.js"
import { makeNetwork, netnsAvailable, type VirtualNetwork } from "../support/netns.js"
import {
  dataPlaneArgs,
  eventually,
  freePort,
  invoke,
  platformStartMs,
  readyWithin,
  removeStateDir,
  repoRoot,
  type RunningPlatform,
  runCli,
  startPlatform
} from "../support/platform.js"

/**
 * The real binary as a cluster of machines: a control plane in this process's network namespace
 * and four data-plane nodes, each in a network namespace of its own with its own address and one
 * device (where namespaces cannot be made, not as root, the nodes share the loopback address, each
 * with its own ports, arena and directories, and the test of a cut link is skipped). color_chat's three tasks land on three nodes, so the image encoder's features reach the
 * LLM over the sidecars' TCP transport. A node whose link is cut is lost, its task is redeployed
 * on the spare node, requests sent to it meanwhile are retried there and succeed; it rejoins when
 * its link comes back and stops what it ran once its grace period is over. A node killed with
 * SIGKILL under load loses no request that could be retried. A control plane killed and started
 * again takes the running executors back instead of restarting them.
 */

const clusterToken = "netns-cluster-token"
const adminToken = "netns-admin-token"
/** Seconds a node keeps executors nobody holds. */
const executorGraceSeconds = 10

interface TaskRow {
  readonly id: string
  readonly name: string
  readonly devices: ReadonlyArray<string>
  readonly executors: ReadonlyArray<{ readonly node: string; readonly healthy: boolean; readonly url: string | null }>
}

interface NodeRow {
  readonly name: string
  readonly address: string
  readonly state: string
  readonly devices: ReadonlyArray<{ readonly id: string; readonly task: string | null }>
}

interface DataPlane {
  readonly name: string
  readonly process: ChildProcess
  output(): string
}

/** Where the nodes run: network namespaces with their own addresses, or this machine's loopback. */
interface Machines {
  readonly kind: "namespaces" | "loopback"
  readonly controlPlaneHost: string
  nodeHost(index: number): string
  spawn(index: number, command: string, args: ReadonlyArray<string>, options: SpawnOptions): ChildProcess
  /** Drops a node's traffic silently (namespaces only). */
  cut(index: number): Promise<void>
  restore(index: number): Promise<void>
  close(): Promise<void>
}

const namespaceMachines = async (count: number): Promise<Machines> => {
  const network: VirtualNetwork = await makeNetwork({ nodes: count })
  return {
    kind: "namespaces",
    controlPlaneHost: network.bridgeAddress,
    nodeHost: (index) => network.nodes[index]!.address,
    spawn: (index, command, args, options) => network.spawn(index, command, args, options),
    cut: (index) => network.cut(index),
    restore: (index) => network.restore(index),
    close: () => network.close()
  }
}

const loopbackMachines = (): Machines => {
  const children = new Set<ChildProcess>()
  return {
    kind: "loopback",
    controlPlaneHost: "127.0.0.1",
    nodeHost: () => "127.0.0.1",
    spawn: (_, command, args, options) => {
      const child = spawn(command, args, options)
      children.add(child)
      child.once("exit", () => children.delete(child))
      return child
    },
    cut: () => Promise.reject(new Error("a loopback node's link cannot be cut")),
    restore: () => Promise.reject(new Error("a loopback node's link cannot be cut")),
    close: async () => {
      await Promise.all(
        [...children].map(
          (child) =>
            new Promise<void>((resolve) => {
              if (child.exitCode !== null || child.signalCode !== null) return resolve()
              child.once("exit", () => resolve())
              child.kill("SIGTERM")
            })
        )
      )
    }
  }
}

/** CORNSERVE_TEST_LOOPBACK=1 runs the loopback variant where namespaces could be made too. */
const useNamespaces = process.env.CORNSERVE_TEST_LOOPBACK !== "1" && netnsAvailable()

describe(`cluster across ${useNamespaces ? "network namespaces" : "loopback ports"}: tensors node to node, lost nodes, a restarted control plane`, () => {
  let machines: Machines
  let controlPlane: RunningPlatform
  let clusterPort: number
  const nodes: Array<DataPlane> = []
  const dirs: Array<string | undefined> = []

  const get = async <A>(path: string) => (await (await fetch(`${controlPlane.url}${path}`)).json()) as A
  const tasks = async () => (await get<{ tasks: Array<TaskRow> }>("/tasks/list")).tasks
  const nodesList = async () => (await get<{ nodes: Array<NodeRow> }>("/nodes/list")).nodes
  const nodeState = async (name: string) => (await nodesList()).find((node) => node.name === name)?.state
  const taskNamed = async (prefix: string) => (await tasks()).find((task) => task.name.startsWith(prefix))
  /** A counter of a data-plane node's sidecar, from the node's own /metrics. */
  const nodeCounter = async (name: string, metric: string) => {
    const node = nodes.find((entry) => entry.name === name)!
    const health = /health on (http:\/\/\S+)\/health/.exec(node.output())![1]
    const text = await (await fetch(`${health}/metrics`)).text()
    return Number(new RegExp(`^${metric}\\{node="${name}"\\} (\\d+)$`, "m").exec(text)?.[1] ?? Number.NaN)
  }
  const ask = async () => {
    const response = await invoke(controlPlane.url, "color_chat", chatRequest)
    return response.status === 200 ? streamedText(response) : `${response.status}: ${await response.text()}`
  }

  const startControlPlane = (stateDir?: string) =>
    startPlatform({
      args: ["--role", "control-plane", "--host", machines.controlPlaneHost, "--cluster-port", String(clusterPort)],
      env: { CORNSERVE_CLUSTER_TOKEN: clusterToken, CORNSERVE_ADMIN_TOKEN: adminToken },
      ...(stateDir === undefined ? {} : { stateDir })
    })

  const startNode = async (index: number): Promise<DataPlane> => {
    const name = `n${index}`
    // A node started again keeps its directories (its models stay there), as a machine would.
    dirs[index] ??= await mkdtemp(join(tmpdir(), `cornserve-${name}-`))
    const dir = dirs[index]!
    const child = machines.spawn(
      index,
      process.execPath,
      dataPlaneArgs(`http://${machines.controlPlaneHost}:${clusterPort}`, name, "cpu:0", [
        "--host",
        machines.nodeHost(index),
        "--sidecar-arena-bytes",
        String(64 * 1024 * 1024),
        "--executor-grace",
        String(executorGraceSeconds),
        "--state-dir",
        join(dir, "state")
      ]),
      {
        cwd: repoRoot,
        env: { ...process.env, CORNSERVE_CLUSTER_TOKEN: clusterToken, CORNSERVE_MODEL_DIR: join(dir, "models") },
        stdio: ["ignore", "pipe", "pipe"]
      }
    )
    let output = ""
    child.stdout!.on("data", (chunk: Buffer) => (output += chunk.toString()))
    child.stderr!.on("data", (chunk: Buffer) => (output += chunk.toString()))
    const node = { name, process: child, output: () => output }
    const previous = nodes.findIndex((entry) => entry.name === name)
    if (previous === -1) nodes.push(node)
    else nodes[previous] = node
    return node
  }

  beforeAll(async () => {
    machines = useNamespaces ? await namespaceMachines(4) : loopbackMachines()
    clusterPort = await freePort(machines.controlPlaneHost)
    controlPlane = await startControlPlane()
    await Promise.all([0, 1, 2, 3].map(startNode))
    // Four nodes start beside each other, each with its sidecar.
    await eventually(
      async () => ((await nodesList()).filter((node) => node.state === "ready").length === 4 ? true : undefined),
      4 * platformStartMs,
      "four nodes ready"
    )
  }, 5 * platformStartMs)

  afterAll(async () => {
    await controlPlane?.stop()
    await machines?.close()
    if (controlPlane !== undefined) await removeStateDir(controlPlane.stateDir)
    await Promise.all(dirs.map((dir) => (dir === undefined ? undefined : rm(dir, { recursive: true, force: true }))))
  })

  it(
    "lists every node at its own address; color_chat's encoder and LLM run on different nodes and answer",
    async () => {
      expect((await nodesList()).map((node) => [node.name, node.address])).toEqual(
        [0, 1, 2, 3].map((index) => [`n${index}`, machines.nodeHost(index)])
      )
      const registered = await runCli(["app", "register", join(repoRoot, "examples", "color_chat.ts")], {
        CORNSERVE_GATEWAY_URL: controlPlane.url,
        CORNSERVE_ADMIN_TOKEN: adminToken
      })
      expect(registered.code, registered.stderr + nodes.map((node) => node.output()).join("\n")).toBe(0)
      const encoder = (await taskNamed("encoder-image"))!
      const llm = (await taskNamed("llm"))!
      const encoderNode = encoder.executors[0]!.node
      const llmNode = llm.executors[0]!.node
      expect(encoderNode).not.toBe(llmNode)
      expect(llm.devices).toEqual([`${llmNode}/cpu:0`])
      // The LLM answers from the image's features: they crossed from one node's sidecar to the other's over TCP.
      expect(await ask()).toBe("red")
      expect(await nodeCounter(encoderNode, "cornserve_sidecar_bytes_sent_to_peers_total")).toBeGreaterThan(0)
      expect(await nodeCounter(llmNode, "cornserve_sidecar_chunks_received_from_peers_total")).toBeGreaterThan(0)
      expect(await nodeCounter(llmNode, "cornserve_sidecar_bytes_sent_to_peers_total")).toBe(0)
      const listed = await runCli(["tasks", "list"], { CORNSERVE_GATEWAY_URL: controlPlane.url })
      expect(listed.stdout).toContain(`(${llmNode})`)
      const nodesCli = await runCli(["nodes", "list"], { CORNSERVE_GATEWAY_URL: controlPlane.url })
      expect(nodesCli.stdout).toMatch(new RegExp(`${llmNode}\\s+data-plane\\s+\\S+\\s+ready\\s+cpu:0 \\(${llm.id}\\)`))
    },
    // color_chat's three executors, one per node.
    readyWithin(3)
  )

  it.skipIf(!useNamespaces)(
    "a node cut off is lost within 5 s; its task is redeployed on the spare node and requests succeed again",
    async () => {
      const llm = (await taskNamed("llm"))!
      const lostNode = llm.executors[0]!.node
      const lostIndex = Number(lostNode.slice(1))
      const busy = new Set((await tasks()).flatMap((task) => task.executors.map((executor) => executor.node)))
      const spare = ["n0", "n1", "n2", "n3"].find((name) => !busy.has(name))!
      await machines.cut(lostIndex)
      // Sent before the control plane knows: they go to the cut node, wait, and are retried elsewhere.
      const inFlight = Promise.all([ask(), ask(), ask()])
      await eventually(async () => ((await nodeState(lostNode)) === "lost" ? true : undefined), 15_000)
      // The control plane's own account: lost after 4 s without a heartbeat, under the 5 s asked for.
      expect(controlPlane.output()).toMatch(new RegExp(`node ${lostNode} is lost: no heartbeat for 4 s`))
      const moved = await eventually(async () => {
        const task = await taskNamed("llm")
        return task?.executors.some((executor) => executor.node === spare && executor.healthy) ? task : undefined
      }, readyWithin(1))
      expect(moved.executors.map((executor) => executor.node)).toEqual([spare])
      expect(await inFlight).toEqual(["red", "red", "red"])
      expect(await ask()).toBe("red")

      // Back on the network it rejoins under its name; what it ran is no longer held, and it stops it.
      await machines.restore(lostIndex)
      await eventually(async () => ((await nodeState(lostNode)) === "ready" ? true : undefined), 30_000)
      const node = nodes.find((entry) => entry.name === lostNode)!
      await eventually(async () => (/stopping executor .*\(task llm-/.test(node.output()) ? true : undefined), 30_000)
      expect((await nodesList()).find((entry) => entry.name === lostNode)!.devices).toEqual([
        { id: "cpu:0", type: "cpu", threads: 1, task: null, tasks: [] }
      ])
      expect(await ask()).toBe("red")
    },
    readyWithin(1) + 120_000
  )

  it(
    "a node killed with SIGKILL under a load of 20 requests loses none that could be retried; started again, it is ready",
    async () => {
      const llm = (await taskNamed("llm"))!
      const victimName = llm.executors[0]!.node
      const victimIndex = Number(victimName.slice(1))
      const victim = nodes.find((node) => node.name === victimName)!
      const load = Array.from({ length: 20 }, () => invoke(controlPlane.url, "color_chat", chatRequest).then(outcomeOf))
      await new Promise((resolve) => setTimeout(resolve, 150))
      victim.process.kill("SIGKILL")
      const outcomes = await Promise.all(load)
      // A request whose stream had begun cannot be run again; every other one is answered in full.
      const failedBeforeAnswering = outcomes.filter((outcome) => "status" in outcome)
      expect(failedBeforeAnswering).toEqual([])
      for (const outcome of outcomes) if ("text" in outcome) expect(outcome.text).toBe("red")
      expect(outcomes.filter((outcome) => "text" in outcome).length).toBeGreaterThan(0)

      await eventually(async () => ((await nodeState(victimName)) === "lost" ? true : undefined), 15_000)
      const nodesCli = await runCli(["nodes", "list"], { CORNSERVE_GATEWAY_URL: controlPlane.url })
      expect(nodesCli.stdout).toMatch(new RegExp(`${victimName}\\s+data-plane\\s+\\S+\\s+lost`))
      const moved = await eventually(async () => {
        const task = await taskNamed("llm")
        return task?.executors.some((executor) => executor.node !== victimName && executor.healthy) ? task : undefined
      }, readyWithin(1))
      expect(moved.executors.map((executor) => executor.node)).not.toContain(victimName)
      expect(await ask()).toBe("red")

      await startNode(victimIndex)
      await eventually(async () => ((await nodeState(victimName)) === "ready" ? true : undefined), platformStartMs)
      expect(controlPlane.output()).toMatch(new RegExp(`node ${victimName} rejoined`))
    },
    readyWithin(1) + platformStartMs + 120_000
  )

  it(
    "a control plane killed and started again takes the running executors back, and color_chat comes back",
    async () => {
      const before = (await tasks()).map((task) => [task.id, task.executors.map((executor) => executor.url)])
      await controlPlane.kill()
      controlPlane = await startControlPlane(controlPlane.stateDir)
      await eventually(async () => ((await ask()) === "red" ? true : undefined), readyWithin(3))
      const after = (await tasks()).map((task) => [task.id, task.executors.map((executor) => executor.url)])
      expect(after.sort()).toEqual(before.sort())
      expect((controlPlane.output().match(/kept executor \S+: it already ran there/g) ?? []).length).toBe(before.length)
      // No node restarted an executor: each says it kept the one it had.
      const keeping = nodes.map((node) => (node.output().match(/keeping executor/g) ?? []).length)
      expect(keeping.reduce((sum, count) => sum + count, 0)).toBe(before.length)
    },
    readyWithin(3) + 60_000
  )
})
