import * as Schema from "effect/Schema"
import { type DispatchFailureCode, TaskGraphWire } from "../tasks/TaskGraph.js"
import { jsonDepthWithin } from "../JsonDepth.js"
import { SchemaIssue } from "../SchemaIssues.js"
import { AppSchemasWire } from "./AppSchemas.js"

/** A unit task an app needs deployed, as the control plane sees it. */
export const UnitTaskSpec = Schema.Struct({
  id: Schema.String,
  kind: Schema.String,
  name: Schema.String,
  config: Schema.Unknown
})
export type UnitTaskSpec = typeof UnitTaskSpec.Type

/** Why an app's request failed, as its process reports it. */
export const InvokeFailureCode = Schema.Literal(
  "BadJson",
  "RequestSchemaMismatch",
  "TaskInputRejected",
  "TaskUnavailable",
  "DispatchFailed",
  "AppError",
  "ResponseSchemaMismatch",
  "ResponseTooLarge"
)
export type InvokeFailureCode = typeof InvokeFailureCode.Type

export interface DispatchFailure {
  readonly code: DispatchFailureCode
  readonly message: string
}

/** Where a request did not match its app's schema (a JSON body's keys are strings and indices), and why. */
export { SchemaIssue } from "../SchemaIssues.js"

/** Messages from the platform to an app's process. */
export type ToApp =
  | { readonly t: "invoke"; readonly rid: number; readonly requestId: string; readonly body: string }
  | { readonly t: "cancel"; readonly rid: number }
  | { readonly t: "ping"; readonly nonce: number }
  | {
      readonly t: "dispatched"
      readonly did: number
      readonly outputs: ReadonlyArray<unknown>
      readonly streams: boolean
    }
  | { readonly t: "dispatch-chunk"; readonly did: number; readonly chunk: unknown }
  /** Room for this many more characters of a request's streamed lines (they left for the client). */
  | { readonly t: "credit"; readonly rid: number; readonly chars: number }
  | { readonly t: "dispatch-end"; readonly did: number }
  | { readonly t: "dispatch-failed"; readonly did: number; readonly failure: DispatchFailure }

const Rid = Schema.Int
const Did = Schema.Int
const Count = Schema.Int.pipe(Schema.greaterThanOrEqualTo(0))
/** Absent rather than undefined: an app's settings keep the shape `defineApp` gave them. */
const exactOptional = <S extends Schema.Schema.Any>(schema: S) => Schema.optionalWith(schema, { exact: true })

const AdmissionSettingsWire = Schema.Struct({
  maxConcurrency: exactOptional(Schema.Number),
  maxQueue: exactOptional(Schema.Number),
  queueTimeoutMs: exactOptional(Schema.Number),
  weight: exactOptional(Schema.Number),
  maxCallsPerTask: exactOptional(Schema.Number)
})

/**
 * Messages from an app's process to the platform. The process runs the app's code, so the
 * platform decodes each one before acting on it. Its channel carries JSON: an undefined field
 * arrives absent.
 */
export const FromApp = Schema.Union(
  Schema.Struct({
    t: Schema.Literal("loaded"),
    tasks: Schema.Array(UnitTaskSpec),
    example: Schema.Unknown,
    description: Schema.optional(Schema.String),
    admission: Schema.optional(AdmissionSettingsWire),
    timeoutMs: exactOptional(Schema.Number),
    /** What the app takes and answers, as JSON Schema (absent: the platform describes it as any JSON). */
    schemas: exactOptional(AppSchemasWire)
  }),
  Schema.Struct({ t: Schema.Literal("load-failed"), message: Schema.String }),
  Schema.Struct({ t: Schema.Literal("pong"), nonce: Count }),
  Schema.Struct({ t: Schema.Literal("value"), rid: Rid, json: Schema.String }),
  Schema.Struct({ t: Schema.Literal("stream-start"), rid: Rid }),
  Schema.Struct({ t: Schema.Literal("chunk"), rid: Rid, json: Schema.String }),
  Schema.Struct({ t: Schema.Literal("end"), rid: Rid }),
  Schema.Struct({
    t: Schema.Literal("failed"),
    rid: Rid,
    code: InvokeFailureCode,
    message: Schema.String,
    issues: exactOptional(Schema.Array(SchemaIssue))
  }),
  Schema.Struct({ t: Schema.Literal("dispatch"), did: Did, requestId: Schema.String, graph: TaskGraphWire }),
  Schema.Struct({ t: Schema.Literal("dispatch-cancel"), did: Did }),
  /** Room for this many more chunks of a dispatch's stream (the app's code took them). */
  Schema.Struct({ t: Schema.Literal("dispatch-credit"), did: Did, chunks: Count })
)
export type FromApp = typeof FromApp.Type

