import { randomUUID } from "node:crypto"
import type { IncomingMessage, ServerResponse } from "node:http"
import type { SchemaIssue } from "../../app-runtime/driver/protocol.js"
import type { AppDriver, ReplyHandlers } from "../app-manager/AppDriver.js"
import {
  AppFailed,
  BadRequest,
  RequestSchemaMismatch,
  RequestTimeout,
  ShuttingDown,
  TaskInputRejected
} from "../errors.js"
import { errorBody, type GatewayError, statusOf } from "./ErrorResponse.js"
import { readRequestBody } from "./RequestBody.js"

export const invokePrefix = "/app/invoke/"

const invokeFailure = (
  appId: string,
  code: Parameters<ReplyHandlers["onFailed"]>[0],
  message: string,
  issues?: ReadonlyArray<SchemaIssue>
): GatewayError => {
  switch (code) {
    case "BadJson":
      return new BadRequest({ message })
    case "RequestSchemaMismatch":
      return new RequestSchemaMismatch({
        message,
        issues: (issues ?? []).map((issue) => ({ path: [...issue.path], message: issue.message }))
      })
    case "TaskInputRejected":
      return new TaskInputRejected({ message })
    case "AppError":
    case "ResponseSchemaMismatch":
    case "WorkerStopped":
      return new AppFailed({ appId, message })
  }
}

const sendError = (response: ServerResponse, error: GatewayError) => {
  const status = statusOf(error)
  const body = JSON.stringify(errorBody(error))
  const headers: Record<string, string | number> = {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(body)
  }
  if (status === 503) headers["retry-after"] = "1"
  if (status === 413) headers.connection = "close"
  response.writeHead(status, headers).end(body)
}

export interface InvokeRouteOptions {
  readonly lookup: (appId: string) => AppDriver | GatewayError
  readonly draining: () => boolean
  readonly maxBodyBytes: number
  readonly requestTimeoutMs: number
}

/**
 * `POST /app/invoke/:id`, the route every app request takes, written against node:http directly:
 * body in, app driver, JSON or NDJSON out. Errors are the same tagged errors, mapped to statuses in
 * the same place as every other route's.
 */
export const makeInvokeRoute = (options: InvokeRouteOptions) => (request: IncomingMessage, response: ServerResponse) => {
  const path = request.url!.split("?", 1)[0]!
  const appId = decodeURIComponent(path.slice(invokePrefix.length))
  if (options.draining()) return sendError(response, new ShuttingDown())
  const driver = options.lookup(appId)
  if (!("invoke" in driver)) {
    request.resume()
    return sendError(response, driver)
  }
  readRequestBody(request, options.maxBodyBytes, (body) => {
    if (typeof body !== "string") return sendError(response, body)
    if (response.destroyed) return
    const requestId = randomUUID()
    let settled = false
    let streaming = false
    const timer = setTimeout(() => {
      if (settled) return
      settled = true
      driver.cancel(rid)
      void driver.ensureResponsive(1_000)
      sendError(response, new RequestTimeout({ timeoutMs: options.requestTimeoutMs }))
    }, options.requestTimeoutMs)
    const settle = () => {
      settled = true
      clearTimeout(timer)
    }
    const rid = driver.invoke(requestId, body, {
      onValue: (json) => {
        settle()
        response
          .writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(json) })
          .end(json)
      },
      onStreamStart: () => {
        settle()
        streaming = true
        response.writeHead(200, { "content-type": "application/x-ndjson", "x-request-id": requestId })
        response.flushHeaders()
      },
      onChunk: (json) => {
        response.write(`${json}\n`)
      },
      onEnd: () => {
        response.end()
      },
      onFailed: (code, message, issues) => {
        const error = invokeFailure(appId, code, message, issues)
        if (!streaming) {
          settle()
          return sendError(response, error)
        }
        response.end(`${JSON.stringify(errorBody(error))}\n`)
      }
    })
    response.once("close", () => {
      clearTimeout(timer)
      if (!response.writableFinished) driver.cancel(rid)
    })
  })
}
