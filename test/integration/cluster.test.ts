import { type ChildProcess, spawn } from "node:child_process"
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join as joinPath } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { joinAndBeat, joinOnce, type LyingNode, startLyingNode } from "../fixtures/cluster/forgedNode.js"
import {
  adminHeaders,
  boundClusterPort,
  dataPlaneArgs,
  eventually,
  repoRoot,
  type RunningPlatform,
  runCli,
  startPlatform
} from "../support/platform.js"

/**
 * The real binary as a control plane and data-plane nodes on this machine: nodes join with the
 * cluster token, are listed with their devices, are lost when they stop beating and ready again
 * when they come back; wrong tokens, taken names and a control plane that is not there are told.
 */

const token = "cluster-test-token"

interface DataPlane {
  readonly process: ChildProcess
  output(): string
  /** Resolves with the exit code. */
  readonly exited: Promise<number | null>
}

const startDataPlane = (join: string, name: string, env: Record<string, string> = {}): DataPlane => {
  const child = spawn(process.execPath, dataPlaneArgs(join, name, "cpu:0,cpu:1"), {
    cwd: repoRoot,
    env: { ...process.env, CORNSERVE_CLUSTER_TOKEN: token, ...env },
    stdio: ["ignore", "pipe", "pipe"]
  })
  let output = ""
  child.stdout!.on("data", (chunk: Buffer) => (output += chunk.toString()))
  child.stderr!.on("data", (chunk: Buffer) => (output += chunk.toString()))
  return {
    process: child,
    output: () => output,
    exited: new Promise((resolve) => child.once("exit", (code) => resolve(code)))
  }
}

const stopAll = async (nodes: ReadonlyArray<DataPlane>) => {
  for (const node of nodes) if (node.process.exitCode === null) node.process.kill("SIGTERM")
  await Promise.all(nodes.map((node) => node.exited))
}

interface NodeRow {
  readonly name: string
  readonly role: string
  readonly state: string
  readonly devices: ReadonlyArray<{ readonly id: string; readonly task: string | null }>
}

