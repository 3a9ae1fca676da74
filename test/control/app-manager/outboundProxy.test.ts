import { mkdtemp, readFile, rm } from "node:fs/promises"
import { createServer, type Server } from "node:http"
import { createServer as createHttpsServer } from "node:https"
import { connect, createServer as createTcpServer, type Socket } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { connect as tlsConnect } from "node:tls"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { OutboundError, outbound } from "../../../src/app-runtime/Outbound.js"
import { maxTunnels, OutboundProxy, parseOutboundHost } from "../../../src/control/app-manager/OutboundProxy.js"
import { hasOpenssl, makeCertificates } from "../../support/certificates.js"
import { eventually } from "../../support/platform.js"

describe("an allowed host, as a registration names it", () => {
  it("is a DNS name or an IP literal, with or without a port", () => {
    expect(parseOutboundHost("API.example.com")).toEqual({ host: "api.example.com", port: undefined })
    expect(parseOutboundHost("api.example.com:443")).toEqual({ host: "api.example.com", port: 443 })
    expect(parseOutboundHost("10.0.0.7:6333")).toEqual({ host: "10.0.0.7", port: 6333 })
    expect(parseOutboundHost("[2001:db8::1]:443")).toEqual({ host: "2001:db8::1", port: 443 })
    // An IPv6 literal as a URL writes it, however the registration or the request spells it.
    expect(parseOutboundHost("[2001:DB8:0:0::1]:443")).toEqual({ host: "2001:db8::1", port: 443 })
    expect(parseOutboundHost("[::ffff:127.0.0.1]")).toEqual({ host: "::ffff:7f00:1", port: undefined })
    for (const bad of [
      "*.example.com",
      "http://example.com",
      "example.com:0",
      "example.com:70000",
      "-a.com",
      "2001:db8::1",
      ""
    ]) {
      expect(typeof parseOutboundHost(bad), bad).toBe("string")
    }
  })
})

