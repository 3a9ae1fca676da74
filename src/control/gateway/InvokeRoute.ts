import { randomUUID } from "node:crypto"
import type { IncomingMessage, ServerResponse } from "node:http"
import { Either, ParseResult, Schema } from "effect"
import { responseTooLargeMessage, type SchemaIssue } from "../../app-runtime/driver/protocol.js"
import { ChatCompletion, ChatCompletionChunk } from "../../app-runtime/schemas/OpenAI.js"
import type { AppDriver } from "../app-manager/AppDriver.js"
import type { ReplyHandlers } from "../app-manager/ReplyHandlers.js"
import {
  AppFailed,
  AppOverloaded,
  QueueTimeout,
  BadRequest,
  RequestTimeout,
  ShuttingDown,
  UnsupportedMediaType
} from "../errors.js"
import { errorBody, errorHead, type GatewayError } from "./ErrorResponse.js"
import { remoteError } from "../RemoteError.js"
import { shortened } from "../../app-runtime/Shortened.js"
import { jsonDepthWithin, tooDeepMessage } from "./JsonBody.js"
import { notJsonContentType, type RequestBodyLimits, readRequestBody } from "./RequestBody.js"
import type { Metrics } from "../metrics/PlatformMetrics.js"
import { noSpan, startSpan, tracing } from "../../tracing/Tracing.js"
import { RequestScope } from "../RequestScope.js"

export const invokePrefix = "/app/invoke/"
/** `POST /app/:id/v1/chat/completions`: the OpenAI surface of apps that take chat requests. */
export const chatCompletionsPattern = /^\/app\/([^/]+)\/v1\/chat\/completions$/

/**
 * How a request's reply is written: the native JSON/NDJSON, or OpenAI's chat completions. `chunk`
 * says, as `write()` does, whether the chunk left at once (false: it waits for the response's `drain`).
 */
interface ReplyFormat {
  value(response: ServerResponse, json: string): void
  streamStart(response: ServerResponse, requestId: string): void
  chunk(response: ServerResponse, json: string): boolean
  end(response: ServerResponse): void
  streamError(response: ServerResponse, error: GatewayError): void
}

const writeJson = (response: ServerResponse, json: string) =>
  response.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(json) }).end(json)

const nativeFormat: ReplyFormat = {
  value: writeJson,
  streamStart: (response, requestId) => {
    response.writeHead(200, { "content-type": "application/x-ndjson", "x-request-id": requestId })
    response.flushHeaders()
  },
  chunk: (response, json) => response.write(`${json}\n`),
  end: (response) => response.end(),
  streamError: (response, error) => {
    errorCodes.set(response, error._tag)
    response.end(`${JSON.stringify(errorBody(error))}\n`)
  }
}

/** Chunks streamed as Server-Sent Events, ending with `data: [DONE]`. */
const chatStreamFormat: ReplyFormat = {
  value: writeJson,
  streamStart: (response, requestId) => {
    response.writeHead(200, {
      "content-type": "text/event-stream",
      "cache-control": "no-cache",
      "x-request-id": requestId
    })
    response.flushHeaders()
  },
  chunk: (response, json) => response.write(`data: ${json}\n\n`),
  end: (response) => response.end("data: [DONE]\n\n"),
  streamError: (response, error) => {
    errorCodes.set(response, error._tag)
    response.end(`data: ${JSON.stringify(errorBody(error))}\n\n`)
  }
}

const decodeChunk = Schema.decodeUnknownEither(Schema.parseJson(ChatCompletionChunk))
const encodeCompletion = Schema.encodeSync(Schema.parseJson(ChatCompletion))

/**
 * Chunks gathered into one `chat.completion` object, for a request that did not ask to stream. A
 * chunk that is not a chat-completion chunk fails the request: the app broke the chat contract.
 */
