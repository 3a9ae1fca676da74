/**
 * OpenAI's `POST /app/:id/v1/audio/transcriptions` on an app that takes `TranscriptionRequest`:
 * the multipart upload OpenAI's clients send (the audio as `file`, the rest as text fields) becomes
 * the JSON request the app takes, the file a `data:` URL; a JSON body whose `file` is already a URL
 * is taken as it is. The app's `Transcription` is written as `response_format` asks: `json` (the
 * text alone), `text`, `verbose_json`, `srt` or `vtt`.
 */
import type { ServerResponse } from "node:http"
import * as Either from "effect/Either"
import * as Schema from "effect/Schema"
import { Transcription, type TranscriptionFormat } from "../../app-runtime/schemas/Transcriptions.js"
import { shortened } from "../../app-runtime/Shortened.js"
import { AppFailed } from "../errors.js"
import type { FormPart } from "./Multipart.js"
import type { OpenAiRefusal } from "./OpenAiApi.js"
import { type ReplyFormat, sendError, writeJson } from "./ReplyFormat.js"

const refusal = (param: string | null, message: string, code = "invalid_value"): OpenAiRefusal => ({
  status: 400,
  message,
  param,
  code
})

/** The media type of an upload: the part's, or the one its file name's extension stands for. */
const byExtension: Readonly<Record<string, string>> = {
  wav: "audio/wav",
  mp3: "audio/mpeg",
  mpeg: "audio/mpeg",
  mpga: "audio/mpeg",
  m4a: "audio/mp4",
  mp4: "audio/mp4",
  ogg: "audio/ogg",
  oga: "audio/ogg",
  opus: "audio/ogg",
  flac: "audio/flac",
  webm: "audio/webm"
}

const mediaTypeOf = (part: FormPart): string => {
  const given = part.contentType?.split(";", 1)[0]?.trim().toLowerCase()
  if (given !== undefined && given !== "" && given !== "application/octet-stream") return given
  const extension = part.filename?.split(".").pop()?.toLowerCase() ?? ""
  return byExtension[extension] ?? "application/octet-stream"
}

const numberFields = new Set(["temperature", "chunk_length_s", "stride_length_s"])

/**
 * The JSON request an upload stands for, or why it cannot be one. The fields are gathered in a
 * Map, so that a field of any name (`__proto__`, `constructor`) is a field like another, which the
 * route then checks against the request's parameters.
 */
export const transcriptionOfForm = (parts: ReadonlyArray<FormPart>): { readonly body: string } | OpenAiRefusal => {
  const request = new Map<string, unknown>()
  const granularities: Array<string> = []
  for (const part of parts) {
    if (part.name === "file") {
      if (request.has("file")) return refusal("file", "the form has two files; send one")
      request.set("file", `data:${mediaTypeOf(part)};base64,${part.data.toString("base64")}`)
      continue
    }
    const name = shortened(part.name, 100)
    if (part.filename !== undefined) return refusal(name, "only `file` may be a file")
    const value = part.data.toString("utf8")
    if (part.name === "timestamp_granularities[]" || part.name === "timestamp_granularities") {
      granularities.push(value)
      continue
    }
    if (request.has(part.name)) return refusal(name, `the form gives \`${name}\` twice`)
    if (numberFields.has(part.name)) {
      const number = Number(value)
      if (value.trim() === "" || !Number.isFinite(number)) return refusal(part.name, `\`${part.name}\` is not a number`)
      request.set(part.name, number)
    } else request.set(part.name, value)
  }
  if (!request.has("file")) return refusal("file", "the form has no `file`: upload the audio as `file`")
  if (granularities.length > 0) request.set("timestamp_granularities", granularities)
  // Object.fromEntries defines each field as the object's own, `__proto__` included.
  return { body: JSON.stringify(Object.fromEntries(request)) }
}

/** Seconds as SubRip (`00:01:02,500`) or WebVTT (`00:01:02.500`) write them. */
const clock = (seconds: number, separator: "," | "."): string => {
  const millis = Math.round(seconds * 1000)
  const pad = (value: number, width: number) => String(value).padStart(width, "0")
  const hours = Math.floor(millis / 3_600_000)
  const minutes = Math.floor(millis / 60_000) % 60
  const secs = Math.floor(millis / 1000) % 60
  return `${pad(hours, 2)}:${pad(minutes, 2)}:${pad(secs, 2)}${separator}${pad(millis % 1000, 3)}`
}

/** The cues of a transcript: each segment, an open end closing at the audio's end. */
const cues = (transcription: Transcription, separator: "," | ".") =>
  (transcription.segments ?? []).map((segment) => ({
    span: `${clock(segment.start, separator)} --> ${clock(segment.end ?? transcription.duration, separator)}`,
    text: segment.text.trim()
  }))

export const subRip = (transcription: Transcription): string =>
  cues(transcription, ",")
    .map((cue, index) => `${index + 1}\n${cue.span}\n${cue.text}\n`)
    .join("\n")

export const webVtt = (transcription: Transcription): string =>
  `WEBVTT\n\n${cues(transcription, ".")
    .map((cue) => `${cue.span}\n${cue.text}\n`)
    .join("\n")}`

const writeText = (response: ServerResponse, text: string, type: string) =>
  response
    .writeHead(200, { "content-type": `${type}; charset=utf-8`, "content-length": Buffer.byteLength(text) })
    .end(text)

const decodeTranscription = Schema.decodeUnknownEither(Schema.parseJson(Transcription))

/** Writes an app's transcription in the format the request asked for; anything else from the app is its failure. */
export const transcriptionFormat = (appId: string, format: TranscriptionFormat): ReplyFormat => {
  const failed = (response: ServerResponse, message: string) => sendError(response, new AppFailed({ appId, message }))
  return {
    value: (response, json) => {
      const decoded = decodeTranscription(json)
      if (Either.isLeft(decoded)) {
        return failed(response, "the app answered a transcription request with something other than a Transcription")
      }
      const transcription = decoded.right
      switch (format) {
        case "json":
          return writeJson(response, JSON.stringify({ text: transcription.text }))
        case "verbose_json":
          return writeJson(response, JSON.stringify({ segments: [], ...transcription }))
        case "text":
          return writeText(response, transcription.text, "text/plain")
        case "srt":
          return writeText(response, subRip(transcription), "application/x-subrip")
        case "vtt":
          return writeText(response, webVtt(transcription), "text/vtt")
      }
    },
    streamStart: () => undefined,
    chunk: () => true,
    end: (response) => failed(response, "the app streamed its answer to a transcription request"),
    streamError: (response, error) => sendError(response, error)
  }
}
