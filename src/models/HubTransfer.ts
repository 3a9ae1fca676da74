import { createHash } from "node:crypto"
import { createReadStream } from "node:fs"
import { mkdir, open, rename, rm, stat } from "node:fs/promises"
import { dirname } from "node:path"
import { HubAccessDenied, HubModelNotFound, HubRequestFailed, ModelChecksumMismatch } from "./ModelErrors.js"

/**
 * HTTP against a Hugging Face hub: its API and its `resolve/` file URLs, with the token sent to the
 * hub alone (never to the CDN it redirects large files to), answers mapped to tagged errors, and
 * files fetched into `.part` files that resume with `Range`, are checked against the digest the hub
 * lists, and are renamed into place only when whole.
 */

export interface HubClient {
  /** The model id, for error messages. */
  readonly id: string
  readonly endpoint: string
  readonly token: string | undefined
}

/**
 * What a file's bytes must hash to: LFS files (the ONNX graphs and their data) by their sha256, plain
 * git files (configs, tokenizers) by their git blob id, `sha1("blob <size>\0" + bytes)`.
 */
export interface Digest {
  readonly algorithm: "sha256" | "git-sha1"
  readonly value: string
}

export const digestKey = (digest: Digest | undefined, size: number | undefined): string =>
  digest === undefined ? `size:${size ?? "unknown"}` : `${digest.algorithm}:${digest.value}`

const maxRedirects = 10
/** A transfer that sends nothing for this long is broken off (and resumed). */
const idleTimeoutMs = 30_000
/** Tries per file; each after the first resumes where the last broke off. */
const attemptsPerFile = 3

const reasonOf = (error: unknown): string => {
  const cause = (error as { cause?: { code?: string; message?: string } }).cause
  if (cause?.code !== undefined) return `${cause.code}${cause.message === undefined ? "" : ` (${cause.message})`}`
  return error instanceof Error ? error.message : String(error)
}

/** A failure that another try may not have: the connection broke, timed out, or the hub had a bad moment. */
class Transient {
  constructor(readonly reason: string) {}
}

/** The error a non-2xx answer of the hub stands for. */
const failure = (client: HubClient, response: Response, what: string) => {
  const code = response.headers.get("x-error-code") ?? ""
  const serverMessage = response.headers.get("x-error-message") ?? ""
  const { id, endpoint } = client
  if (response.status === 401 || response.status === 403) {
    const detail = code === "GatedRepo" ? "the repository is gated" : serverMessage
    return new HubAccessDenied({ id, endpoint, status: response.status, tokenSent: client.token !== undefined, detail })
  }
  if (response.status === 404) {
    const detail =
      code === "RevisionNotFound"
        ? `${what}: no such revision`
        : code === "EntryNotFound"
          ? `${what}: no such file in the repository`
          : "no such repository"
    return new HubModelNotFound({ id, endpoint, detail })
  }
  return new HubRequestFailed({ id, endpoint, reason: `the hub answered ${response.status} to ${what}` })
}

interface Answer {
  readonly response: Response
  /** The headers of the first answer, before any redirect: the hub's own metadata (X-Linked-Etag) is there. */
  readonly hubHeaders: Headers
}

/**
 * GETs `url`, following redirects by hand so that the token goes to the hub's origin only. A
 * connection that cannot be made fails as Transient; the caller reads the status.
 */
const get = async (
  client: HubClient,
  url: string,
  headers: Record<string, string>,
  signal: AbortSignal
): Promise<Answer> => {
  const hubOrigin = new URL(client.endpoint).origin
  let target = new URL(url)
  let hubHeaders: Headers | undefined
  for (let hop = 0; hop <= maxRedirects; hop++) {
    const authorization =
      client.token !== undefined && target.origin === hubOrigin ? { authorization: `Bearer ${client.token}` } : {}
    let response: Response
    try {
      response = await fetch(target, { headers: { ...headers, ...authorization }, redirect: "manual", signal })
    } catch (error) {
      throw new Transient(reasonOf(error))
    }
    hubHeaders ??= response.headers
    const location = response.headers.get("location")
    if (response.status >= 300 && response.status < 400 && location !== null) {
      await response.body?.cancel()
      target = new URL(location, target)
      continue
    }
    return { response, hubHeaders }
  }
  throw new HubRequestFailed({
    id: client.id,
    endpoint: client.endpoint,
    reason: `more than ${maxRedirects} redirects`
  })
}

/** GETs a JSON document of the hub's API. */
export const getJson = async (client: HubClient, url: string, what: string): Promise<unknown> => {
  const signal = AbortSignal.timeout(60_000)
  try {
    const { response } = await get(client, url, { accept: "application/json" }, signal)
    if (!response.ok) throw failure(client, response, what)
    return await response.json()
  } catch (error) {
    if (error instanceof Transient || error instanceof SyntaxError || error instanceof DOMException) {
      const reason = error instanceof Transient ? error.reason : reasonOf(error)
      throw new HubRequestFailed({ id: client.id, endpoint: client.endpoint, reason: `${what}: ${reason}` })
    }
    throw error
  }
}

const sizeOf = (path: string) =>
  stat(path).then(
    (info) => info.size,
    () => 0
  )

const digestOf = async (path: string, algorithm: Digest["algorithm"]): Promise<string> => {
  const hash = createHash(algorithm === "sha256" ? "sha256" : "sha1")
  if (algorithm === "git-sha1") hash.update(`blob ${await sizeOf(path)}\0`)
  for await (const chunk of createReadStream(path)) hash.update(chunk as Buffer)
  return hash.digest("hex")
}

