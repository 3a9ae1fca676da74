/**
 * The console's calls to the gateway: same origin only, JSON bodies, the bearer each route takes,
 * and every answer read within a bound (a page must not grow without end on a hostile or broken
 * answer). A failure comes back as a `Refusal` with the gateway's own error code and message.
 */
import { bearerFor, type CredentialKind } from "./credentials"

export interface Refusal {
  /** The HTTP status; 0 when the gateway could not be reached or its answer could not be read. */
  readonly status: number
  readonly code: string
  readonly message: string
  /** Which secret the route wants, when it answered 401. */
  readonly needs?: CredentialKind
}

export type Outcome<A> = { readonly ok: true; readonly value: A } | { readonly ok: false; readonly refusal: Refusal }

/** What one JSON answer of a listing route may weigh. */
const maxJsonBytes = 16 * 1024 * 1024

export interface CallOptions {
  readonly method?: "GET" | "POST"
  readonly body?: unknown
  readonly auth?: CredentialKind | "none"
  readonly signal?: AbortSignal
}

const shortText = (text: string, chars = 500) => (text.length > chars ? `${text.slice(0, chars)}…` : text)

/** The gateway's error answer `{ error: { code, message } }`, or the text as it is. */
export const refusalOf = (status: number, text: string, needs?: CredentialKind): Refusal => {
  let code = `HTTP ${status}`
  let message = shortText(text.trim()) || `the gateway answered ${status}`
  try {
    const parsed: unknown = JSON.parse(text)
    const error = (parsed as { error?: { code?: unknown; message?: unknown } } | null)?.error
    if (typeof error?.code === "string") code = error.code
    if (typeof error?.message === "string") message = shortText(error.message)
  } catch {}
  return status === 401 && needs !== undefined ? { status, code, message, needs } : { status, code, message }
}

/** Sends a request; a network failure is a refusal of status 0. */
export const call = async (path: string, options: CallOptions = {}): Promise<Outcome<Response>> => {
  const auth = options.auth ?? "none"
  const bearer = bearerFor(auth)
  const headers: Record<string, string> = {}
  // Admin and invoke routes take JSON only: what a cross-site form cannot send.
  if (options.body !== undefined) headers["content-type"] = "application/json"
  if (bearer !== undefined) headers.authorization = `Bearer ${bearer}`
  try {
    const response = await fetch(path, {
      method: options.method ?? (options.body === undefined ? "GET" : "POST"),
      headers,
      ...(options.body === undefined ? {} : { body: JSON.stringify(options.body) }),
      ...(options.signal === undefined ? {} : { signal: options.signal }),
      credentials: "omit",
      cache: "no-store"
    })
    if (response.ok) return { ok: true, value: response }
    const text = await readText(response, 64 * 1024).catch(() => "")
    return { ok: false, refusal: refusalOf(response.status, text, auth === "none" ? undefined : auth) }
  } catch (error) {
    return {
      ok: false,
      refusal: { status: 0, code: "Unreachable", message: `the gateway could not be reached: ${String(error)}` }
    }
  }
}

/** A response's text, up to `maxBytes` (cut there). */
export const readText = async (response: Response, maxBytes: number): Promise<string> => {
  const reader = response.body?.getReader()
  if (reader === undefined) return ""
  const decoder = new TextDecoder()
  let text = ""
  let bytes = 0
  for (;;) {
    const { done, value } = await reader.read()
    if (done) return text + decoder.decode()
    bytes += value.byteLength
    if (bytes > maxBytes) {
      await reader.cancel()
      return text + decoder.decode(value.subarray(0, value.byteLength - (bytes - maxBytes)))
    }
    text += decoder.decode(value, { stream: true })
  }
}

/** A GET of a JSON route, read within the bound. */
export const getJson = async <A>(path: string, auth: CredentialKind | "none" = "none", signal?: AbortSignal) => {
  const sent = await call(path, { auth, ...(signal === undefined ? {} : { signal }) })
  if (!sent.ok) return sent
  return jsonOf<A>(sent.value)
}

export const jsonOf = async <A>(response: Response): Promise<Outcome<A>> => {
  const text = await readText(response, maxJsonBytes + 1)
  if (text.length > maxJsonBytes)
    return {
      ok: false,
      refusal: { status: 0, code: "TooLarge", message: "the answer is larger than the console reads" }
    }
  try {
    return { ok: true, value: JSON.parse(text) as A }
  } catch {
    return {
      ok: false,
      refusal: { status: 0, code: "Unreadable", message: `the answer is not JSON: ${shortText(text, 200)}` }
    }
  }
}

/**
 * A streamed answer's lines as they arrive (NDJSON, or Server-Sent Events' `field: value` lines),
 * until it ends, `maxBytes` have come, or a line grows past `maxLineChars` (then it throws).
 */
export async function* lines(response: Response, maxBytes: number, maxLineChars: number): AsyncGenerator<string> {
  const reader = response.body?.getReader()
  if (reader === undefined) return
  const decoder = new TextDecoder()
  let pending = ""
  let bytes = 0
  try {
    for (;;) {
      const { done, value } = await reader.read()
      if (done) break
      bytes += value.byteLength
      if (bytes > maxBytes) throw new Error(`the answer is larger than ${Math.round(maxBytes / 1024 / 1024)} MiB`)
      pending += decoder.decode(value, { stream: true })
      let newline = pending.indexOf("\n")
      while (newline >= 0) {
        yield pending.slice(0, newline).replace(/\r$/, "")
        pending = pending.slice(newline + 1)
        newline = pending.indexOf("\n")
      }
      if (pending.length > maxLineChars)
        throw new Error(`a line of the answer is longer than ${maxLineChars} characters`)
    }
    pending += decoder.decode()
    if (pending.length > 0) yield pending
  } finally {
    await reader.cancel().catch(() => undefined)
  }
}
