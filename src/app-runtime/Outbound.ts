/**
 * The outbound connections of an app. An app's process has no network of its own: it reaches only
 * the hosts its registration allows (`cornserve app register --allow-host HOST[:PORT]`), through a
 * proxy the platform opens for it. `outbound.fetch` is `fetch` through that proxy (http and https,
 * TLS end to end with the host); `outbound.connect` opens a raw TCP stream (a database's protocol).
 * Anything else is refused with the reason, which the app's log shows too.
 */
import { Agent as HttpAgent, type ClientRequestArgs, type IncomingMessage, request as httpRequest } from "node:http"
import { Agent as HttpsAgent, type RequestOptions as HttpsRequestOptions, request as httpsRequest } from "node:https"
import { isIP, connect as netConnect, type Socket } from "node:net"
import { type Duplex, Readable } from "node:stream"
import { connect as tlsConnect } from "node:tls"
import * as Schema from "effect/Schema"

/** The proxy's socket, set by the platform for apps whose registration names hosts. */
const proxySocket = () => process.env.CORNSERVE_OUTBOUND_SOCKET

/**
 * An outbound connection was refused (a host the registration does not allow, one that does not
 * answer): tagged like the platform's other errors, and an `Error` an app catches with `instanceof`.
 */
export class OutboundError extends Schema.TaggedError<OutboundError>()("OutboundError", {
  message: Schema.String,
  /** The proxy's status: 403 not allowed, 502 unreachable, 504 no answer in time. */
  status: Schema.UndefinedOr(Schema.Number)
}) {}

const outboundError = (message: string, status: number | undefined) => new OutboundError({ message, status })

const maxProxyAnswerBytes = 16 * 1024

/** A TCP stream to `host:port` through the platform's proxy, open and ready for data. */
const tunnel = (host: string, port: number, signal?: AbortSignal): Promise<Socket> =>
  new Promise((resolve, reject) => {
    const path = proxySocket()
    if (path === undefined) {
      reject(
        outboundError(
          `the app has no network: ${host}:${port} can be reached only when its registration allows it (app register --allow-host ${host}:${port})`,
          undefined
        )
      )
      return
    }
    if (signal?.aborted) {
      reject(signal.reason)
      return
    }
    const socket = netConnect({ path })
    const onAbort = () => socket.destroy(signal?.reason instanceof Error ? signal.reason : new Error("aborted"))
    signal?.addEventListener("abort", onAbort, { once: true })
    let answer = Buffer.alloc(0)
    const settle = (error: Error | undefined) => {
      signal?.removeEventListener("abort", onAbort)
      socket.off("data", onData)
      socket.off("error", onError)
      socket.off("close", onClose)
      if (error !== undefined) {
        socket.destroy()
        reject(error)
      }
    }
    const onError = (error: Error) =>
      settle(
        error instanceof OutboundError ? error : outboundError(`the outbound proxy failed: ${error.message}`, undefined)
      )
    const onClose = () => settle(outboundError(`the outbound proxy closed before it answered`, undefined))
    const onData = (chunk: Buffer) => {
      answer = Buffer.concat([answer, chunk])
      const end = answer.indexOf("\r\n\r\n")
      if (end === -1) {
        if (answer.length > maxProxyAnswerBytes)
          settle(outboundError("the outbound proxy's answer is too long", undefined))
        return
      }
      const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(answer.toString("latin1", 0, end))?.[1] ?? 0)
      if (status !== 200) {
        const reason = answer
          .subarray(end + 4)
          .toString("utf8")
          .trim()
        settle(outboundError(`${host}:${port}: ${reason || `the outbound proxy answered ${status}`}`, status))
        return
      }
      settle(undefined)
      const rest = answer.subarray(end + 4)
      if (rest.length > 0) socket.unshift(rest)
      resolve(socket)
    }
    socket.on("data", onData)
    socket.on("error", onError)
    socket.on("close", onClose)
    socket.write(`CONNECT ${hostPort(host, port)} HTTP/1.1\r\nhost: ${hostPort(host, port)}\r\n\r\n`)
  })

