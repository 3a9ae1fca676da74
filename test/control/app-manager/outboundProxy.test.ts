import { mkdtemp, readFile, rm } from "node:fs/promises"
import { createServer, type Server } from "node:http"
import { createServer as createHttpsServer } from "node:https"
import { connect } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { connect as tlsConnect } from "node:tls"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { OutboundError, outbound } from "../../../src/app-runtime/Outbound.js"
import { OutboundProxy, parseOutboundHost } from "../../../src/control/app-manager/OutboundProxy.js"
import { hasOpenssl, makeCertificates } from "../../support/certificates.js"

describe("an allowed host, as a registration names it", () => {
  it("is a DNS name or an IP literal, with or without a port", () => {
    expect(parseOutboundHost("API.example.com")).toEqual({ host: "api.example.com", port: undefined })
    expect(parseOutboundHost("api.example.com:443")).toEqual({ host: "api.example.com", port: 443 })
    expect(parseOutboundHost("10.0.0.7:6333")).toEqual({ host: "10.0.0.7", port: 6333 })
    expect(parseOutboundHost("[2001:db8::1]:443")).toEqual({ host: "2001:db8::1", port: 443 })
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