const chatCompletionFormat = (appId: string, maxResponseBytes: number): ReplyFormat => {
  const chunks: Array<ChatCompletionChunk> = []
  let gatheredChars = 0
  let failure: AppFailed | undefined
  return {
    value: writeJson,
    streamStart: () => undefined,
    chunk: (_, json) => {
      if (failure !== undefined) return true
      // A completion is one answer: it is bounded like one, however many chunks it arrives in.
      gatheredChars += json.length
      if (gatheredChars > maxResponseBytes) {
        failure = new AppFailed({ appId, message: responseTooLargeMessage(maxResponseBytes) })
        chunks.length = 0
        return true
      }
      const chunk = decodeChunk(json)
      if (Either.isRight(chunk)) chunks.push(chunk.right)
      else {
        const problem = shortened(ParseResult.TreeFormatter.formatErrorSync(chunk.left))
        failure = new AppFailed({
          appId,
          message: `the app streamed something other than chat-completion chunks: ${problem}`
        })
      }
      return true
    },
    end: (response) => {
      if (failure !== undefined) return sendError(response, failure)
      const first = chunks[0]
      const choices = chunks.flatMap((chunk) => chunk.choices)
      const usage = chunks.map((chunk) => chunk.usage).findLast((value) => value != null)
      const completion: ChatCompletion = {
        id: first?.id ?? "chatcmpl-cornserve",
        object: "chat.completion",
        created: first?.created ?? Math.floor(Date.now() / 1000),
        model: first?.model ?? "",
        choices: [
          {
            index: 0,
            message: { role: "assistant", content: choices.map((choice) => choice.delta.content ?? "").join("") },
            finish_reason:
              choices.map((choice) => choice.finish_reason).findLast((reason) => reason !== null) ?? "stop",
            logprobs: null
          }
        ],
        ...(usage === undefined ? {} : { usage })
      }
      writeJson(response, encodeCompletion(completion))
    },
    streamError: (response, error) => sendError(response, error)
  }
}

/**
 * Whether a chat request body asks to stream (false when it is not JSON: the app will say so), and
 * the body the app gets: a request for one completion asks the stream behind it for usage, so that
 * the answer carries usage as OpenAI's does.
 */
const chatRequest = (body: string): { readonly stream: boolean; readonly body: string } => {
  let value: unknown
  try {
    value = JSON.parse(body)
  } catch {
    return { stream: false, body }
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) return { stream: false, body }
  const fields = value as { readonly stream?: unknown; readonly stream_options?: unknown }
  if (fields.stream === true) return { stream: true, body }
  if (fields.stream_options != null) return { stream: false, body }
  return { stream: false, body: JSON.stringify({ ...fields, stream_options: { include_usage: true } }) }
}

const invokeFailure = (
  appId: string,
  code: Parameters<ReplyHandlers["onFailed"]>[0],
  message: string,
  issues?: ReadonlyArray<SchemaIssue>
): GatewayError => remoteError({ code, message, ...(issues === undefined ? {} : { issues }) }, { _tag: "App", appId })

/** The error each failed request was answered with, for the metrics. */
const errorCodes = new WeakMap<ServerResponse, string>()

const sendError = (response: ServerResponse, error: GatewayError) => {
  errorCodes.set(response, error._tag)
  const { status, headers } = errorHead(error)
  const body = JSON.stringify(errorBody(error))
  response
    .writeHead(status, { ...headers, "content-type": "application/json", "content-length": Buffer.byteLength(body) })
    .end(body)
}

/** A percent-encoded path segment, decoded; `undefined` when its encoding is malformed. */
const decodePathSegment = (segment: string): string | undefined => {
  try {
    return decodeURIComponent(segment)
  } catch {
    return undefined
  }
}

export interface InvokeRouteOptions {
  readonly lookup: (appId: string) => AppDriver | GatewayError
  readonly draining: () => boolean
  readonly bodyLimits: RequestBodyLimits
  readonly maxJsonDepth: number
  readonly requestTimeoutMs: number
  readonly maxResponseBytes: number
  readonly metrics: Metrics
}

/**
 * `POST /app/invoke/:id`, the route every app request takes, written against node:http directly:
 * body in, app driver, JSON or NDJSON out. Errors are the same tagged errors, mapped to statuses in
 * the same place as every other route's.
 */
