/**
 * Chat messages → the prompt the model runs: the chat template rendered over the messages (media
 * parts become the model's placeholder tokens, the client's texts stay text), tokenized, and each
 * placeholder expanded to as many positions as its media item has embedding rows.
 */
import * as Schema from "effect/Schema"
import { chatMediaParts, type MediaModality } from "../../app-runtime/schemas/OpenAI.js"
import type { ChatMessage as TemplateMessage } from "../../models/Tokenizer.js"
import type { ChatContentPart, ChatMessage, Modality } from "./api.js"

/** A media part of the messages, in the order the template meets it; inline audio is a data: URL. */
export interface MediaPart {
  readonly modality: MediaModality
  readonly url: string
}

export const mediaParts = (messages: ReadonlyArray<ChatMessage>): ReadonlyArray<MediaPart> =>
  chatMediaParts({ messages: messages as [ChatMessage, ...Array<ChatMessage>] })

const partModality: Readonly<Record<Exclude<ChatContentPart["type"], "text">, MediaModality>> = {
  image_url: "image",
  input_audio: "audio",
  audio_url: "audio",
  video_url: "video"
}

/**
 * The messages as chat templates take them (the Hugging Face convention): text parts keep their
 * text, media parts become `{ type: "image" | "audio" | "video" }`.
 */
export const templateMessages = (
  messages: ReadonlyArray<ChatMessage>,
  /**
   * For models whose chat template reads content as text and whose prompts spell a media item as
   * a placeholder (Ultravox's <|audio|>): the text each such part becomes; a message of text and
   * such parts is then one string.
   */
  mediaText: Partial<Record<MediaModality, string>> = {}
): Array<TemplateMessage> =>
  messages.map((message) => ({
    role: message.role,
    content:
      typeof message.content === "string" || message.content === null
        ? message.content
        : message.content.every((part) => part.type === "text" || mediaText[partModality[part.type]] !== undefined) &&
            message.content.some((part) => part.type !== "text")
          ? message.content
              .map((part) => (part.type === "text" ? part.text : mediaText[partModality[part.type]]!))
              .join("")
          : message.content.map((part) =>
              part.type === "text" ? { type: "text", text: part.text } : { type: partModality[part.type] }
            ),
    ...(message.name === undefined ? {} : { name: message.name }),
    ...(message.tool_call_id === undefined ? {} : { tool_call_id: message.tool_call_id }),
    ...(message.tool_calls === undefined
      ? {}
      : {
          tool_calls: message.tool_calls.map((call) => ({
            id: call.id,
            type: call.type,
            function: { name: call.function.name, arguments: parsedArguments(call.function.arguments) }
          }))
        })
  }))

/**
 * The messages with each of the client's texts in them (contents, names, calls' ids, names and
 * arguments) passed through `mark`, which a chat template then renders (see SpecialTokenText.ts).
 */
export const markClientTexts = (
  messages: ReadonlyArray<ChatMessage>,
  mark: (text: string) => string
): Array<ChatMessage> =>
  messages.map((message) => ({
    ...message,
    content:
      typeof message.content === "string"
        ? mark(message.content)
        : (message.content?.map((part) => (part.type === "text" ? { ...part, text: mark(part.text) } : part)) ?? null),
    ...(message.name === undefined ? {} : { name: mark(message.name) }),
    ...(message.tool_call_id === undefined ? {} : { tool_call_id: mark(message.tool_call_id) }),
    ...(message.tool_calls === undefined
      ? {}
      : {
          tool_calls: message.tool_calls.map((call) => ({
            ...call,
            id: mark(call.id),
            function: { name: mark(call.function.name), arguments: mark(call.function.arguments) }
          }))
        })
  }))

/** A call's arguments as templates write them: the object its JSON text holds (the text itself when it holds none). */
const parsedArguments = (text: string): unknown => {
  try {
    return JSON.parse(text)
  } catch {
    return text
  }
}

/** The messages cannot become a prompt for this model: the request's fault. */
export class PromptError extends Schema.TaggedError<PromptError>()("PromptError", { message: Schema.String }) {
  /** Raised throughout prompt building with its message alone. */
  constructor(message: string) {
    super({ message })
  }
}

/**
 * For prompts that already hold one placeholder token per embedding row (Idefics3 spells each
 * image out: its tiles' tokens between position tokens): the i-th media item takes the next
 * `media[i].rows` placeholder positions, in order. Answers each item's positions.
 */
export const scatterPlaceholders = (
  ids: ReadonlyArray<number>,
  placeholder: number,
  media: ReadonlyArray<{ readonly rows: number }>
): ReadonlyArray<Int32Array> => {
  const positions: Array<number> = []
  ids.forEach((id, position) => {
    if (id === placeholder) positions.push(position)
  })
  const needed = media.reduce((sum, item) => sum + item.rows, 0)
  if (positions.length !== needed) {
    throw new PromptError(
      `the prompt has ${positions.length} image tokens, but its ${media.length} media items have ${needed} embedding rows`
    )
  }
  let next = 0
  return media.map((item) => {
    const taken = Int32Array.from(positions.slice(next, next + item.rows))
    next += item.rows
    return taken
  })
}

/**
 * Expands each placeholder token of `ids` (by `placeholders`, token id → modality) into `rows[i]`
 * copies for the i-th media item, after the tokens `before` names for its modality (Voxtral's
 * [BEGIN_AUDIO]); answers the expanded ids and where each item's rows start.
 */
export const expandPlaceholders = (
  ids: ReadonlyArray<number>,
  placeholders: ReadonlyMap<number, Modality>,
  media: ReadonlyArray<{ readonly modality: Modality; readonly rows: number }>,
  before: Partial<Record<Modality, ReadonlyArray<number>>> = {}
): { readonly inputIds: Int32Array; readonly starts: ReadonlyArray<number> } => {
  const expanded: Array<number> = []
  const starts: Array<number> = []
  for (const id of ids) {
    const modality = placeholders.get(id)
    if (modality === undefined) {
      expanded.push(id)
      continue
    }
    const item = media[starts.length]
    if (item === undefined)
      throw new PromptError(`the prompt has more ${modality} placeholders than the messages have media parts`)
    if (item.modality !== modality)
      throw new PromptError(
        `media item ${starts.length} is ${item.modality}, but its place in the prompt is a ${modality} placeholder`
      )
    expanded.push(...(before[modality] ?? []))
    starts.push(expanded.length)
    for (let row = 0; row < item.rows; row++) expanded.push(id)
  }
  if (starts.length < media.length) {
    throw new PromptError(
      `the chat template placed ${starts.length} media placeholders for ${media.length} media parts`
    )
  }
  return { inputIds: Int32Array.from(expanded), starts }
}
