/**
 * Tool calls in a model's output, as the families' chat templates teach them: Hermes and Qwen write
 * each call as `<tool_call>{"name": …, "arguments": {…}}</tool_call>`; Llama 3.1 answers a call with
 * its JSON alone (`{"name": …, "parameters": {…}}`, after `<|python_tag|>` for built-in tools). The
 * format is read from the template's source; a template that takes no tools, or calls them some
 * other way, is refused a request with tools.
 */
import { randomUUID } from "node:crypto"

export type ToolCallFormat = "hermes" | "llama3-json"

export interface ParsedCall {
  readonly name: string
  /** The arguments as a JSON text, as OpenAI gives them. */
  readonly arguments: string
}

/** How a chat template has the model call tools, from its source; undefined when it takes no tools or none we parse. */
export const toolCallFormatOf = (templateSource: string | undefined): ToolCallFormat | undefined => {
  if (templateSource === undefined || !/\btools\b/.test(templateSource)) return undefined
  if (templateSource.includes("<tool_call>")) return "hermes"
  if (templateSource.includes("<|python_tag|>") || templateSource.includes('"parameters"')) return "llama3-json"
  return undefined
}

export const callId = () => `call_${randomUUID().replaceAll("-", "").slice(0, 24)}`

const openTag = "<tool_call>"
const closeTag = "</tool_call>"
const pythonTag = "<|python_tag|>"

/** One call's JSON as a family writes it (`arguments`, or Llama's `parameters`); undefined when it is not one. */
const callOf = (json: string): ParsedCall | undefined => {
  let value: unknown
  try {
    value = JSON.parse(json)
  } catch {
    return undefined
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) return undefined
  const { name, arguments: args, parameters } = value as Record<string, unknown>
  if (typeof name !== "string") return undefined
  const given = args ?? parameters ?? {}
  return { name, arguments: typeof given === "string" ? given : JSON.stringify(given) }
}

