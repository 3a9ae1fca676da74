/**
 * An app's answer as the playground reads it: one JSON value, NDJSON lines (the invoke route of an
 * app whose serve streams), or Server-Sent Events (OpenAI's chat route), each value kept as it comes;
 * and what is shown of them: the text of chat chunks, images, audio chunks, and the other fields.
 */
import { call, jsonOf, lines, type Outcome, type Refusal, refusalOf } from "./api"
import { openAiPath } from "../../src/control/gateway/OpenAiRoutes"

/** What one answer may weigh in all, and in one line (an image in base64 is one line). */
const maxAnswerBytes = 64 * 1024 * 1024
const maxLineChars = 32 * 1024 * 1024

export interface AnswerState {
  readonly values: ReadonlyArray<unknown>
  readonly streamed: boolean
  readonly done: boolean
  readonly refusal?: Refusal
  readonly startedAt: number
  readonly firstAt?: number
  readonly endedAt?: number
}

export type Transport = "invoke" | "openai-chat"

/** The route a request goes to. */
export const routeOf = (appId: string, transport: Transport) =>
  transport === "invoke" ? `/app/invoke/${encodeURIComponent(appId)}` : openAiPath("chat", encodeURIComponent(appId))

const errorOf = (value: unknown): Refusal | undefined => {
  const error = (value as { error?: { code?: unknown; message?: unknown } } | null)?.error
  return typeof error === "object" && error !== null && typeof error.message === "string"
    ? refusalOf(200, JSON.stringify(value))
    : undefined
}

/**
 * Sends `body` and reports the answer as it grows (`update` after each value) until it ends, fails
 * or `signal` stops it.
 */
export const ask = async (
  appId: string,
  transport: Transport,
  body: unknown,
  update: (state: AnswerState) => void,
  signal: AbortSignal
): Promise<AnswerState> => {
  let state: AnswerState = { values: [], streamed: false, done: false, startedAt: performance.now() }
  const set = (next: Partial<AnswerState>) => {
    state = { ...state, ...next }
    update(state)
    return state
  }
  const sent: Outcome<Response> = await call(routeOf(appId, transport), { body, auth: "apiKey", signal })
  if (!sent.ok) return set({ done: true, refusal: sent.refusal, endedAt: performance.now() })
  const response = sent.value
  const contentType = response.headers.get("content-type") ?? ""
  const sse = contentType.startsWith("text/event-stream")
  if (!sse && !contentType.startsWith("application/x-ndjson")) {
    const value = await jsonOf<unknown>(response)
    const now = performance.now()
    if (!value.ok) return set({ done: true, refusal: value.refusal, firstAt: now, endedAt: now })
    return set({ values: [value.value], done: true, firstAt: now, endedAt: now })
  }
  set({ streamed: true })
  try {
    for await (const line of lines(response, maxAnswerBytes, maxLineChars)) {
      const data = sse ? (line.startsWith("data: ") ? line.slice("data: ".length) : undefined) : line
      if (data === undefined || data.trim() === "") continue
      if (sse && data === "[DONE]") break
      let value: unknown
      try {
        value = JSON.parse(data)
      } catch {
        value = data
      }
      const refusal = errorOf(value)
      if (refusal !== undefined) return set({ done: true, refusal, endedAt: performance.now() })
      set({ values: [...state.values, value], ...(state.firstAt === undefined ? { firstAt: performance.now() } : {}) })
    }
  } catch (error) {
    if (signal.aborted) return set({ done: true, endedAt: performance.now() })
    return set({
      done: true,
      refusal: { status: 0, code: "Broken", message: String(error) },
      endedAt: performance.now()
    })
  }
  return set({ done: true, endedAt: performance.now() })
}

const isRecord = (value: unknown): value is Record<string, unknown> =>
  typeof value === "object" && value !== null && !Array.isArray(value)

/** The text of chat-completion chunks (their deltas), or of a whole chat completion or completion. */
export const textOf = (values: ReadonlyArray<unknown>): string | undefined => {
  let text: string | undefined
  for (const value of values) {
    if (!isRecord(value) || !Array.isArray(value.choices)) continue
    const choice: unknown = value.choices[0]
    if (!isRecord(choice)) continue
    const piece = isRecord(choice.delta)
      ? choice.delta.content
      : isRecord(choice.message)
        ? choice.message.content
        : choice.text
    if (typeof piece === "string") text = (text ?? "") + piece
  }
  return text
}

