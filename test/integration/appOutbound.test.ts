import { readFileSync } from "node:fs"
import { createServer as createHttpServer, type Server as HttpServer } from "node:http"
import { createServer, type Server } from "node:net"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  adminHeaders,
  eventually,
  invoke,
  registerRaw,
  removeStateDir,
  repoRoot,
  runCli,
  type RunningPlatform,
  startPlatform
} from "../support/platform.js"

const source = readFileSync(join(repoRoot, "test", "fixtures", "apps", "outbound_client.ts"), "utf8")

const call = async (platform: RunningPlatform, appId: string, body: unknown) => {
  const response = await invoke(platform.url, appId, JSON.stringify(body))
  expect(response.status).toBe(200)
  return (await response.json()) as { status?: number; text?: string; refused?: string; refusedStatus?: number }
}

const listen = (server: Server | HttpServer) =>
  new Promise<number>((resolve) =>
    server.listen(0, "127.0.0.1", () => resolve((server.address() as { port: number }).port))
  )

describe("an app reaches the hosts its registration allows, and only those", () => {
  let platform: RunningPlatform
  /** An HTTP service the app may use, answering with what it was asked. */
  let service: HttpServer
  let servicePort = 0
  /** A line-echo TCP service, allowed by name (any port) but not by address. */
  let echo: Server
  let echoPort = 0
  let echoConnections = 0

  beforeAll(async () => {
    service = createHttpServer((request, response) => {
      const chunks: Array<Buffer> = []
      request.on("data", (chunk: Buffer) => chunks.push(chunk))
      request.on("end", () => {
        response.setHeader("content-type", "text/plain")
        response.end(`${request.method} ${request.url} ${Buffer.concat(chunks).toString("utf8")}`.trim())
      })
    })
    servicePort = await listen(service)
    echo = createServer((socket) => {
      echoConnections++
      socket.once("data", (chunk: Buffer) => socket.end(`echo: ${chunk.toString("utf8").trim()}`))
    })
    echoPort = await listen(echo)
    // The services run on this machine's loopback: the operator allows private addresses.
    platform = await startPlatform({ args: ["--devices", "cpu:0", "--allow-private-outbound"] })
    const registered = await registerRaw(platform.url, {
      name: "outbound_client",
      source,
      allowHosts: [`127.0.0.1:${servicePort}`, "localhost"]
    })
    expect(registered.text).toContain("event: final")
    expect((await registerRaw(platform.url, { name: "no_outbound", source })).text).toContain("event: final")
  }, 120_000)

  afterAll(async () => {
    await platform?.stop()
    if (platform !== undefined) await removeStateDir(platform.stateDir)
    await new Promise((resolve) => service?.close(resolve))
    await new Promise((resolve) => echo?.close(resolve))
  })

  it("fetches from an allowed host:port, with a method and a body", async () => {
    expect(
      await call(platform, "outbound_client", { action: "fetch", url: `http://127.0.0.1:${servicePort}/a?b=1` })
    ).toEqual({ status: 200, text: "GET /a?b=1" })
    expect(
      await call(platform, "outbound_client", {
        action: "fetch",
        url: `http://127.0.0.1:${servicePort}/echo`,
        method: "POST",
        body: "from the app"
      })
    ).toEqual({ status: 200, text: "POST /echo from the app" })
  })

  it("opens a raw TCP stream to a host allowed by name on any port", async () => {
    expect(
      await call(platform, "outbound_client", { action: "connect", host: "localhost", port: echoPort, line: "hi" })
    ).toEqual({ text: "echo: hi" })
  })

  it("refuses a port or host the registration does not name, says why, and writes it to the app's log", async () => {
    const before = echoConnections
    const refused = await call(platform, "outbound_client", {
      action: "connect",
      host: "127.0.0.1",
      port: echoPort,
      line: "hi"
    })
    expect(refused.refusedStatus).toBe(403)
    expect(refused.refused).toContain(`127.0.0.1:${echoPort} is not among the hosts the app's registration allows`)
    expect(echoConnections, "nothing reached the service").toBe(before)
    const logs = await fetch(`${platform.url}/app/logs/outbound_client`, { headers: adminHeaders() })
    expect(await logs.text()).toContain(`(platform) outbound connection refused: 127.0.0.1:${echoPort} is not among`)
  })

  it("gives an app whose registration names no host no way out, and says how to allow one", async () => {
    const refused = await call(platform, "no_outbound", { action: "fetch", url: `http://127.0.0.1:${servicePort}/` })
    expect(refused.refused).toContain("the app has no network")
    expect(refused.refused).toContain(`--allow-host 127.0.0.1:${servicePort}`)
  })

  it("refuses a registration naming something that is not a host, and changes nothing", async () => {
    for (const bad of ["*.example.com", "https://example.com", "example.com:99999", "a b"]) {
      const answer = await registerRaw(platform.url, { name: "bad_hosts", source, allowHosts: [bad] })
      expect(answer.status, bad).toBe(400)
      expect(answer.text, bad).toMatch(/is not a host|the port is not 1 to 65535/)
    }
    const many = Array.from({ length: 33 }, (_, index) => `host${index}.example.com`)
    expect((await registerRaw(platform.url, { name: "bad_hosts", source, allowHosts: many })).status).toBe(400)
    const list = await runCli(["app", "list", "--gateway", platform.url])
    expect(list.stdout).not.toContain("bad_hosts")
  })

  it("keeps the allowed hosts across a restart, and `app register --allow-host` sets them", async () => {
    const file = join(platform.stateDir, "cli_outbound.ts")
    await import("node:fs/promises").then(({ writeFile }) => writeFile(file, source))
    const registered = await runCli([
      "app",
      "register",
      file,
      "--allow-host",
      `127.0.0.1:${servicePort}`,
      "--gateway",
      platform.url
    ])
    expect(registered.code, registered.stderr).toBe(0)
    await platform.stop()
    platform = await startPlatform({
      stateDir: platform.stateDir,
      args: ["--devices", "cpu:0", "--allow-private-outbound"]
    })
    for (const app of ["outbound_client", "cli_outbound"]) {
      // 503 while it is being restored.
      const answer = await eventually(async () => {
        const response = await invoke(
          platform.url,
          app,
          JSON.stringify({ action: "fetch", url: `http://127.0.0.1:${servicePort}/again` })
        )
        return response.status === 503 ? undefined : response.json()
      }, 60_000)
      expect(answer, app).toEqual({ status: 200, text: "GET /again" })
    }
  }, 120_000)
})