describe("cluster: a control plane and data-plane nodes", () => {
  let controlPlane: RunningPlatform
  let join: string
  const started: Array<DataPlane> = []

  const nodesList = async (): Promise<ReadonlyArray<NodeRow>> =>
    ((await (await fetch(`${controlPlane.url}/nodes/list`)).json()) as { nodes: Array<NodeRow> }).nodes
  const stateOf = async (name: string) => (await nodesList()).find((node) => node.name === name)?.state
  const dataPlane = (name: string, env: Record<string, string> = {}) => {
    const node = startDataPlane(join, name, env)
    started.push(node)
    return node
  }

  beforeAll(async () => {
    controlPlane = await startPlatform({
      args: ["--role", "control-plane", "--cluster-port", "0"],
      env: { CORNSERVE_CLUSTER_TOKEN: token }
    })
    const port = await boundClusterPort(controlPlane)
    join = `http://127.0.0.1:${port}`
  })

  afterAll(async () => {
    await stopAll(started)
    await controlPlane?.stop()
  })

  it("nodes join and are listed with their devices, over HTTP and by the CLI", async () => {
    const free = [
      { id: "cpu:0", type: "cpu", threads: 1, task: null, tasks: [] },
      { id: "cpu:1", type: "cpu", threads: 1, task: null, tasks: [] }
    ]
    dataPlane("node-a")
    dataPlane("node-b")
    const nodes = await eventually(async () => {
      const listed = await nodesList()
      return listed.filter((node) => node.state === "ready").length === 2 ? listed : undefined
    })
    expect(nodes).toEqual([
      expect.objectContaining({ name: "node-a", role: "data-plane", state: "ready", devices: free }),
      expect.objectContaining({ name: "node-b", role: "data-plane", state: "ready", devices: free })
    ])
    const cli = await runCli(["nodes", "list"], { CORNSERVE_GATEWAY_URL: controlPlane.url })
    expect(cli.code).toBe(0)
    expect(cli.stdout).toMatch(/node-a\s+data-plane\s+127\.0\.0\.1\s+ready\s+cpu:0, cpu:1/)
    expect(controlPlane.output()).toMatch(/node node-a joined from 127\.0\.0\.1 with 2 device\(s\)/)
  })

  it("a node with the wrong token is refused, and both sides say so", async () => {
    const intruder = dataPlane("node-x", { CORNSERVE_CLUSTER_TOKEN: "wrong" })
    expect(await intruder.exited).toBe(1)
    expect(intruder.output()).toMatch(/refused this node: its CORNSERVE_CLUSTER_TOKEN is not the cluster's/)
    expect(controlPlane.output()).toMatch(/refused node node-x \(127\.0\.0\.1\): its cluster token is not/)
    expect(await stateOf("node-x")).toBeUndefined()
  })

  it("a node name that is not a name is refused before anything of it is kept, and the node says why", async () => {
    const node = (name: string) => ({
      name,
      instance: "forged",
      devices: [{ id: "cpu:0", type: "cpu" as const, index: 0, threads: 1 }],
      advertiseHost: "127.0.0.1",
      rpcPort: 9,
      executors: []
    })
    const refusals = await Promise.all(
      ["../../x", "a".repeat(5_000), "__proto__", "Node-A"].map((name) => joinOnce(join, token, node(name)))
    )
    for (const refusal of refusals) {
      expect(refusal.refused).toBe("NodeNameInvalid")
      expect(refusal.message).toMatch(/is not 1 to 63 lowercase letters, digits, "-", "_" or "\."/)
    }
    // The real binary, under the default name: it refuses the name before it starts, and exits 2.
    const unnamed = dataPlane("local")
    expect(await unnamed.exited).toBe(2)
    expect(unnamed.output()).toMatch(
      /--node-name: the node name "local" is reserved \(it is the default of --node-name\)/
    )
    const known = await readFile(joinPath(controlPlane.stateDir, "nodes.json"), "utf8")
    expect(JSON.parse(known)).toEqual({ nodes: ["node-a", "node-b"] })
    expect((await nodesList()).map((listed) => listed.name)).toEqual(["node-a", "node-b"])
  })

  it("a node's account of its devices is checked: ids that are not its devices' are refused", async () => {
    const forged = (
      devices: ReadonlyArray<{ id: string; index: number }>,
      executorDevices: ReadonlyArray<string> = []
    ) =>
      joinOnce(join, token, {
        name: "node-forged",
        instance: "forged",
        devices: devices.map((device) => ({ ...device, type: "cpu" as const, threads: 1 })),
        advertiseHost: "127.0.0.1",
        rpcPort: 9,
        executors:
          executorDevices.length === 0
            ? []
            : [{ id: "x-0", taskId: "x", devices: executorDevices, state: "ready" as const }]
      })
    const twice = await forged([
      { id: "cpu:0", index: 0 },
      { id: "cpu:0", index: 0 }
    ])
    expect(twice).toEqual({ refused: "NodeDevicesInvalid", message: expect.stringMatching(/names device cpu:0 twice/) })
    const misnamed = await forged([{ id: "../cpu", index: 0 }])
    expect(misnamed.refused).toBe("NodeDevicesInvalid")
    expect(misnamed.message).toMatch(/its device "\.\.\/cpu" is not cpu:0/)
    const foreign = await forged([{ id: "cpu:0", index: 0 }], ["cpu:7"])
    expect(foreign.message).toMatch(/reports executor x-0 on devices it does not have \(cpu:7\)/)
    expect(await stateOf("node-forged")).toBeUndefined()
    // Joined honestly, it cannot slip a foreign executor in through a heartbeat either.
    const beat = await joinAndBeat(
      join,
      token,
      {
        name: "node-beating",
        instance: "beating",
        devices: [{ id: "cpu:0", index: 0, type: "cpu", threads: 1 }],
        advertiseHost: "127.0.0.1",
        rpcPort: 9,
        executors: []
      },
      [{ id: "y-0", taskId: "y", devices: ["cpu:7"], state: "ready", url: "http://127.0.0.1:9" }]
    )
    expect(beat).toBeUndefined()
    await eventually(async () =>
      /node node-beating reports 1 executor\(s\) on devices it does not have; they are ignored/.test(
        controlPlane.output()
      )
        ? true
        : undefined
    )
  })

  it("a second node under a running node's name is refused", async () => {
    const twin = dataPlane("node-a")
    expect(await twin.exited).toBe(1)
    expect(twin.output()).toMatch(/already has the name node-a: give this one another --node-name/)
    expect(await stateOf("node-a")).toBe("ready")
  })

  it("a node killed is lost after 4 s without a heartbeat; started again under its name, it is ready again", async () => {
    const node = dataPlane("node-c")
    await eventually(async () => ((await stateOf("node-c")) === "ready" ? true : undefined))
    node.process.kill("SIGKILL")
    await eventually(async () => ((await stateOf("node-c")) === "lost" ? true : undefined), 10_000)
    // The control plane's own account of when: lost after 4 s without a heartbeat (no wall-clock check here).
    expect(controlPlane.output()).toMatch(/node node-c is lost: no heartbeat for 4 s/)
    const cli = await runCli(["nodes", "list"], { CORNSERVE_GATEWAY_URL: controlPlane.url })
    expect(cli.stdout).toMatch(/node-c\s+data-plane\s+127\.0\.0\.1\s+lost/)
    dataPlane("node-c")
    await eventually(async () => ((await stateOf("node-c")) === "ready" ? true : undefined))
    expect(controlPlane.output()).toMatch(/node node-c rejoined/)
  })

  it("a node pointed where no control plane listens keeps trying, and says so", async () => {
    const lonely = startDataPlane("http://127.0.0.1:9", "node-lonely")
    started.push(lonely)
    await eventually(async () => ((lonely.output().match(/is not reachable/g) ?? []).length >= 2 ? true : undefined))
    expect(lonely.output()).toMatch(/the control plane at http:\/\/127\.0\.0\.1:9 is not reachable .*retrying/)
    expect(lonely.process.exitCode).toBeNull()
  })

  it("usage errors: --join without --role data-plane, a data plane without --join or without the token", async () => {
    const joinAlone = await runCli(["serve", "--join", join])
    expect(joinAlone.code).toBe(2)
    expect(joinAlone.stderr).toMatch(/--join is for --role data-plane/)
    const noJoin = await runCli(["serve", "--role", "data-plane"], { CORNSERVE_CLUSTER_TOKEN: token })
    expect(noJoin.code).toBe(2)
    expect(noJoin.stderr).toMatch(/--role data-plane needs --join/)
    const noToken = await runCli(["serve", "--role", "control-plane"], { CORNSERVE_CLUSTER_TOKEN: "" })
    expect(noToken.code).toBe(2)
    expect(noToken.stderr).toMatch(/needs CORNSERVE_CLUSTER_TOKEN/)
  })

  it("nodes join a restarted control plane again without being restarted; one whose nodes.json is torn starts all the same", async () => {
    const port = new URL(join).port
    await controlPlane.stop()
    // The nodes that joined at once are all kept, in one whole file.
    const knownPath = joinPath(controlPlane.stateDir, "nodes.json")
    const known = JSON.parse(await readFile(knownPath, "utf8")) as { readonly nodes: ReadonlyArray<string> }
    expect(known.nodes).toEqual(expect.arrayContaining(["node-a", "node-b"]))
    // A torn write (as two writes at once once left): the control plane says so and starts.
    await writeFile(knownPath, `${JSON.stringify(known)}"]}`)
    controlPlane = await startPlatform({
      args: ["--role", "control-plane", "--cluster-port", port],
      env: { CORNSERVE_CLUSTER_TOKEN: token },
      stateDir: controlPlane.stateDir
    })
    await eventually(async () => ((await stateOf("node-b")) === "ready" ? true : undefined), 20_000)
    expect(started.find((node) => node.output().includes("node-b"))!.output()).toMatch(/joining again/)
    expect(controlPlane.output()).toMatch(/ignoring \S*nodes\.json: it is not a list of node names/)
  })
})

describe("cluster: a node that lies about its devices", () => {
  const liarToken = "lying-node-test-token"
  let controlPlane: RunningPlatform
  let honest: ChildProcess
  let liar: LyingNode
  let modelDir: string

  beforeAll(async () => {
    modelDir = await mkdtemp(joinPath(tmpdir(), "cornserve-models-"))
    controlPlane = await startPlatform({
      args: ["--role", "control-plane", "--cluster-port", "0"],
      env: { CORNSERVE_CLUSTER_TOKEN: liarToken }
    })
    const port = await boundClusterPort(controlPlane)
    const clusterUrl = `http://127.0.0.1:${port}`
    honest = spawn(process.execPath, dataPlaneArgs(clusterUrl, "node-honest", "cpu:0,cpu:1,cpu:2"), {
      cwd: repoRoot,
      env: { ...process.env, CORNSERVE_CLUSTER_TOKEN: liarToken, CORNSERVE_MODEL_DIR: modelDir },
      stdio: "ignore"
    })
    liar = await startLyingNode(clusterUrl, liarToken, "node-liar", 64)
    await eventually(async () => {
      const { nodes } = (await (await fetch(`${controlPlane.url}/nodes/list`, { headers: adminHeaders() })).json()) as {
        nodes: Array<{ state: string }>
      }
      return nodes.filter((node) => node.state === "ready").length === 2 ? true : undefined
    })
  })

  afterAll(async () => {
    await liar?.stop()
    if (honest?.exitCode === null) {
      honest.kill("SIGTERM")
      await new Promise((resolve) => honest.once("exit", resolve))
    }
    await controlPlane?.stop()
    await rm(modelDir, { recursive: true, force: true })
  })

  it("takes the placement, fails every start, and the apps are placed on the honest node instead", async () => {
    const env = { CORNSERVE_GATEWAY_URL: controlPlane.url }
    const chat = await runCli(["app", "register", joinPath(repoRoot, "examples", "color_chat.ts")], env)
    expect(chat.code, chat.stderr).toBe(0)
    expect(liar.startsAsked()).toBeGreaterThan(0)
    expect(chat.stderr).toMatch(/placing again, avoiding node\(s\) node-liar/)
    expect(controlPlane.output()).toMatch(/node node-liar failed a start; placement avoids it for a while/)
    const startsAfterChat = liar.startsAsked()
    // The next registration goes to the honest node at once, sharing its CPU devices.
    const studio = await runCli(["app", "register", joinPath(repoRoot, "examples", "color_studio.ts")], env)
    expect(studio.code, studio.stderr).toBe(0)
    expect(liar.startsAsked()).toBe(startsAfterChat)
    const { tasks } = (await (await fetch(`${controlPlane.url}/tasks/list`, { headers: adminHeaders() })).json()) as {
      tasks: Array<{ executors: Array<{ node: string }> }>
    }
    expect(tasks).toHaveLength(5)
    expect(new Set(tasks.flatMap((task) => task.executors.map((executor) => executor.node)))).toEqual(
      new Set(["node-honest"])
    )
  }, 240_000)
})
