import { type ChildProcess, spawn } from "node:child_process"
import { mkdtemp, readFile, rm } from "node:fs/promises"
import { request } from "node:https"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  adminHeaders,
  dataPlaneArgs,
  eventually,
  repoRoot,
  type RunningPlatform,
  runCli,
  startPlatform
} from "../support/platform.js"
import { hasOpenssl, makeCertificates } from "../support/certificates.js"

/**
 * --tls-cert/--tls-key serve the gateway and the cluster port over HTTPS; a data-plane node checks
 * the control plane's certificate against --tls-ca, and one without it does not join. The test
 * makes its own CA and a certificate for 127.0.0.1 with openssl.
 */

const token = "tls-test-cluster-token"

/** GET over HTTPS, checking the server against `ca`. */
const getJson = (url: string, ca: string | undefined, headers: Record<string, string> = {}) =>
  new Promise<{ status: number; body: string }>((resolve, reject) => {
    const call = request(url, { ca, headers }, (response) => {
      let body = ""
      response.on("data", (chunk: Buffer) => (body += chunk.toString()))
      response.on("end", () => resolve({ status: response.statusCode ?? 0, body }))
    })
    call.on("error", reject)
    call.end()
  })

describe.skipIf(!hasOpenssl)("TLS on the gateway and the cluster port", () => {
  let dir: string
  let ca: string
  let controlPlane: RunningPlatform
  let joinUrl: string
  const nodes: Array<{ process: ChildProcess; output: () => string }> = []

  const startNode = (name: string, extra: ReadonlyArray<string>) => {
    const child = spawn(process.execPath, dataPlaneArgs(joinUrl, name, "cpu:0", extra), {
      cwd: repoRoot,
      env: { ...process.env, CORNSERVE_CLUSTER_TOKEN: token },
      stdio: ["ignore", "pipe", "pipe"]
    })
    let output = ""
    child.stdout!.on("data", (chunk: Buffer) => (output += chunk.toString()))
    child.stderr!.on("data", (chunk: Buffer) => (output += chunk.toString()))
    const node = { process: child, output: () => output }
    nodes.push(node)
    return node
  }

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "cornserve-tls-"))
    await makeCertificates(dir)
    ca = await readFile(join(dir, "ca.pem"), "utf8")
    controlPlane = await startPlatform({
      args: [
        "--role",
        "control-plane",
        "--cluster-port",
        "0",
        "--tls-cert",
        join(dir, "server.pem"),
        "--tls-key",
        join(dir, "server.key")
      ],
      env: { CORNSERVE_CLUSTER_TOKEN: token }
    })
    const port = await eventually(
      async () => /cluster port open on \S+:(\d+) \(HTTPS\)/.exec(controlPlane.output())?.[1]
    )
    joinUrl = `https://127.0.0.1:${port}`
  })

  afterAll(async () => {
    for (const node of nodes) {
      if (node.process.exitCode === null) {
        node.process.kill("SIGTERM")
        await new Promise((resolve) => node.process.once("exit", resolve))
      }
    }
    await controlPlane?.stop()
    if (dir !== undefined) await rm(dir, { recursive: true, force: true })
  })

  it("serves the gateway over HTTPS: a client that trusts the CA gets answers, one that does not is refused", async () => {
    expect(controlPlane.url).toMatch(/^https:\/\/127\.0\.0\.1:\d+$/)
    const health = await getJson(`${controlPlane.url}/health`, ca)
    expect(health.status).toBe(200)
    await expect(getJson(`${controlPlane.url}/health`, undefined)).rejects.toThrow(/self.signed|certificate/i)
    // The CLI trusts the CA through Node's own NODE_EXTRA_CA_CERTS.
    const cli = await runCli(["nodes", "list"], {
      CORNSERVE_GATEWAY_URL: controlPlane.url,
      NODE_EXTRA_CA_CERTS: join(dir, "ca.pem")
    })
    expect(cli.code).toBe(0)
  })

  it("a node with --tls-ca joins over HTTPS; a node without it does not, and says why", async () => {
    startNode("node-a", ["--tls-ca", join(dir, "ca.pem")])
    await eventually(async () => {
      const listed = await getJson(`${controlPlane.url}/nodes/list`, ca, adminHeaders())
      const nodesListed = (JSON.parse(listed.body) as { nodes: Array<{ name: string; state: string }> }).nodes
      return nodesListed.some((node) => node.name === "node-a" && node.state === "ready") ? true : undefined
    }, 60_000)
    const untrusting = startNode("node-b", [])
    await eventually(async () =>
      /not reachable.*(self.signed|certificate)/i.test(untrusting.output()) ? true : undefined
    )
    const listed = await getJson(`${controlPlane.url}/nodes/list`, ca, adminHeaders())
    expect(listed.body).not.toContain("node-b")
  })
})