/** The first message an app's process gets: the app's compiled code, to load, and its bounds. */
export interface LoadApp {
  readonly t: "load"
  readonly code: string
  /** The largest answer (or streamed line) the app may send, in bytes of JSON. */
  readonly maxResponseBytes: number
  /** The largest message the app's process may send; the platform stops a process that sends a larger one. */
  readonly maxMessageBytes: number
}

/**
 * The largest message the platform takes from an app's process: an answer as large as the limit
 * allows, its JSON escaped once more inside the message (at most twice as long), and room for the rest.
 */
export const appMessageLimitBytes = (maxResponseBytes: number) => 2 * maxResponseBytes + 1024 * 1024

/** The message an app's answer (or streamed line) larger than the limit fails with. */
export const responseTooLargeMessage = (maxResponseBytes: number) =>
  `the app's answer is larger than the limit of ${maxResponseBytes} bytes`

/** Whether `json` takes more than `limitBytes` bytes as UTF-8, without encoding it when its length decides. */
export const jsonExceeds = (json: string, limitBytes: number): boolean =>
  json.length > limitBytes || (json.length * 3 > limitBytes && Buffer.byteLength(json) > limitBytes)

export type ToAppProcess = ToApp | LoadApp

/** Bytes of a frame's header: the length of its body, big-endian. */
export const frameHeaderBytes = 4

/**
 * An app's channel (a pipe on the app process's fd 3) carries frames: a 4-byte length, then that
 * many bytes of JSON. The length comes first so that the platform refuses a message over its bound
 * before buffering it, and the platform parses every byte itself: nothing an app writes reaches
 * Node's own IPC handling.
 */
export const encodeFrame = (message: unknown): Buffer => {
  const json = JSON.stringify(message)
  const bodyBytes = Buffer.byteLength(json)
  const frame = Buffer.allocUnsafe(frameHeaderBytes + bodyBytes)
  frame.writeUInt32BE(bodyBytes, 0)
  frame.write(json, frameHeaderBytes, "utf8")
  return frame
}

/**
 * How deeply a message on an app's channel may nest arrays and objects (answers travel inside it
 * as strings and do not count): deeper is refused before it is parsed.
 */
export const maxMessageDepth = 64

/** Cuts the bytes read from a channel into frames and parses each frame's JSON. */
export class FrameReader {
  private chunks: Array<Buffer> = []
  private buffered = 0
  /** The length of the frame being read, once its header has arrived. */
  private bodyBytes: number | undefined

  constructor(
    private readonly maxBodyBytes: number,
    private readonly maxDepth: number = maxMessageDepth
  ) {}

  /**
   * Hands each message `chunk` completes to `deliver`, in order. Answers why the channel is broken
   * (a frame over the bound, by its header alone, one nested too deeply, or one that is not JSON); nothing more can be read
   * from it then.
   */
  read(chunk: Buffer, deliver: (message: unknown) => void): string | undefined {
    this.chunks.push(chunk)
    this.buffered += chunk.length
    for (;;) {
      if (this.bodyBytes === undefined) {
        if (this.buffered < frameHeaderBytes) return undefined
        this.bodyBytes = this.take(frameHeaderBytes).readUInt32BE(0)
        if (this.bodyBytes > this.maxBodyBytes)
          return `a message of ${this.bodyBytes} bytes, over the limit of ${this.maxBodyBytes} bytes`
      }
      if (this.buffered < this.bodyBytes) return undefined
      const body = this.take(this.bodyBytes)
      this.bodyBytes = undefined
      const text = body.toString("utf8")
      if (jsonDepthWithin(text, this.maxDepth) === undefined)
        return `a message nested deeper than the limit of ${this.maxDepth}`
      let message: unknown
      try {
        message = JSON.parse(text)
      } catch {
        return "a message that is not JSON"
      }
      deliver(message)
    }
  }

  /** The next `bytes` bytes read; the chunks are joined once, when a frame is complete. */
  private take(bytes: number): Buffer {
    const joined = this.chunks.length === 1 ? this.chunks[0]! : Buffer.concat(this.chunks, this.buffered)
    const rest = joined.subarray(bytes)
    this.chunks = rest.length > 0 ? [rest] : []
    this.buffered = rest.length
    return joined.subarray(0, bytes)
  }
}
