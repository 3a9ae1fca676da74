import type { InvokeFailureCode, SchemaIssue } from "../../app-runtime/driver/protocol.js"

/**
 * How a reply to one request unfolds; exactly one of value / stream-start+end / failed happens.
 * Each chunk handed to `onChunk` must be reported back with `AppDriver.delivered` once it has left
 * (the app pauses when too many characters are undelivered).
 */
export interface ReplyHandlers {
  onValue(json: string): void
  onStreamStart(): void
  onChunk(json: string): void
  onEnd(): void
  onFailed(code: InvokeFailureCode | "WorkerStopped", message: string, issues?: ReadonlyArray<SchemaIssue>): void
}
