import { type ChildProcess, spawn } from "node:child_process"
import { request } from "node:http"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  boundClusterPort,
  dataPlaneArgs,
  eventually,
  repoRoot,
  type RunningPlatform,
  startPlatform
} from "../support/platform.js"

/**
 * The cluster port and each node's `/rpc` check the cluster token from the request's headers
 * before they read its body: a stranger's 64 MB POST is answered 401 at once, nothing of it is
 * decoded, and the node goes on beating (it once stalled ~97 s at 2 GB and was marked lost).
 */

const token = "cluster-auth-test-token"
const bodyBytes = 64 << 20

/**
 * POSTs a body of `bodyBytes`: sends the headers, waits a second for an answer from them alone,
 * then the body in 1 MiB writes; resolves with the status and how much was written before it came.
 */
const bigPost = (url: string, headers: Record<string, string>) =>
  new Promise<{ readonly status: number; readonly sentBeforeAnswer: number; readonly body: string }>(
    (resolve, reject) => {
      let sent = 0
      let answered = false
      const chunk = Buffer.alloc(1 << 20, 0xc1)
      const call = request(
        url,
        { method: "POST", headers: { "content-length": String(bodyBytes), ...headers } },
        (response) => {
          answered = true
          const sentBeforeAnswer = sent
          let body = ""
          response.on("data", (data: Buffer) => (body += data.toString()))
          response.on("end", () => {
            call.destroy()
            resolve({ status: response.statusCode ?? 0, sentBeforeAnswer, body })
          })
        }
      )
      call.on("error", (error) => (answered ? undefined : reject(error)))
      const pump = () => {
        while (!answered && sent < bodyBytes) {
          sent += chunk.length
          if (!call.write(chunk)) return void call.once("drain", pump)
        }
        if (!answered) call.end()
      }
      call.flushHeaders()
      setTimeout(pump, 1_000)
    }
  )

describe("cluster calls are authenticated before their bodies are read", () => {
  let controlPlane: RunningPlatform
  let node: ChildProcess
  let nodeOutput = ""
  let clusterUrl: string
  let nodeRpcUrl: string

  const stateOfNode = async () =>
    (
      (await (await fetch(`${controlPlane.url}/nodes/list`)).json()) as {
        nodes: Array<{ name: string; state: string }>
      }
    ).nodes.find((entry) => entry.name === "node-a")?.state

  beforeAll(async () => {
    controlPlane = await startPlatform({
      args: ["--role", "control-plane", "--cluster-port", "0"],
      env: { CORNSERVE_CLUSTER_TOKEN: token }
    })
    const port = await boundClusterPort(controlPlane)
    clusterUrl = `http://127.0.0.1:${port}`
    node = spawn(process.execPath, dataPlaneArgs(clusterUrl, "node-a", "cpu:0"), {
      cwd: repoRoot,
      env: { ...process.env, CORNSERVE_CLUSTER_TOKEN: token },
      stdio: ["ignore", "pipe", "pipe"]
    })
    node.stdout!.on("data", (chunk: Buffer) => (nodeOutput += chunk.toString()))
    node.stderr!.on("data", (chunk: Buffer) => (nodeOutput += chunk.toString()))
    const health = await eventually(async () => /health on (http:\/\/\S+)\/health/.exec(nodeOutput)?.[1])
    nodeRpcUrl = `${health}/rpc`
    await eventually(async () => ((await stateOfNode()) === "ready" ? true : undefined))
  })

  afterAll(async () => {
    if (node !== undefined && node.exitCode === null) {
      node.kill("SIGTERM")
      await new Promise((resolve) => node.once("exit", resolve))
    }
    await controlPlane?.stop()
  })

  it("a tokenless 64 MB POST to a node's /rpc is refused from its headers, and the node stays a member", async () => {
    const answer = await bigPost(nodeRpcUrl, { "content-type": "application/msgpack" })
    expect(answer.status).toBe(401)
    expect(JSON.parse(answer.body)).toEqual({
      error: { code: "Unauthorized", message: "this endpoint needs the cluster token" }
    })
    // Answered from the headers alone: not a byte of the body was waited for.
    expect(answer.sentBeforeAnswer).toBe(0)
    // The refusal is logged as it happens, and reaches the node's output a moment after the answer.
    await eventually(async () =>
      /refused a node call from a caller at 127\.0\.0\.1: its cluster token is not/.test(nodeOutput) ? true : undefined
    )
    // Longer than a node may go without a heartbeat (4 s): it was never lost.
    await new Promise((resolve) => setTimeout(resolve, 5_000))
    expect(await stateOfNode()).toBe("ready")
    expect(controlPlane.output()).not.toMatch(/node node-a is lost/)
  })

  it("the cluster port refuses a wrong token, then a body over its bound or of no stated length, unread", async () => {
    const wrong = await bigPost(`${clusterUrl}/rpc`, { authorization: "Bearer not-the-token" })
    expect(wrong.status).toBe(401)
    expect(wrong.sentBeforeAnswer).toBe(0)
    await eventually(async () =>
      /refused a caller at 127\.0\.0\.1: its cluster token is not/.test(controlPlane.output()) ? true : undefined
    )
    const large = await bigPost(`${clusterUrl}/rpc`, { authorization: `Bearer ${token}` })
    expect(large.status).toBe(413)
    expect(large.sentBeforeAnswer).toBe(0)
    expect(JSON.parse(large.body).error.code).toBe("PayloadTooLarge")
    const chunked = await fetch(`${clusterUrl}/rpc`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}` },
      body: new ReadableStream({
        start(controller) {
          controller.enqueue(new Uint8Array([0x90]))
          controller.close()
        }
      }),
      duplex: "half"
    } as RequestInit)
    expect(chunked.status).toBe(411)
    expect(await stateOfNode()).toBe("ready")
  })
})
