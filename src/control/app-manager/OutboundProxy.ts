import { chmodSync, chownSync, mkdtempSync, rmSync } from "node:fs"
import { lookup } from "node:dns/promises"
import { connect, createServer, isIP, type Server, type Socket } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { nonPublicReason } from "../../executors/common/media/PublicAddress.js"
import type { AppUser } from "./AppSandbox.js"

/**
 * One host an app may connect to, as its registration named it: `host` (any port) or `host:port`.
 * A host is a DNS name or an IP literal (IPv6 in brackets).
 */
export interface OutboundHost {
  readonly host: string
  readonly port: number | undefined
}

/** The outbound connections an app's registration allows. */
export interface OutboundRules {
  readonly hosts: ReadonlyArray<OutboundHost>
  /**
   * Whether a named host may resolve to a loopback, private or otherwise non-public address
   * (`serve --allow-private-outbound`): off, a name that resolves (or is rebound) to one is refused.
   */
  readonly allowPrivate: boolean
}

/** At most this many hosts per app. */
export const maxOutboundHosts = 32

const hostPattern = /^(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*$/

/**
 * The host a registration names, or why it names none: `example.com`, `example.com:443`,
 * `10.0.0.7:6333`, `[2001:db8::1]:443`. Wildcards and schemes are not hosts.
 */
export const parseOutboundHost = (text: string): OutboundHost | string => {
  const match = /^(\[[^\]]+\]|[^:[\]]+)(?::(\d{1,5}))?$/.exec(text.trim().toLowerCase())
  const shape = `"${text}" is not a host or host:port (such as api.example.com:443)`
  if (match === null) return shape
  const bracketed = match[1]!.startsWith("[")
  const host = bracketed ? match[1]!.slice(1, -1) : match[1]!
  const port = match[2] === undefined ? undefined : Number(match[2])
  if (port !== undefined && (port < 1 || port > 65535)) return `"${text}": the port is not 1 to 65535`
  if (bracketed ? isIP(host) !== 6 : isIP(host) !== 4 && (host.length > 253 || !hostPattern.test(host))) return shape
  return { host: bracketed ? canonicalIpv6(host) : host, port }
}

/**
 * An IPv6 literal as a URL's host writes it (RFC 5952: `::ffff:127.0.0.1` is `::ffff:7f00:1`), so
 * that a registration and a request name one address alike however each spells it.
 */
const canonicalIpv6 = (host: string): string => new URL(`http://[${host}]/`).hostname.slice(1, -1)

export const outboundHostText = ({ host, port }: OutboundHost): string => {
  const shown = isIP(host) === 6 ? `[${host}]` : host
  return port === undefined ? shown : `${shown}:${port}`
}

/** The longest CONNECT request taken, and how long the app has to send it and the host to answer. */
const maxHeadBytes = 8 * 1024
const headTimeoutMs = 10_000
const connectTimeoutMs = 10_000
/** Tunnels one app's process may hold open at once (each counted once, by its connection from the app). */
export const maxTunnels = 64

/**
 * The only way out of an app's network namespace: a forward proxy on a unix socket that only the
 * app's process may open (a file socket crosses network namespaces; its owner is the app's user and
 * its mode 0600). The app asks for a tunnel as an HTTP proxy is asked (`CONNECT host:port`); the
 * proxy opens it only to a host the app's registration named, resolves the name itself and connects
 * to the address it checked (a public one, unless the operator allows private ones), so neither a
 * name nor a rebinding answer leads the app to the platform's own ports or the local network.
 * Whatever it refuses it says to the app (a 403 with the reason) and writes to the app's log.
 *
 * One per process of an app that names hosts, opened before the process starts and closed when it
 * exits. The app side is `outbound` in the SDK (src/app-runtime/Outbound.ts).
 */
export class OutboundProxy {
  readonly path: string
  private readonly dir: string
  private readonly server: Server
  /** The app's connections, each a tunnel or a request for one; the host's side closes with its own. */
  private readonly tunnels = new Set<Socket>()

  constructor(
    private readonly rules: OutboundRules,
    user: AppUser | undefined,
    private readonly note: (line: string) => void
  ) {
    this.dir = mkdtempSync(join(tmpdir(), "cornserve-outbound-"))
    // Others may pass through the directory to the socket, not list it; the socket is the app's alone.
    chmodSync(this.dir, 0o711)
    this.path = join(this.dir, "proxy.sock")
    // Half-open both ways: an app that ends its side (a request sent) still reads the answer.
    this.server = createServer({ allowHalfOpen: true }, (socket) => this.accept(socket))
    this.server.on("error", (error) => this.note(`outbound proxy failed: ${error.message}`))
    // Binding a unix socket happens within listen(): the file exists when it returns, and its
    // owner and mode are set before the app's process (started after this) can try to open it.
    this.server.listen(this.path)
    chmodSync(this.path, 0o600)
    if (user !== undefined) chownSync(this.path, user.uid, user.gid)
  }

