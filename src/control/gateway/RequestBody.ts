import type { IncomingMessage } from "node:http"
import { shortened } from "../../app-runtime/Shortened.js"
import { BadRequest, PayloadTooLarge, RequestBodyTimeout } from "../errors.js"

export interface RequestBodyLimits {
  readonly limitBytes: number
  /** How long the body may send nothing before the request is refused. */
  readonly idleTimeoutMs: number
}

export type RequestBodyResult = string | PayloadTooLarge | RequestBodyTimeout | BadRequest

/** Reads a request body of at most `limitBytes` as UTF-8 text (see `readRequestBytes`). */
export const readRequestBody = (
  request: IncomingMessage,
  limits: RequestBodyLimits,
  done: (result: RequestBodyResult) => void
): void =>
  readRequestBytes(request, limits, (result) => done(Buffer.isBuffer(result) ? result.toString("utf8") : result))

/**
 * Reads a request body of at most `limitBytes`. A body declared or found larger is refused at
 * once; the rest of it is drained, not read, so that the 413 still reaches the client. A body that
 * stalls for `idleTimeoutMs` is refused too, so that a slow client does not hold the connection.
 */
export const readRequestBytes = (
  request: IncomingMessage,
  limits: RequestBodyLimits,
  done: (result: Buffer | PayloadTooLarge | RequestBodyTimeout | BadRequest) => void
): void => {
  const { limitBytes, idleTimeoutMs } = limits
  if (Number(request.headers["content-length"] ?? 0) > limitBytes) {
    request.resume()
    done(new PayloadTooLarge({ limitBytes }))
    return
  }
  const chunks: Array<Buffer> = []
  let size = 0
  let finished = false
  const idle = setTimeout(() => finish(new RequestBodyTimeout({ idleTimeoutMs })), idleTimeoutMs)
  const finish = (result: Buffer | PayloadTooLarge | RequestBodyTimeout | BadRequest) => {
    if (finished) return
    finished = true
    clearTimeout(idle)
    request.off("data", onData)
    done(result)
  }
  const onData = (chunk: Buffer) => {
    idle.refresh()
    size += chunk.length
    if (size <= limitBytes) chunks.push(chunk)
    else {
      request.resume()
      finish(new PayloadTooLarge({ limitBytes }))
    }
  }
  request.on("data", onData)
  request.once("end", () => finish(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks)))
  // A client that goes away mid-body gets no answer; its timer must not outlive it.
  request.once("close", () => clearTimeout(idle))
  request.once("error", (error) => finish(new BadRequest({ message: `reading the body failed: ${error.message}` })))
}

/**
 * Why a request's `content-type` is not JSON, or `undefined` when it is (`application/json`, with
 * any parameters but a charset other than UTF-8). An app's routes take JSON only: a browser sends
 * `text/plain` and form bodies cross-site without asking the server first, so a page on any site
 * could otherwise drive an app with its visitors' network position; `application/json` makes the
 * browser ask (CORS preflight), which the gateway never grants.
 */
export const notJsonContentType = (contentType: string | undefined): string | undefined => {
  const [type = "", ...parameters] = (contentType ?? "").split(";")
  const essence = type.trim().toLowerCase()
  if (essence !== "application/json") {
    return essence === ""
      ? "the request has no content-type; send its JSON body with content-type: application/json"
      : `the request's content-type is ${shortened(essence, 100)}; send its JSON body with content-type: application/json`
  }
  const charset = parameters
    .map((parameter) => parameter.trim().toLowerCase())
    .find((parameter) => parameter.startsWith("charset="))
  const encoding = charset?.slice("charset=".length).replace(/^"|"$/g, "")
  if (encoding !== undefined && encoding !== "utf-8" && encoding !== "utf8") {
    return `the request's charset is ${shortened(encoding, 100)}; send its JSON body in UTF-8 with content-type: application/json`
  }
  return undefined
}

/**
 * Why a multipart upload may not be taken, or `undefined` when it may. A browser posts a form to
 * any site without asking (no CORS preflight), so a page elsewhere could drive an app with its
 * visitors' network position; such a post carries an `Origin` (or `Sec-Fetch-Site: cross-site`),
 * which OpenAI's clients and curl do not send. An upload from another origin than the gateway's is
 * refused before its body is read.
 */
export const crossSiteUpload = (headers: IncomingMessage["headers"]): string | undefined => {
  const site = headers["sec-fetch-site"]
  if (site === "cross-site" || site === "same-site") return "a form posted from another site is not taken"
  const origin = headers.origin
  if (origin === undefined) return undefined
  let host: string
  try {
    host = new URL(origin).host
  } catch {
    return "a form posted from an opaque origin is not taken"
  }
  return host === headers.host ? undefined : "a form posted from another origin is not taken"
}
