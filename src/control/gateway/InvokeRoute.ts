import { randomUUID } from "node:crypto"
import type { IncomingMessage, ServerResponse } from "node:http"
import type { SchemaIssue } from "../../app-runtime/driver/protocol.js"
import { SpeechFormat } from "../../app-runtime/schemas/Speech.js"
import { TranscriptionFormat } from "../../app-runtime/schemas/Transcriptions.js"
import type { AppDriver } from "../app-manager/AppDriver.js"
import type { ReplyHandlers } from "../app-manager/ReplyHandlers.js"
import {
  AppOverloaded,
  Forbidden,
  QueueTimeout,
  BadRequest,
  RequestTimeout,
  ShuttingDown,
  UnsupportedMediaType
} from "../errors.js"
import { errorBody, type GatewayError } from "./ErrorResponse.js"
import { modelsAnswer, prepareOpenAiRequest, sendRefusal } from "./OpenAiApi.js"
import { type OpenAiRoute, openAiPath } from "./OpenAiRoutes.js"
import { openAiFormat } from "./OpenAiReplies.js"
import { errorCodes, type ReplyFormat, sendError, writeJson } from "./ReplyFormat.js"
import { remoteError } from "../RemoteError.js"
import { jsonDepthWithin, tooDeepMessage } from "./JsonBody.js"
import { multipartBoundary, parseMultipart } from "./Multipart.js"
import {
  crossSiteUpload,
  notJsonContentType,
  type RequestBodyLimits,
  type RequestBodyResult,
  readRequestBody,
  readRequestBytes
} from "./RequestBody.js"
import { imagesFormat } from "./ImagesApi.js"
import { speechFormat } from "./SpeechApi.js"
import { transcriptionFormat, transcriptionOfForm } from "./TranscriptionsApi.js"
import type { Metrics } from "../metrics/PlatformMetrics.js"
import { noSpan, startSpan, tracing } from "../../tracing/Tracing.js"
import { RequestScope } from "../RequestScope.js"

export const invokePrefix = "/app/invoke/"
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

/** The route's template, as the metrics label it. */
const routeName = (api: "native" | OpenAiRoute): string => (api === "native" ? "/app/invoke/{id}" : openAiPath(api))

/** The `response_format` and `stream_format` a speech request asks for (mp3 and audio when it names none or none known). */
const speechFormatOf = (appId: string, asked: Readonly<Record<string, unknown>>): ReplyFormat =>
  speechFormat(
    appId,
    typeof asked.response_format === "string" &&
      (SpeechFormat.literals as ReadonlyArray<string>).includes(asked.response_format)
      ? (asked.response_format as SpeechFormat)
      : "mp3",
    asked.stream_format === "sse" ? "sse" : "audio"
  )

/** The `response_format` a transcription request asks for (json when it names none or none known). */
const responseFormatOf = (asked: Readonly<Record<string, unknown>>): TranscriptionFormat =>
  typeof asked.response_format === "string" &&
  (TranscriptionFormat.literals as ReadonlyArray<string>).includes(asked.response_format)
    ? (asked.response_format as TranscriptionFormat)
    : "json"

const invokeFailure = (
  appId: string,
  code: Parameters<ReplyHandlers["onFailed"]>[0],
  message: string,
  issues?: ReadonlyArray<SchemaIssue>
): GatewayError => remoteError({ code, message, ...(issues === undefined ? {} : { issues }) }, { _tag: "App", appId })

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
  /** The models an app's LLM tasks serve: its OpenAI routes refuse a request for another. */
  readonly modelsOf: (appId: string) => ReadonlyArray<string>
  /** When the app was registered, in seconds since the epoch (its models' `created`). */
  readonly registeredAt: (appId: string) => number
}

