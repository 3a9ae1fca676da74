import { type ChildProcess, spawn } from "node:child_process"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { streamedText } from "../support/colorChatRequest.js"
import {
  adminHeaders,
  dataPlaneArgs,
  eventually,
  freePort,
  invoke,
  repoRoot,
  type RunningPlatform,
  runCli,
  startPlatform
} from "../support/platform.js"
import { reaperActive, trackGroup } from "../support/reaper/registry.js"

/**
 * The cluster of docs/cluster.md as a new user runs it: a control plane and two data-plane nodes on this
 * machine (node-a with cpu:0,cpu:1, node-b with cpu:2), the example apps registered one after
 * another. color_studio's generators share CPU devices with color_chat's encoders, and every app
 * goes on answering (node-a once stopped the encoders there). `tasks scale +1` shares a CPU device
 * when none is free, as the autoscaler does. The control plane, killed and started again on its
 * state dir, brings every app back (a restore once never finished).
 */

const token = "readme-cluster-token"
const examples = ["color_chat", "color_studio", "hello", "countdown"] as const

interface AppRow {
  readonly id: string
  readonly state: string
  readonly example?: unknown
  readonly error?: string
}

interface TaskRow {
  readonly id: string
  readonly name: string
  readonly state: string
  readonly executors: ReadonlyArray<{ readonly id: string; readonly node: string; readonly healthy: boolean }>
}

interface DataPlane {
  readonly process: ChildProcess
  output(): string
  readonly exited: Promise<number | null>
}

