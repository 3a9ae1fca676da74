import { lookup as dnsLookup, type LookupAddress } from "node:dns"
import { realpath, readFile, stat } from "node:fs/promises"
import * as Http from "node:http"
import * as Https from "node:https"
import { isIP, type LookupFunction } from "node:net"
import { sep } from "node:path"
import { fileURLToPath } from "node:url"
import { readDataUrl } from "./DataUrl.js"
import { MediaError, MediaTooLarge } from "./errors.js"
import { nonPublicReason } from "./PublicAddress.js"

export interface MediaSourceOptions {
  /** Files may be read only below this directory; no file URL is accepted without one. */
  readonly allowedRoot: string | undefined
  /** Allow http(s) URLs whose host resolves to a loopback, private or link-local address. */
  readonly allowPrivateHosts: boolean
  readonly maxBytes: number
  readonly timeoutMs: number
}

/** How long an http(s) media fetch may take. */
const fetchTimeoutMs = 10_000

/** The media source options of an executor, from its flags. */
export const mediaSourceOptionsOf = (config: {
  readonly mediaRoot?: string | undefined
  readonly allowPrivateHosts: boolean
  readonly maxMediaBytes: number
}): MediaSourceOptions => ({
  allowedRoot: config.mediaRoot,
  allowPrivateHosts: config.allowPrivateHosts,
  maxBytes: config.maxMediaBytes,
  timeoutMs: fetchTimeoutMs
})

export interface Media {
  readonly bytes: Buffer
  readonly mimeType: string | undefined
}

const readAllowedFile = async (url: string, options: MediaSourceOptions): Promise<Media> => {
  if (options.allowedRoot === undefined)
    throw new MediaError({ message: "file URLs are not accepted: no media root is configured" })
  const root = await realpath(options.allowedRoot)
  let path: string
  try {
    path = await realpath(fileURLToPath(url))
  } catch {
    throw new MediaError({ message: `cannot read ${url}: no such file` })
  }
  if (path !== root && !path.startsWith(root.endsWith(sep) ? root : `${root}${sep}`)) {
    throw new MediaError({ message: `${url} is outside the allowed media root` })
  }
  const info = await stat(path)
  if (!info.isFile()) throw new MediaError({ message: `${url} is not a file` })
  if (info.size > options.maxBytes)
    throw new MediaTooLarge({ message: `the media is larger than the limit of ${options.maxBytes} bytes` })
  return { bytes: await readFile(path), mimeType: undefined }
}

/** Resolves a host name and refuses private addresses, at connect time, so a redirect or DNS answer cannot slip past. */
const guardedLookup: LookupFunction = (hostname, options, callback) => {
  dnsLookup(hostname, { ...options, all: true }, (error, addresses: Array<LookupAddress>) => {
    if (error) return callback(error, "", 4)
    const refusal = addresses.map((entry) => nonPublicReason(entry.address)).find((reason) => reason !== undefined)
    if (refusal !== undefined) {
      return callback(new MediaError({ message: `refusing ${hostname}, a private address: ${refusal}` }), "", 4)
    }
    if (options.all) return (callback as unknown as (e: null, a: Array<LookupAddress>) => void)(null, addresses)
    callback(null, addresses[0]!.address, addresses[0]!.family)
  })
}

/**
 * Where a redirect leads, or why it is not followed: only to http(s). A server must not turn a
 * fetch into a read of the executor's files or a `data:` URL it chose.
 */
const redirectTarget = (from: URL, location: string): URL | MediaError => {
  let target: URL
  try {
    target = new URL(location, from)
  } catch {
    return new MediaError({ message: `${from.href} redirects to something that is not a URL` })
  }
  if (target.protocol === "http:" || target.protocol === "https:") return target
  return new MediaError({
    message: `${from.href} redirects to a ${target.protocol} URL; only redirects to http: and https: are followed`
  })
}

const fetchHttp = (url: URL, options: MediaSourceOptions, redirectsLeft: number): Promise<Media> =>
  new Promise((resolve, reject) => {
    const literal = url.hostname.replace(/^\[|\]$/g, "")
    const refusal = !options.allowPrivateHosts && isIP(literal) !== 0 ? nonPublicReason(literal) : undefined
    if (refusal !== undefined)
      return reject(new MediaError({ message: `refusing ${url.href}, a private address: ${refusal}` }))
    const client = url.protocol === "https:" ? Https : Http
    const request = client.get(
      url,
      {
        timeout: options.timeoutMs,
        headers: { "user-agent": "cornserve-eric" },
        ...(options.allowPrivateHosts ? {} : { lookup: guardedLookup })
      },
      (response) => {
        const status = response.statusCode ?? 0
        if (status >= 300 && status < 400 && response.headers.location !== undefined) {
          response.resume()
          if (redirectsLeft === 0) return reject(new MediaError({ message: `${url.href} redirects too many times` }))
          const target = redirectTarget(url, response.headers.location)
          if (target instanceof MediaError) return reject(target)
          return resolve(fetchHttp(target, options, redirectsLeft - 1))
        }
        if (status !== 200) {
          response.resume()
          return reject(new MediaError({ message: `fetching ${url.href} answered HTTP ${status}` }))
        }
        if (Number(response.headers["content-length"] ?? 0) > options.maxBytes) {
          response.destroy()
          return reject(
            new MediaTooLarge({ message: `the media is larger than the limit of ${options.maxBytes} bytes` })
          )
        }
        const chunks: Array<Buffer> = []
        let size = 0
        response.on("data", (chunk: Buffer) => {
          size += chunk.length
          if (size > options.maxBytes) {
            response.destroy()
            reject(new MediaTooLarge({ message: `the media is larger than the limit of ${options.maxBytes} bytes` }))
          } else chunks.push(chunk)
        })
        response.once("end", () =>
          resolve({ bytes: Buffer.concat(chunks), mimeType: response.headers["content-type"]?.split(";")[0] })
        )
        response.once("error", (error) =>
          reject(new MediaError({ message: `fetching ${url.href} failed: ${error.message}` }))
        )
      }
    )
    request.once("timeout", () =>
      request.destroy(new MediaError({ message: `fetching ${url.href} took longer than ${options.timeoutMs} ms` }))
    )
    request.once("error", (error) =>
      reject(
        error instanceof MediaError
          ? error
          : new MediaError({ message: `fetching ${url.href} failed: ${error.message}` })
      )
    )
  })

/** The bytes behind a media URL: a data: URL, a file under the allowed root, or http(s). */
export const readMedia = (url: string, options: MediaSourceOptions): Promise<Media> => {
  // A scheme in any case is the same scheme (RFC 3986), as `readDataUrl` and the cache's keys take it.
  const scheme = url.slice(0, 5).toLowerCase()
  if (scheme === "data:") return Promise.resolve().then(() => readDataUrl(url, options.maxBytes))
  if (scheme === "file:") return readAllowedFile(url, options)
  let parsed: URL
  try {
    parsed = new URL(url)
  } catch {
    return Promise.reject(new MediaError({ message: `"${url.slice(0, 80)}" is not a URL` }))
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
    return Promise.reject(
      new MediaError({ message: `${parsed.protocol} URLs are not accepted: use data:, file: or http(s):` })
    )
  }
  return fetchHttp(parsed, options, 3)
}
