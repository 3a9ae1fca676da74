import type { ServerResponse } from "node:http"
import { errorBody, errorHead, type GatewayError } from "./ErrorResponse.js"

/**
 * How an app request's reply is written: the native JSON/NDJSON, or one of OpenAI's formats.
 * `chunk` says, as `write()` does, whether the chunk left at once (false: it waits for the
 * response's `drain`).
 */
export interface ReplyFormat {
  value(response: ServerResponse, json: string): void
  streamStart(response: ServerResponse, requestId: string): void
  chunk(response: ServerResponse, json: string): boolean
  end(response: ServerResponse): void
  streamError(response: ServerResponse, error: GatewayError): void
}

/** The error each failed request was answered with (its tag, or OpenAI's code), for the metrics. */
export const errorCodes = new WeakMap<ServerResponse, string>()

export const writeJson = (response: ServerResponse, json: string, status = 200) =>
  response
    .writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(json) })
    .end(json)

export const sendError = (response: ServerResponse, error: GatewayError) => {
  errorCodes.set(response, error._tag)
  const { status, headers } = errorHead(error)
  const body = JSON.stringify(errorBody(error))
  response
    .writeHead(status, { ...headers, "content-type": "application/json", "content-length": Buffer.byteLength(body) })
    .end(body)
}

/** Server-Sent Events: each chunk a `data:` line, the end `data: [DONE]`. */
export const eventStreamFormat = (mapChunk: (json: string) => string | undefined = (json) => json): ReplyFormat => ({
  value: writeJson,
  streamStart: (response, requestId) => {
    response.writeHead(200, {
      "content-type": "text/event-stream",
      "cache-control": "no-cache",
      "x-request-id": requestId
    })
    response.flushHeaders()
  },
  chunk: (response, json) => {
    const data = mapChunk(json)
    return data === undefined ? true : response.write(`data: ${data}\n\n`)
  },
  end: (response) => response.end("data: [DONE]\n\n"),
  streamError: (response, error) => {
    errorCodes.set(response, error._tag)
    response.end(`data: ${JSON.stringify(errorBody(error))}\n\n`)
  }
})