/** The digest the hub's file headers give, for a file the listing gave none for. */
const digestFromHeaders = (headers: Headers): Digest | undefined => {
  const linked = headers.get("x-linked-etag")?.replace(/^W\//, "").replaceAll('"', "")
  if (linked !== undefined && /^[0-9a-f]{64}$/.test(linked)) return { algorithm: "sha256", value: linked }
  const etag = headers.get("etag")?.replace(/^W\//, "").replaceAll('"', "")
  if (etag !== undefined && /^[0-9a-f]{40}$/.test(etag)) return { algorithm: "git-sha1", value: etag }
  return undefined
}

export interface FileTransfer {
  readonly url: string
  /** Where the file goes; its bytes gather in `<target>.part` until they are whole and checked. */
  readonly target: string
  /** The file's path in the repository, for messages. */
  readonly file: string
  readonly size: number | undefined
  readonly digest: Digest | undefined
  /** Bytes of this file on disk so far, as they arrive. */
  readonly onBytes: (bytes: number) => void
}

/** One GET of the rest of the file, appended to the part file. Answers the digest the headers name. */
const fetchRest = async (client: HubClient, transfer: FileTransfer, part: string): Promise<Digest | undefined> => {
  let offset = await sizeOf(part)
  if (transfer.size !== undefined && offset > transfer.size) {
    await rm(part, { force: true })
    offset = 0
  }
  // Open before the request: a body that breaks off discards what it buffered but was not yet read.
  const handle = await open(part, "a")
  let written = offset
  const controller = new AbortController()
  let idle: NodeJS.Timeout | undefined
  const stillAlive = () => {
    clearTimeout(idle)
    idle = setTimeout(() => controller.abort(new Error(`no data for ${idleTimeoutMs / 1000} s`)), idleTimeoutMs)
  }
  stillAlive()
  try {
    const { response, hubHeaders } = await get(
      client,
      transfer.url,
      offset > 0 ? { range: `bytes=${offset}-`, "accept-encoding": "identity" } : { "accept-encoding": "identity" },
      controller.signal
    )
    if (response.status === 416 && offset > 0 && offset === transfer.size) {
      await response.body?.cancel()
      return digestFromHeaders(hubHeaders)
    }
    if (response.status === 416 || response.status === 429 || response.status >= 500) {
      await response.body?.cancel()
      if (response.status === 416) {
        await handle.truncate(0)
        written = 0
      }
      throw new Transient(`the hub answered ${response.status} to ${transfer.file}`)
    }
    if (!response.ok) {
      await response.body?.cancel()
      throw failure(client, response, transfer.file)
    }
    // 200 to a range request: the server sends the whole file, so the part starts over.
    if (response.status !== 206 && offset > 0) {
      await handle.truncate(0)
      written = 0
    }
    transfer.onBytes(written)
    try {
      if (response.body !== null) {
        for await (const chunk of response.body) {
          stillAlive()
          await handle.write(chunk)
          written += chunk.byteLength
          transfer.onBytes(written)
        }
      }
    } catch (error) {
      throw new Transient(`the transfer of ${transfer.file} broke off: ${reasonOf(controller.signal.reason ?? error)}`)
    }
    if (transfer.size !== undefined && written < transfer.size) {
      throw new Transient(`the transfer of ${transfer.file} ended after ${written} of ${transfer.size} bytes`)
    }
    return digestFromHeaders(hubHeaders)
  } catch (error) {
    if (controller.signal.aborted && !(error instanceof Transient)) {
      throw new Transient(`the transfer of ${transfer.file} broke off: ${reasonOf(controller.signal.reason)}`)
    }
    throw error
  } finally {
    clearTimeout(idle)
    await handle.close()
    if (written === 0) await rm(part, { force: true })
  }
}

/**
 * Downloads one file into place, resuming a `.part` left by an earlier run. A transfer that breaks
 * off is resumed up to `attemptsPerFile` times; then it fails and the part stays for the next run.
 * A part that does not hash to the listed digest is removed: if it was resumed, the download starts
 * once more from nothing (the part may have come from another revision); otherwise it fails.
 * Answers the digest that was checked (undefined when the hub named none: only the size was).
 */
export const downloadFile = async (client: HubClient, transfer: FileTransfer): Promise<Digest | undefined> => {
  const part = `${transfer.target}.part`
  await mkdir(dirname(transfer.target), { recursive: true })
  let lastReason = ""
  let restartedAfterMismatch = false
  for (let attempt = 1; attempt <= attemptsPerFile; ) {
    const resumed = (await sizeOf(part)) > 0
    let headerDigest: Digest | undefined
    try {
      headerDigest = await fetchRest(client, transfer, part)
    } catch (error) {
      if (!(error instanceof Transient)) throw error
      lastReason = error.reason
      attempt++
      continue
    }
    const digest = transfer.digest ?? headerDigest
    if (digest !== undefined) {
      const actual = await digestOf(part, digest.algorithm)
      if (actual !== digest.value) {
        await rm(part, { force: true })
        if (resumed && !restartedAfterMismatch) {
          restartedAfterMismatch = true
          continue
        }
        throw new ModelChecksumMismatch({
          id: client.id,
          file: transfer.file,
          algorithm: digest.algorithm,
          expected: digest.value,
          actual
        })
      }
    }
    await rename(part, transfer.target)
    return digest
  }
  const kept = await sizeOf(part)
  throw new HubRequestFailed({
    id: client.id,
    endpoint: client.endpoint,
    reason:
      `${lastReason} (tried ${attemptsPerFile} times` +
      `${kept > 0 ? `; ${kept} bytes kept in ${part}, which the next run resumes from` : ""})`
  })
}