export interface AudioPieces {
  readonly sampleRate: number
  readonly chunks: ReadonlyArray<string>
}

/** PCM16 chunks (`{ audio: base64, sampleRate }`) of a stream, or of one answer that holds them. */
export const audioOf = (values: ReadonlyArray<unknown>): AudioPieces | undefined => {
  const chunks: Array<string> = []
  let sampleRate: number | undefined
  for (const value of values) {
    if (!isRecord(value) || typeof value.audio !== "string" || typeof value.sampleRate !== "number") continue
    if (!(value.sampleRate > 0 && value.sampleRate <= 384_000)) continue
    sampleRate ??= value.sampleRate
    chunks.push(value.audio)
  }
  return sampleRate === undefined ? undefined : { sampleRate, chunks }
}

const pngPrefix = "iVBORw0KGgo"
const jpegPrefix = "/9j/"

export interface FoundImage {
  readonly path: string
  readonly src: string
}

/**
 * Images in an answer: `data:image/...` URLs, and base64 PNG or JPEG fields (an app's `image`, OpenAI's
 * `b64_json`), within a few levels of nesting.
 */
export const imagesOf = (values: ReadonlyArray<unknown>): Array<FoundImage> => {
  const found: Array<FoundImage> = []
  const visit = (value: unknown, path: string, depth: number, mimeType: string | undefined) => {
    if (found.length >= 16 || depth > 5) return
    if (typeof value === "string") {
      if (/^data:image\/(png|jpeg|gif|webp);base64,/.test(value)) found.push({ path, src: value })
      else if (value.length > 64 && (value.startsWith(pngPrefix) || value.startsWith(jpegPrefix))) {
        const type = mimeType ?? (value.startsWith(pngPrefix) ? "image/png" : "image/jpeg")
        if (/^image\/(png|jpeg|gif|webp)$/.test(type)) found.push({ path, src: `data:${type};base64,${value}` })
      }
      return
    }
    if (Array.isArray(value)) {
      value.slice(0, 64).forEach((item, index) => visit(item, `${path}[${index}]`, depth + 1, undefined))
      return
    }
    if (isRecord(value)) {
      const own = typeof value.mimeType === "string" ? value.mimeType : undefined
      for (const [key, item] of Object.entries(value)) {
        if (key === "audio") continue
        visit(item, path === "" ? key : `${path}.${key}`, depth + 1, own)
      }
    }
  }
  values.slice(0, 256).forEach((value, index) => visit(value, values.length > 1 ? `[${index}]` : "", 0, undefined))
  return found
}

/** Whether a value is one the page shows otherwise: a chat chunk, an audio chunk. */
const shownElsewhere = (value: unknown) =>
  isRecord(value) &&
  (Array.isArray(value.choices) || (typeof value.audio === "string" && typeof value.sampleRate === "number"))

/** The values of an answer that are neither chat chunks nor audio chunks: shown as JSON. */
export const otherValues = (values: ReadonlyArray<unknown>): Array<unknown> =>
  values.filter((value) => !shownElsewhere(value))

const isImageText = (text: string) =>
  text.startsWith("data:image/") || text.startsWith(pngPrefix) || text.startsWith(jpegPrefix)

/** JSON with long strings cut (an image's base64 is named only: the page shows the image). */
export const shownJson = (value: unknown, space?: number): string =>
  JSON.stringify(
    value,
    (_, item: unknown) =>
      typeof item !== "string" || item.length <= 120
        ? item
        : isImageText(item)
          ? `(an image, ${item.length} characters)`
          : `${item.slice(0, 60)}… (${item.length} characters)`,
    space
  ) ?? String(value)

/** A short text to carry an answer into a conversation's next turn: its text, else its first short string field. */
export const replyTextOf = (values: ReadonlyArray<unknown>): string | undefined => {
  const text = textOf(values)
  if (text !== undefined) return text
  for (const value of values) {
    if (typeof value === "string" && value.length <= 2000) return value
    if (isRecord(value))
      for (const item of Object.values(value)) if (typeof item === "string" && item.length <= 200) return item
  }
  return undefined
}