/** `GET /app/:id/v1/models` (and `/v1/models/:model`): the models the app's LLM tasks serve. */
export const makeModelsRoute =
  (options: InvokeRouteOptions) => (response: ServerResponse, encodedAppId: string, model: string | undefined) => {
    const appId = decodePathSegment(encodedAppId)
    if (appId === undefined)
      return sendError(response, new BadRequest({ message: "the app id in the path is not valid percent-encoding" }))
    const driver = options.lookup(appId)
    if (!("invoke" in driver)) return sendError(response, driver)
    const answer = modelsAnswer(options.modelsOf(appId), options.registeredAt(appId), model)
    if ("refusal" in answer) return sendRefusal(response, answer.refusal)
    writeJson(response, answer.json)
  }

/**
 * `POST /app/invoke/:id`, the route every app request takes, and OpenAI's routes on an app (see
 * OpenAiApi.ts), written against node:http directly: body in, app driver, JSON or NDJSON (or
 * OpenAI's formats) out. Errors are the same tagged errors, mapped to statuses in the same place as
 * every other route's.
 */
export const makeInvokeRoute =
  (options: InvokeRouteOptions) =>
  (request: IncomingMessage, response: ServerResponse, encodedAppId: string, api: "native" | OpenAiRoute) => {
    const arrived = performance.now()
    let appLabel = ""
    // The request's trace begins here, or goes on from the client's `traceparent`.
    // With tracing off, no span options are built: this is every request's path.
    const span = !tracing()
      ? noSpan
      : startSpan(`POST ${routeName(api)}`, {
          parent: typeof request.headers.traceparent === "string" ? request.headers.traceparent : undefined,
          root: true,
          kind: "server",
          startTime: arrived,
          attributes: {
            "http.request.method": "POST",
            "http.route": routeName(api)
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
    // OpenAI's transcriptions upload their audio as a form, taken from clients that are not pages of another site.
    const speech = api === "transcriptions" || api === "translations"
    const boundary = speech ? multipartBoundary(request.headers["content-type"]) : undefined
    const upload = typeof boundary === "string"
    const notJson = upload ? crossSiteUpload(request.headers) : notJsonContentType(request.headers["content-type"])
    if (notJson !== undefined) {
      request.resume()
      return sendError(
        response,
        upload ? new Forbidden({ message: notJson }) : new UnsupportedMediaType({ message: notJson })
      )
    }
    /** The body as the app's JSON request: a form's fields and file (a `data:` URL), or the JSON sent. */
    const readBody = (done: (body: RequestBodyResult) => void) => {
      if (!upload) return readRequestBody(request, options.bodyLimits, done)
      // The file grows by a third as a data: URL; the JSON the app takes stays within the body limit.
      const limits = { ...options.bodyLimits, limitBytes: Math.floor((options.bodyLimits.limitBytes * 3) / 4) - 4096 }
      readRequestBytes(request, limits, (bytes) => {
        if (!Buffer.isBuffer(bytes)) return done(bytes)
        const parts = parseMultipart(bytes, boundary)
        if ("problem" in parts)
          return done(new BadRequest({ message: `the upload is not a valid form: ${parts.problem}` }))
        const form = transcriptionOfForm(parts)
        if (!("body" in form)) return sendRefusal(response, form)
        done(form.body)
      })
    }
    const run = () =>
      readBody((body) => {
        if (typeof body !== "string") return sendError(response, body)
        if (response.destroyed) return
        if (jsonDepthWithin(body, options.maxJsonDepth) === undefined) {
          return sendError(response, new BadRequest({ message: tooDeepMessage(options.maxJsonDepth) }))
        }
        const openAi = api === "native" ? undefined : prepareOpenAiRequest(api, body, options.modelsOf(appId))
        if (openAi !== undefined && "refusal" in openAi) return sendRefusal(response, openAi.refusal)
        const format =
          openAi === undefined || api === "native"
            ? nativeFormat
            : speech
              ? transcriptionFormat(appId, responseFormatOf(openAi.fields))
              : api === "speech"
                ? speechFormatOf(appId, openAi.fields)
                : api === "images"
                  ? imagesFormat(appId)
                  : (openAiFormat(api, openAi.stream, appId, options.maxResponseBytes, openAi.fields) ?? nativeFormat)
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
          openAi?.body ?? body,
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