/** A whole answer: the text before the calls (null when there is none), and the calls. */
export const parseToolCalls = (
  text: string,
  format: ToolCallFormat
): { readonly content: string | null; readonly calls: ReadonlyArray<ParsedCall> } => {
  if (format === "hermes") {
    const first = text.indexOf(openTag)
    if (first < 0) return { content: text, calls: [] }
    const calls: Array<ParsedCall> = []
    let at = first
    while (at >= 0) {
      const start = at + openTag.length
      const end = text.indexOf(closeTag, start)
      const call = callOf(text.slice(start, end < 0 ? undefined : end).trim())
      if (call !== undefined) calls.push(call)
      if (end < 0) break
      at = text.indexOf(openTag, end + closeTag.length)
    }
    if (calls.length === 0) return { content: text, calls }
    const before = text.slice(0, first)
    return { content: before.trim() === "" ? null : before, calls }
  }
  const trimmed = text.trimStart()
  const body = trimmed.startsWith(pythonTag) ? trimmed.slice(pythonTag.length) : trimmed
  if (!body.trimStart().startsWith("{")) return { content: text, calls: [] }
  // Llama 3.1 separates several calls with ";".
  const calls = body.split(/;\s*(?=\{)/).map((piece) => callOf(piece.trim()))
  if (calls.some((call) => call === undefined)) return { content: text, calls: [] }
  return { content: null, calls: calls as Array<ParsedCall> }
}

/** What the client is told as a streamed answer goes on: text, or a call once it is whole. */
export type StreamedPiece = { readonly content: string } | { readonly call: ParsedCall }

/**
 * A streamed answer's calls, found as the text arrives: text that cannot be the start of a call
 * goes out at once; a call goes out when it is whole. Hermes calls may follow text; a Llama 3.1
 * answer that starts as JSON is held to its end, where it is a call or, failing that, text.
 */
export class ToolCallStream {
  private held = ""
  private inCall = false
  private decided: "text" | "json" | undefined

  constructor(private readonly format: ToolCallFormat) {}

  push(text: string): Array<StreamedPiece> {
    this.held += text
    return this.format === "hermes" ? this.hermes() : this.llama()
  }

  /** The answer ended: what is still held, as a call where it is one. */
  end(): Array<StreamedPiece> {
    const rest = this.held
    this.held = ""
    if (rest === "") return []
    if (this.format === "hermes") {
      const call = this.inCall ? callOf(rest.trim()) : undefined
      return call !== undefined ? [{ call }] : [{ content: this.inCall ? openTag + rest : rest }]
    }
    if (this.decided === "json") {
      const parsed = parseToolCalls(rest, "llama3-json")
      if (parsed.calls.length > 0) return parsed.calls.map((call) => ({ call }))
    }
    return [{ content: rest }]
  }

  private hermes(): Array<StreamedPiece> {
    const pieces: Array<StreamedPiece> = []
    for (;;) {
      if (this.inCall) {
        const end = this.held.indexOf(closeTag)
        if (end < 0) return pieces
        const body = this.held.slice(0, end)
        this.held = this.held.slice(end + closeTag.length)
        this.inCall = false
        const call = callOf(body.trim())
        pieces.push(call === undefined ? { content: openTag + body + closeTag } : { call })
        continue
      }
      const start = this.held.indexOf(openTag)
      if (start >= 0) {
        if (start > 0) pieces.push({ content: this.held.slice(0, start) })
        this.held = this.held.slice(start + openTag.length)
        this.inCall = true
        continue
      }
      // Hold back an end of the text that could begin the tag.
      let keep = 0
      for (let length = Math.min(openTag.length - 1, this.held.length); length > 0; length--) {
        if (openTag.startsWith(this.held.slice(-length))) {
          keep = length
          break
        }
      }
      const out = this.held.slice(0, this.held.length - keep)
      this.held = this.held.slice(this.held.length - keep)
      if (out !== "") pieces.push({ content: out })
      return pieces
    }
  }

  private llama(): Array<StreamedPiece> {
    if (this.decided === undefined) {
      const start = this.held.trimStart()
      if (start === "") return []
      if (start.startsWith("{") || start.startsWith(pythonTag)) this.decided = "json"
      else if (pythonTag.startsWith(start)) return []
      else this.decided = "text"
    }
    if (this.decided === "json") return []
    const out = this.held
    this.held = ""
    return [{ content: out }]
  }
}

/** A function's parameters as the schema its arguments are decoded under (any object when it declares none). */
export const parametersSchema = (parameters: Readonly<Record<string, unknown>> | undefined): Record<string, unknown> =>
  parameters === undefined || Object.keys(parameters).length === 0 ? { type: "object" } : { ...parameters }

/**
 * The schema of one call of any of `tools` (`tool_choice: "required"`): `{ "name": …, "arguments": … }`.
 * Each tool's parameters move under the new root, so their definitions (`$defs`, `definitions`)
 * move to its `$defs` under names of their own (`tool0.Address`), and their references with them;
 * a reference to a tool's own root becomes one to its parameters.
 */
export const anyCallSchema = (
  tools: ReadonlyArray<{ readonly name: string; readonly parameters?: Readonly<Record<string, unknown>> | undefined }>
): Record<string, unknown> => {
  const defs: Record<string, unknown> = {}
  const branches = tools.map((tool, index) => {
    const prefix = `tool${index}`
    const { $defs, definitions, ...parameters } = parametersSchema(tool.parameters)
    const moved = (target: string): string => {
      if (target === "#") return `#/$defs/${prefix}`
      const named = /^#\/(?:\$defs|definitions)\/(.+)$/.exec(target)
      return named === null ? target : `#/$defs/${prefix}.${named[1]}`
    }
    for (const kept of [$defs, definitions]) {
      if (typeof kept !== "object" || kept === null) continue
      for (const [name, schema] of Object.entries(kept)) defs[`${prefix}.${name}`] = withRefs(schema, moved)
    }
    const args = withRefs(parameters, moved)
    defs[prefix] = args
    return {
      type: "object",
      properties: { name: { const: tool.name }, arguments: { $ref: `#/$defs/${prefix}` } },
      required: ["name", "arguments"],
      additionalProperties: false
    }
  })
  return { anyOf: branches, $defs: defs }
}

/** `schema` with every `$ref` rewritten by `move`. */
const withRefs = (schema: unknown, move: (target: string) => string): unknown => {
  if (Array.isArray(schema)) return schema.map((item) => withRefs(item, move))
  if (typeof schema !== "object" || schema === null) return schema
  return Object.fromEntries(
    Object.entries(schema).map(([key, value]) =>
      key === "$ref" && typeof value === "string" ? [key, move(value)] : [key, withRefs(value, move)]
    )
  )
}

/**
 * How a choice's text becomes the answer: as it is (`text`); searched for calls as the template
 * writes them (`parse`, tool_choice auto); the arguments of the one function named, decoded under
 * its parameters (`named`); or one call of any tool, decoded as `{ "name", "arguments" }` (`any`).
 */
export type AnswerMode =
  | { readonly kind: "text" }
  | { readonly kind: "parse"; readonly format: ToolCallFormat }
  | { readonly kind: "named"; readonly name: string }
  | { readonly kind: "any" }

export interface CallDelta {
  readonly index: number
  readonly id?: string
  readonly type?: "function"
  readonly function?: { readonly name?: string; readonly arguments?: string }
}

/** A piece of a streamed answer: text, or a tool call's delta. */
export type AnswerDelta = { readonly content: string } | { readonly toolCalls: ReadonlyArray<CallDelta> }

export interface WholeAnswer {
  readonly content: string | null
  readonly calls: ReadonlyArray<ParsedCall & { readonly id: string }>
}

/** One choice's answer in a mode, whole or streamed. */
export class AnswerShaper {
  private readonly stream: ToolCallStream | undefined
  private calls = 0
  private readonly id = callId()
  private held = ""

  constructor(private readonly mode: AnswerMode) {
    this.stream = mode.kind === "parse" ? new ToolCallStream(mode.format) : undefined
  }

  /** Whether the answer called a tool, so far. */
  get called(): boolean {
    return this.calls > 0
  }

  /** What goes out before the first token. */
  start(): Array<AnswerDelta> {
    if (this.mode.kind !== "named") return []
    this.calls = 1
    return [
      { toolCalls: [{ index: 0, id: this.id, type: "function", function: { name: this.mode.name, arguments: "" } }] }
    ]
  }

  push(text: string): Array<AnswerDelta> {
    switch (this.mode.kind) {
      case "text":
        return [{ content: text }]
      case "named":
        return [{ toolCalls: [{ index: 0, function: { arguments: text } }] }]
      case "any":
        this.held += text
        return []
      case "parse":
        return this.stream!.push(text).map((piece) => this.delta(piece))
    }
  }

  end(): Array<AnswerDelta> {
    if (this.mode.kind === "parse") return this.stream!.end().map((piece) => this.delta(piece))
    if (this.mode.kind !== "any") return []
    const call = callOf(this.held)
    if (call === undefined) return [{ content: this.held }]
    return [this.delta({ call })]
  }

  /** The whole answer from its whole text. */
  whole(text: string): WholeAnswer {
    switch (this.mode.kind) {
      case "text":
        return { content: text, calls: [] }
      case "named":
        return { content: null, calls: [{ id: this.id, name: this.mode.name, arguments: text }] }
      case "any": {
        const call = callOf(text)
        return call === undefined ? { content: text, calls: [] } : { content: null, calls: [{ id: this.id, ...call }] }
      }
      case "parse": {
        const parsed = parseToolCalls(text, this.mode.format)
        return { content: parsed.content, calls: parsed.calls.map((call) => ({ id: callId(), ...call })) }
      }
    }
  }

  private delta(piece: StreamedPiece): AnswerDelta {
    if ("content" in piece) return { content: piece.content }
    const index = this.calls++
    return {
      toolCalls: [
        {
          index,
          id: index === 0 && this.mode.kind === "any" ? this.id : callId(),
          type: "function",
          function: { name: piece.call.name, arguments: piece.call.arguments }
        }
      ]
    }
  }
}