describe("the docs' three-process cluster serves every example app, and a restarted control plane brings them back", () => {
  let controlPlane: RunningPlatform
  let clusterPort: number
  let root: string
  const nodes: Array<DataPlane> = []
  const env = () => ({ CORNSERVE_GATEWAY_URL: controlPlane.url })

  const startControlPlane = (stateDir?: string) =>
    startPlatform({
      args: ["--role", "control-plane", "--cluster-port", String(clusterPort)],
      env: { CORNSERVE_CLUSTER_TOKEN: token },
      ...(stateDir === undefined ? {} : { stateDir })
    })

  const startDataPlane = (name: string, devices: string): DataPlane => {
    const child = spawn(process.execPath, dataPlaneArgs(`http://127.0.0.1:${clusterPort}`, name, devices), {
      cwd: repoRoot,
      env: { ...process.env, CORNSERVE_CLUSTER_TOKEN: token, CORNSERVE_MODEL_DIR: join(root, name) },
      stdio: ["ignore", "pipe", "pipe"],
      detached: reaperActive()
    })
    trackGroup(child)
    let output = ""
    child.stdout!.on("data", (chunk: Buffer) => (output += chunk.toString()))
    child.stderr!.on("data", (chunk: Buffer) => (output += chunk.toString()))
    return { process: child, output: () => output, exited: new Promise((resolve) => child.once("exit", resolve)) }
  }

  const apps = async () =>
    (
      (await (await fetch(`${controlPlane.url}/app/list`, { headers: adminHeaders() })).json()) as {
        apps: Array<AppRow>
      }
    ).apps
  const tasks = async () =>
    (
      (await (await fetch(`${controlPlane.url}/tasks/list`, { headers: adminHeaders() })).json()) as {
        tasks: Array<TaskRow>
      }
    ).tasks
  const allHealthy = async () => {
    const listed = await tasks()
    return listed.every((task) => task.state === "ready" && task.executors.every((executor) => executor.healthy))
      ? listed
      : undefined
  }

  /** What the app answers to the example its source gives, checked as a user would read it. */
  const answers = async (app: AppRow) => {
    const response = await invoke(controlPlane.url, app.id, JSON.stringify(app.example))
    if (response.status !== 200) expect.fail(`${app.id} answered ${response.status}: ${await response.text()}`)
    switch (app.id) {
      case "color_chat":
        return expect(await streamedText(response)).toBe("red")
      case "color_studio": {
        const answer = (await response.json()) as { colour: string; image: string; mimeType: string }
        expect(answer.colour).toBe("red")
        expect(answer.mimeType).toBe("image/png")
        return expect(Buffer.from(answer.image, "base64").subarray(1, 4).toString()).toBe("PNG")
      }
      case "hello":
        return expect(await response.json()).toEqual({ greeting: "Hello, Ada! Cornserve is serving you." })
      default: {
        const lines = (await response.text()).trim().split("\n")
        return expect(lines.map((line) => JSON.parse(line))).toEqual(
          [5, 4, 3, 2, 1].map((count) => ({ count, done: count === 1 }))
        )
      }
    }
  }

  /** Every registered app answers its example. */
  const everyAppAnswers = async (expected: ReadonlyArray<string>) => {
    const listed = await apps()
    expect(listed.map((app) => app.id).sort()).toEqual([...expected].sort())
    for (const app of listed) await answers(app)
  }

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-readme-cluster-"))
    clusterPort = await freePort()
    controlPlane = await startControlPlane()
    nodes.push(startDataPlane("node-a", "cpu:0,cpu:1"), startDataPlane("node-b", "cpu:2"))
    await eventually(async () => {
      const listed = (
        (await (await fetch(`${controlPlane.url}/nodes/list`, { headers: adminHeaders() })).json()) as {
          nodes: Array<{ state: string }>
        }
      ).nodes
      return listed.filter((node) => node.state === "ready").length === 2 ? true : undefined
    })
  })

  afterAll(async () => {
    for (const node of nodes) if (node.process.exitCode === null) node.process.kill("SIGTERM")
    await Promise.all(nodes.map((node) => node.exited))
    await controlPlane?.stop()
    await rm(controlPlane.stateDir, { recursive: true, force: true })
    await rm(root, { recursive: true, force: true })
  })

  it("registers color_chat, color_studio, hello and countdown one after another; after each, every app answers", async () => {
    const registered: Array<string> = []
    for (const app of examples) {
      const result = await runCli(["app", "register", join(repoRoot, "examples", `${app}.ts`)], env())
      expect(result.code, result.stderr).toBe(0)
      registered.push(app)
      await eventually(allHealthy)
      await everyAppAnswers(registered)
    }
    // The case that broke: color_studio's generators went onto CPU devices color_chat's encoders hold.
    expect(controlPlane.output()).toMatch(
      /placing an executor of task (image|audio)-generator-\S+ on node node-a \(cpu:\d.*\): shares cpu:\d with encoder-/
    )
    expect(nodes[0]!.output()).not.toMatch(/stopping executor/)
  }, 300_000)

  it("`tasks scale ID +1` shares a CPU device when none is free, and the apps go on answering", async () => {
    const encoder = (await tasks()).find((task) => task.name === "encoder-image-tiny-color-vlm")!
    const grown = await runCli(["tasks", "scale", encoder.id, "+1"], env())
    expect(grown.code, grown.stderr).toBe(0)
    expect(grown.stdout).toMatch(new RegExp(`^task ${encoder.id} has 2 executor\\(s\\) on `))
    expect(controlPlane.output()).toMatch(
      new RegExp(`placing an executor of task ${encoder.id} on node node-\\w \\(cpu:\\d.*\\): shares cpu:\\d with `)
    )
    const listed = await eventually(allHealthy)
    expect(listed.find((task) => task.id === encoder.id)!.executors).toHaveLength(2)
    await everyAppAnswers(examples)
    const shrunk = await runCli(["tasks", "scale", encoder.id, "-1"], env())
    expect(shrunk.code, shrunk.stderr).toBe(0)
  }, 120_000)

  it("killed and started again on its state dir, the control plane brings every app back", async () => {
    const before = (await tasks()).map((task) => task.id).sort()
    await controlPlane.kill()
    controlPlane = await startControlPlane(controlPlane.stateDir)
    const restored = await eventually(async () => {
      const listed = await apps()
      return listed.length === examples.length && listed.every((app) => app.state === "ready") ? listed : undefined
    }, 60_000)
    expect(restored.map((app) => app.id).sort()).toEqual([...examples].sort())
    expect((await eventually(allHealthy)).map((task) => task.id).sort()).toEqual(before)
    await everyAppAnswers(examples)
    // The executors still running on the nodes were taken back, not started again.
    expect(controlPlane.output()).toMatch(/node node-a kept executor encoder-/)
  }, 180_000)
})