  close(): void {
    this.server.close()
    for (const tunnel of this.tunnels) tunnel.destroy()
    rmSync(this.dir, { recursive: true, force: true })
  }

  private accept(socket: Socket) {
    if (this.tunnels.size >= maxTunnels) {
      refuse(socket, 429, `the app holds ${maxTunnels} outbound connections already`)
      return
    }
    this.tunnels.add(socket)
    socket.once("close", () => this.tunnels.delete(socket))
    socket.on("error", () => socket.destroy())
    socket.setTimeout(headTimeoutMs, () => refuse(socket, 408, "no CONNECT request in time"))
    let head = Buffer.alloc(0)
    const onData = (chunk: Buffer) => {
      head = Buffer.concat([head, chunk])
      const end = head.indexOf("\r\n\r\n")
      if (end === -1) {
        if (head.length > maxHeadBytes) refuse(socket, 431, `the request's head is over ${maxHeadBytes} bytes`)
        return
      }
      socket.off("data", onData)
      socket.pause()
      socket.setTimeout(0)
      void this.open(socket, head.subarray(0, end).toString("latin1"), head.subarray(end + 4))
    }
    socket.on("data", onData)
  }

  private async open(socket: Socket, head: string, early: Buffer) {
    const target = /^CONNECT (\S+) HTTP\/1\.[01]\r?(?:\n|$)/.exec(head)
    const parsed = target === null ? undefined : parseOutboundHost(target[1]!)
    if (parsed === undefined || typeof parsed === "string" || parsed.port === undefined) {
      refuse(socket, 400, "the proxy takes only CONNECT host:port")
      return
    }
    const wanted = outboundHostText(parsed)
    if (
      !this.rules.hosts.some((allowed) => allowed.host === parsed.host && (allowed.port ?? parsed.port) === parsed.port)
    ) {
      this.refuseLogged(socket, 403, `${wanted} is not among the hosts the app's registration allows`)
      return
    }
    let addresses: ReadonlyArray<{ readonly address: string }>
    try {
      addresses =
        isIP(parsed.host) === 0 ? await lookup(parsed.host, { all: true, verbatim: true }) : [{ address: parsed.host }]
    } catch (error) {
      this.refuseLogged(
        socket,
        502,
        `${parsed.host} did not resolve: ${(error as NodeJS.ErrnoException).code ?? error}`
      )
      return
    }
    const reasons = this.rules.allowPrivate ? [] : addresses.map(({ address }) => nonPublicReason(address))
    const address = addresses.find((_, index) => reasons[index] === undefined)?.address
    if (address === undefined) {
      const why = reasons.find((reason) => reason !== undefined) ?? "no address"
      this.refuseLogged(
        socket,
        403,
        `${wanted} resolves to no public address (${why}); serve --allow-private-outbound allows private ones`
      )
      return
    }
    // The app may have gone while the name resolved: its side's close, which ends the host's, has passed.
    if (socket.destroyed) return
    const upstream = connect({ host: address, port: parsed.port, timeout: connectTimeoutMs, allowHalfOpen: true })
    let established = false
    upstream.once("close", () => socket.destroy())
    socket.once("close", () => upstream.destroy())
    upstream.once("timeout", () => {
      if (!established) this.refuseLogged(socket, 504, `${wanted} did not answer within ${connectTimeoutMs} ms`)
      upstream.destroy()
    })
    upstream.once("error", (error: NodeJS.ErrnoException) => {
      if (!established) {
        this.refuseLogged(socket, 502, `${wanted} refused the connection: ${error.code ?? error.message}`)
      }
      upstream.destroy()
    })
    upstream.once("connect", () => {
      established = true
      upstream.setTimeout(0)
      socket.write("HTTP/1.1 200 Connection Established\r\n\r\n")
      if (early.length > 0) upstream.write(early)
      socket.pipe(upstream)
      upstream.pipe(socket)
      socket.resume()
    })
  }

  private refuseLogged(socket: Socket, status: number, reason: string) {
    this.note(`outbound connection refused: ${reason}`)
    refuse(socket, status, reason)
  }
}

const statusText: Record<number, string> = {
  400: "Bad Request",
  403: "Forbidden",
  408: "Request Timeout",
  429: "Too Many Requests",
  431: "Request Header Fields Too Large",
  502: "Bad Gateway",
  504: "Gateway Timeout"
}

/** Answers a tunnel request with `status` and the reason (one line, the body), and closes. */
const refuse = (socket: Socket, status: number, reason: string) => {
  if (socket.destroyed) return
  const body = `${reason.replace(/[\r\n]/g, " ")}\n`
  socket.end(
    `HTTP/1.1 ${status} ${statusText[status] ?? "Refused"}\r\ncontent-type: text/plain\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`
  )
}