const hostPort = (host: string, port: number) => (host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`)

/** Agents whose connections go through the proxy; TLS (for https) runs inside the tunnel, to the host itself. */
type Opened = (error: Error | null, stream: Duplex) => void

class TunnelHttpAgent extends HttpAgent {
  override createConnection(options: ClientRequestArgs, done?: Opened): undefined {
    tunnel(String(options.host), Number(options.port)).then(
      (socket) => done?.(null, socket),
      (error: Error) => done?.(error, undefined as unknown as Duplex)
    )
    return undefined
  }
}

class TunnelHttpsAgent extends HttpsAgent {
  override createConnection(options: HttpsRequestOptions, done?: Opened): undefined {
    const host = String(options.host)
    const failed = (error: Error) => done?.(error, undefined as unknown as Duplex)
    tunnel(host, Number(options.port)).then((socket) => {
      const secure = tlsConnect({
        socket,
        ...(isIP(host) !== 0 ? {} : { servername: options.servername ?? host }),
        ALPNProtocols: ["http/1.1"],
        ...(options.ca === undefined ? {} : { ca: options.ca })
      })
      secure.once("secureConnect", () => done?.(null, secure))
      secure.once("error", failed)
    }, failed)
    return undefined
  }
}

let agents: { readonly http: TunnelHttpAgent; readonly https: TunnelHttpsAgent } | undefined
const agentsOf = () => {
  agents ??= { http: new TunnelHttpAgent({ keepAlive: true }), https: new TunnelHttpsAgent({ keepAlive: true }) }
  return agents
}

/** What `outbound.fetch` takes: `fetch`'s options that a proxied request can honour. */
export interface OutboundRequestInit {
  readonly method?: string
  readonly headers?: Record<string, string> | ReadonlyArray<readonly [string, string]>
  readonly body?: string | Uint8Array | ArrayBuffer
  readonly signal?: AbortSignal
}

const bodyBytes = (body: OutboundRequestInit["body"]): Buffer | undefined =>
  body === undefined
    ? undefined
    : typeof body === "string"
      ? Buffer.from(body)
      : body instanceof ArrayBuffer
        ? Buffer.from(body)
        : Buffer.from(body.buffer, body.byteOffset, body.byteLength)

const nullBodyStatuses = new Set([101, 204, 205, 304])

/** `fetch` through the app's proxy: http and https URLs of allowed hosts; answers a standard `Response`. */
const proxiedFetch = (input: string | URL, init: OutboundRequestInit = {}): Promise<Response> =>
  new Promise((resolve, reject) => {
    const url = new URL(input)
    if (url.protocol !== "http:" && url.protocol !== "https:") {
      reject(new TypeError(`outbound.fetch takes http and https URLs, not ${url.protocol}`))
      return
    }
    const https = url.protocol === "https:"
    const body = bodyBytes(init.body)
    const headers: Record<string, string> = {}
    for (const [name, value] of Array.isArray(init.headers) ? init.headers : Object.entries(init.headers ?? {})) {
      headers[name.toLowerCase()] = value
    }
    if (body !== undefined) headers["content-length"] = String(body.length)
    const request = (https ? httpsRequest : httpRequest)(
      {
        protocol: url.protocol,
        host: url.hostname.replace(/^\[|\]$/g, ""),
        port: url.port === "" ? (https ? 443 : 80) : Number(url.port),
        path: `${url.pathname}${url.search}`,
        method: init.method ?? "GET",
        headers,
        agent: https ? agentsOf().https : agentsOf().http,
        ...(init.signal === undefined ? {} : { signal: init.signal })
      },
      (response: IncomingMessage) => {
        const answerHeaders = new Headers()
        for (const [name, value] of Object.entries(response.headers)) {
          for (const one of Array.isArray(value) ? value : value === undefined ? [] : [value]) {
            answerHeaders.append(name, one)
          }
        }
        const status = response.statusCode ?? 502
        const stream = nullBodyStatuses.has(status) ? null : (Readable.toWeb(response) as ReadableStream<Uint8Array>)
        if (stream === null) response.resume()
        resolve(new Response(stream, { status, statusText: response.statusMessage ?? "", headers: answerHeaders }))
      }
    )
    request.once("error", reject)
    request.end(body)
  })

/**
 * The app's way out to the hosts its registration allows. Both refuse with an `OutboundError`
 * naming the reason when the host is not allowed, does not resolve to an address the platform may
 * reach, or does not answer.
 */
export const outbound = {
  /** `fetch` (http and https) to an allowed host. */
  fetch: proxiedFetch,
  /** A raw TCP stream to an allowed `host:port` (for a protocol of its own, or `tls.connect({ socket })`). */
  connect: (host: string, port: number, options: { readonly signal?: AbortSignal } = {}): Promise<Socket> =>
    tunnel(host, port, options.signal)
} as const