describe("the outbound proxy", () => {
  let server: Server
  let port = 0
  const notes: Array<string> = []
  let proxy: OutboundProxy | undefined

  beforeAll(async () => {
    server = createServer((request, response) => response.end(`reached ${request.url}`))
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
    port = (server.address() as { port: number }).port
  })
  afterAll(() => new Promise((resolve) => server.close(resolve)))
  afterEach(() => {
    proxy?.close()
    proxy = undefined
    delete process.env.CORNSERVE_OUTBOUND_SOCKET
  })

  const open = (hosts: ReadonlyArray<string>, allowPrivate: boolean) => {
    proxy = new OutboundProxy(
      { hosts: hosts.map((text) => parseOutboundHost(text) as { host: string; port: number }), allowPrivate },
      undefined,
      (line) => notes.push(line)
    )
    process.env.CORNSERVE_OUTBOUND_SOCKET = proxy.path
    return proxy
  }

  it("tunnels to an allowed host when private addresses are allowed", async () => {
    open([`127.0.0.1:${port}`], true)
    const answer = await outbound.fetch(`http://127.0.0.1:${port}/x`)
    expect(await answer.text()).toBe("reached /x")
  })

  it("refuses a name or address that leads to a non-public address unless the operator allows it", async () => {
    open(["localhost", `127.0.0.1:${port}`], false)
    for (const url of [`http://localhost:${port}/`, `http://127.0.0.1:${port}/`]) {
      const refused = await outbound.fetch(url).catch((error: unknown) => error)
      expect(refused, url).toBeInstanceOf(OutboundError)
      expect((refused as OutboundError).status).toBe(403)
      expect((refused as OutboundError).message).toContain("resolves to no public address")
    }
    expect(notes.some((line) => line.includes("--allow-private-outbound"))).toBe(true)
  })

  it("refuses loopback however an IPv6 literal writes it, in the registration or the request", async () => {
    open([`[::ffff:127.0.0.1]:${port}`, `[::ffff:0:7f00:1]:${port}`, `[64:ff9b::127.0.0.1]:${port}`], false)
    for (const host of ["::ffff:7f00:1", "::ffff:127.0.0.1", "::ffff:0:127.0.0.1", "64:ff9b::7f00:1"]) {
      const refused = await outbound.connect(host, port).catch((error: unknown) => error)
      expect((refused as OutboundError).status, host).toBe(403)
      expect((refused as OutboundError).message).toContain("carries the non-public IPv4 address 127.0.0.1")
    }
  })

  it(`holds ${maxTunnels} tunnels at once, each counted once, and takes another when one closes`, async () => {
    const held: Array<Socket> = []
    const service = createTcpServer((socket) => {
      held.push(socket)
      socket.on("error", () => undefined)
    })
    await new Promise<void>((resolve) => service.listen(0, "127.0.0.1", resolve))
    const servicePort = (service.address() as { port: number }).port
    open([`127.0.0.1:${servicePort}`], true)
    const tunnels: Array<Socket> = []
    try {
      for (let index = 0; index < maxTunnels; index++) tunnels.push(await outbound.connect("127.0.0.1", servicePort))
      const refused = await outbound.connect("127.0.0.1", servicePort).catch((error: unknown) => error)
      expect((refused as OutboundError).status).toBe(429)
      // Each tunnel still carries data both ways.
      const echoed = new Promise<string>((resolve) =>
        tunnels[0]!.once("data", (chunk: Buffer) => resolve(chunk.toString()))
      )
      await eventually(async () => (held.length === maxTunnels ? true : undefined), 5000)
      held[0]!.write("from the host")
      expect(await echoed).toBe("from the host")
      tunnels.pop()!.destroy()
      await eventually(async () => {
        const another = await outbound.connect("127.0.0.1", servicePort).catch(() => undefined)
        if (another !== undefined) tunnels.push(another)
        return another
      }, 5000)
    } finally {
      for (const tunnel of tunnels) tunnel.destroy()
      for (const socket of held) socket.destroy()
      await new Promise((resolve) => service.close(resolve))
    }
  })

  it("answers anything but a bounded CONNECT with an error and closes", async () => {
    const { path } = open([`127.0.0.1:${port}`], true)
    const exchange = (text: string) =>
      new Promise<string>((resolve) => {
        const socket = connect({ path })
        const chunks: Array<Buffer> = []
        socket.on("data", (chunk: Buffer) => chunks.push(chunk))
        socket.on("close", () => resolve(Buffer.concat(chunks).toString("latin1")))
        socket.on("error", () => undefined)
        socket.write(text)
      })
    expect(await exchange(`GET http://127.0.0.1:${port}/ HTTP/1.1\r\n\r\n`)).toMatch(/^HTTP\/1\.1 400 /)
    expect(await exchange(`CONNECT 127.0.0.1 HTTP/1.1\r\n\r\n`)).toMatch(/^HTTP\/1\.1 400 /)
    expect(await exchange(`CONNECT 127.0.0.1:${port} HTTP/1.1\r\nx: ${"a".repeat(10_000)}`)).toMatch(/^HTTP\/1\.1 431 /)
  })

  it.runIf(hasOpenssl)("carries TLS end to end: the app checks the host's certificate itself", async () => {
    const dir = await mkdtemp(join(tmpdir(), "cornserve-outbound-tls-"))
    try {
      await makeCertificates(dir)
      const [cert, key, ca] = await Promise.all(
        ["server.pem", "server.key", "ca.pem"].map((name) => readFile(join(dir, name), "utf8"))
      )
      const secure = createHttpsServer({ cert, key }, (_, response) => response.end("secret answer"))
      await new Promise<void>((resolve) => secure.listen(0, "127.0.0.1", resolve))
      const securePort = (secure.address() as { port: number }).port
      open([`127.0.0.1:${securePort}`], true)
      // fetch checks the certificate against the system's CAs, which do not know the test's.
      const refused = await outbound.fetch(`https://127.0.0.1:${securePort}/`).catch((error: unknown) => error)
      expect((refused as NodeJS.ErrnoException).code).toMatch(/CERT|SIGNATURE|ISSUER/)
      // A raw stream with TLS on it, checked against the test's CA, reaches the host.
      const socket = await outbound.connect("127.0.0.1", securePort)
      const answer = await new Promise<string>((resolve, reject) => {
        const tls = tlsConnect({ socket, ca, host: "127.0.0.1" }, () =>
          tls.end("GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        )
        let text = ""
        tls.on("data", (chunk: Buffer) => (text += chunk.toString()))
        tls.on("close", () => resolve(text))
        tls.on("error", reject)
      })
      expect(answer).toContain("secret answer")
      await new Promise((resolve) => secure.close(resolve))
    } finally {
      await rm(dir, { recursive: true, force: true })
    }
  })

  it("removes its socket when closed", async () => {
    const { path } = open([`127.0.0.1:${port}`], true)
    proxy!.close()
    proxy = undefined
    const refused = await outbound.fetch(`http://127.0.0.1:${port}/`).catch((error: unknown) => error)
    expect(refused).toBeInstanceOf(OutboundError)
    expect(path).toContain("cornserve-outbound-")
  })
})