export const makeInvokeRoute =
  (options: InvokeRouteOptions) =>
  (request: IncomingMessage, response: ServerResponse, encodedAppId: string, api: "native" | "chat") => {
    const arrived = performance.now()
    let appLabel = ""
    // The request's trace begins here, or goes on from the client's `traceparent`.
    // With tracing off, no span options are built: this is every request's path.
    const span = !tracing()
      ? noSpan
      : startSpan(api === "chat" ? "POST /app/{id}/v1/chat/completions" : "POST /app/invoke/{id}", {
          parent: typeof request.headers.traceparent === "string" ? request.headers.traceparent : undefined,
          root: true,
          kind: "server",
          startTime: arrived,
          attributes: {
            "http.request.method": "POST",
            "http.route": api === "chat" ? "/app/{id}/v1/chat/completions" : "/app/invoke/{id}"
          }
        })
    // What the request holds until its response closes: its place in the app's admission, its
    // timeout, its call into the app.
    const scope = new RequestScope()
    response.once("close", () => {
      const status = response.writableFinished ? response.statusCode : 499
      const code = errorCodes.get(response)
      options.metrics.finished(appLabel, status, (performance.now() - arrived) / 1000, code)
      span.attribute("http.response.status_code", status)
      if (appLabel !== "") span.attribute("cornserve.app", appLabel)
      span.end(status >= 500 ? { _tag: code ?? "InternalError", message: `answered ${status}` } : undefined)
      scope.close()
    })
    if (options.draining()) return sendError(response, new ShuttingDown())
    const appId = decodePathSegment(encodedAppId)
    if (appId === undefined) {
      request.resume()
      return sendError(response, new BadRequest({ message: "the app id in the path is not valid percent-encoding" }))
    }
    const driver = options.lookup(appId)
    if (!("invoke" in driver)) {
      request.resume()
      return sendError(response, driver)
    }
    appLabel = appId
    // Refused before admission and before the body is read: a cross-site form never reaches the app.
    const notJson = notJsonContentType(request.headers["content-type"])
    if (notJson !== undefined) {
      request.resume()
      return sendError(response, new UnsupportedMediaType({ message: notJson }))
    }
    const run = () =>
      readRequestBody(request, options.bodyLimits, (body) => {
        if (typeof body !== "string") return sendError(response, body)
        if (response.destroyed) return
        if (jsonDepthWithin(body, options.maxJsonDepth) === undefined) {
          return sendError(response, new BadRequest({ message: tooDeepMessage(options.maxJsonDepth) }))
        }
        const chat = api === "chat" ? chatRequest(body) : undefined
        const format =
          chat === undefined
            ? nativeFormat
            : chat.stream
              ? chatStreamFormat
              : chatCompletionFormat(appId, options.maxResponseBytes)
        const requestId = randomUUID()
        let streaming = false
        /** Characters of lines written while the response's buffer is full: the app hears of them on `drain`. */
        let awaitingDrain = 0
        const onDrain = () => {
          const chars = awaitingDrain
          awaitingDrain = 0
          driver.delivered(rid, chars)
        }
        // The request's time covers its stream: past it, an answer not yet begun is a 504 and a stream
        // ends with an error line; the app is told to cancel (its task calls in flight with it).
        const timeoutMs = driver.timeoutMs ?? options.requestTimeoutMs
        const settle = scope.timeout(timeoutMs, () => {
          driver.cancel(rid)
          void driver.ensureResponsive(1_000)
          const timedOut = new RequestTimeout({ timeoutMs, streaming })
          if (streaming) format.streamError(response, timedOut)
          else sendError(response, timedOut)
        })
        span.attribute("cornserve.request_id", requestId)
        const rid = driver.invoke(
          requestId,
          chat?.body ?? body,
          {
            onValue: (json) => {
              settle()
              format.value(response, json)
            },
            onStreamStart: () => {
              streaming = true
              format.streamStart(response, requestId)
            },
            onChunk: (json) => {
              if (format.chunk(response, json)) return driver.delivered(rid, json.length)
              if (awaitingDrain === 0) response.once("drain", onDrain)
              awaitingDrain += json.length
            },
            onEnd: () => {
              settle()
              format.end(response)
            },
            onFailed: (code, message, issues) => {
              const error = invokeFailure(appId, code, message, issues)
              settle()
              if (!streaming) return sendError(response, error)
              format.streamError(response, error)
            }
          },
          span
        )
        scope.defer(() => {
          if (!response.writableFinished) driver.cancel(rid)
        })
      })

    if (driver.admission.unlimited) return run()
    // Admitted, queued or refused before any of the request's work starts (its body is not yet read).
    const leaveQueue = driver.admission.enter((outcome) => {
      switch (outcome._tag) {
        case "Overloaded": {
          request.resume()
          const { maxConcurrency, maxQueue } = driver.admission.limits
          return sendError(response, new AppOverloaded({ appId, maxConcurrency, maxQueue }))
        }
        case "TimedOut":
          request.resume()
          return sendError(response, new QueueTimeout({ appId, waitedMs: outcome.waitedMs }))
        case "Admitted":
          if (response.destroyed) return outcome.release()
          scope.defer(outcome.release)
          return run()
      }
    })
    if (leaveQueue !== undefined) scope.defer(leaveQueue)
  }
